"""DDP's driver in real processes: the stop vote rides in one bucket of several."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_stop.py"


def test_one_workers_stop_reaches_the_other_through_a_model_of_several_buckets(tmp_path):
    run(RunConfig(protocol="ddp", workers=2, script=[str(SCRIPT), str(tmp_path)], out=tmp_path,
                  max_iterations=30, quiet=True, hang_timeout=20.0, device="cpu"))
    ranks = [json.loads((tmp_path / f"ddp_rank{r}.json").read_text()) for r in range(2)]
    assert all(rank["buckets"] >= 2 for rank in ranks)
    # Rank 1 asked after its fifth backward pass, which had voted already: its vote rides in
    # the sixth's buckets, and both stop after the sixth.
    assert [rank["iterations"] for rank in ranks] == [6, 6]
