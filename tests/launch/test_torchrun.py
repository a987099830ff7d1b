"""`hetsync train` as one of torchrun's workers: rank 0 writes the run directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_train_under_torchrun_summarises_every_rank_in_one_directory(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "-m", "hetsync.cli", "train", "--protocol", "dpsgd",
               "--workload", "digits", "--max-iterations", "10", "--quiet"]
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1  # named by rank 0 for both ranks
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["iterations"] == [10, 10]
    assert json.loads((runs[0] / "config.json").read_text())["out"] == str(runs[0])
