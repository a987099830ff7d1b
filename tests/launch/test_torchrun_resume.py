"""`hetsync train` under torchrun's restarts (`--max-restarts`): the restarted workers go on
from the run's checkpoints by themselves, without `--resume`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~15 s: two starts of two workers


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "--max-restarts", "1", "-m", "hetsync.cli", "train", "--workload", "digits",
            *args]


def test_restarted_workers_resume_from_the_runs_checkpoints(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        _torchrun("--protocol", "allreduce", "--max-iterations", "300", "--checkpoint-every",
                  "0.2", "--fault", "raise:rank=1,at=150", "--out", str(out)),
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines()
             if "torchrun restarted the workers (restart 1)" in line]
    assert len(notes) == 1, done.stderr[-3000:]  # one line, from rank 0
    assert "the run resumes from its checkpoints at run time" in notes[0]
    summary = json.loads((out / "summary.json").read_text())
    (resumed,) = summary["resumed_from"]
    assert resumed["restart"] == 1
    at = resumed["iterations"]
    assert all(0 < i < 150 for i in at)  # before the fault; the fault is not repeated
    assert summary["iterations"] == [i + 300 - min(at) for i in at]
    for rank in (0, 1):
        rows = [json.loads(line)["iteration"]
                for line in (out / "workers" / f"rank{rank}.jsonl").read_text().splitlines()]
        # the rows up to the checkpoint kept, the rest of the first start's dropped, and the
        # restart's appended after them: one row per iteration, from 1, past the checkpoint
        assert rows == list(range(1, summary["iterations"][rank] + 1))


def test_a_restart_without_checkpoints_starts_afresh(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        _torchrun("--protocol", "dpsgd", "--max-iterations", "40", "--fault",
                  "raise:rank=1,at=20", "--quiet", "--out", str(out)),
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restart 1): the run has no --checkpoint-every to resume from; starting afresh" \
        in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == [40, 40] and "resumed_from" not in summary
