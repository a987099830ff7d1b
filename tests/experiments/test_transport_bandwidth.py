"""experiments/transport_bandwidth.py end to end on a small payload: every row is measured,
every driver ends as in a run (a Prague worker left waiting for a group would time out)."""

from __future__ import annotations

import importlib
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


def test_beyond_two_workers_each_path_counts_what_it_moves(experiments_on_path):
    """On a ring of 8, Hop and D-PSGD send to 2 neighbours and a passive AD-PSGD rank serves
    2 active ones; Prague's pairs move a buffer each way, as an exchange does, not as an
    all-reduce of 8; at 2 workers every path moves one payload each way."""
    script = importlib.import_module("transport_bandwidth")
    assert [script.copies(row, 8) for row in ("hop", "dpsgd", "adpsgd", "ps", "prague")] == \
        [2, 2, 4, 14, 1]
    assert [script.copies(row, 2) for row in ("hop", "dpsgd", "adpsgd", "ps", "prague")] == \
        [1, 1, 2, 2, 1]
    assert script.pattern("prague", 2) == "raw all-reduce"
    assert script.pattern("prague", 8) == "raw exchange"
    assert script.pattern("raw send", 8) is None
