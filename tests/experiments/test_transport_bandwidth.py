"""experiments/transport_bandwidth.py end to end on a small payload: every row is measured,
every driver ends as in a run (a Prague worker left waiting for a group would time out)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "experiments" / "transport_bandwidth.py"


@pytest.mark.integration
def test_every_path_is_timed_beside_raw_gloo(tmp_path):
    env = {**os.environ, "LOCAL_GLOO_TIMEOUT": "60"}
    subprocess.run([sys.executable, str(SCRIPT), "--mb", "0.5", "--repeats", "2",
                    "--out", str(tmp_path)], check=True, timeout=300, env=env,
                   capture_output=True)
    report = json.loads((tmp_path / "results.json").read_text())
    rows = report["rows"]
    assert list(rows) == ["raw send", "raw exchange", "raw all-reduce", "link exchange",
                          "allreduce", "hop", "adpsgd", "dpsgd", "prague", "localsgd", "ps"]
    for name, row in rows.items():
        assert row["ms"] > 0 and math.isfinite(row["gb_per_s"]), name
        assert ("ratio_to_pattern" in row) == (not name.startswith("raw")), name
    assert any("flat" in stage for stage in report["stages"]["prague"])  # its merges
    assert (tmp_path / "bandwidth.png").is_file()
