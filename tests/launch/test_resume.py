"""A run killed mid-way and resumed from its workers' checkpoints (real processes, gloo)."""

from __future__ import annotations

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.checkpoint import checkpoint_path, resume_config
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("protocol", "workers"), [
    pytest.param("allreduce", 2, marks=pytest.mark.slow),  # CI time: hop's resumes
    ("hop", 3),
    pytest.param("prague", 3, marks=pytest.mark.slow),  # overlapped (the default)
])
def test_a_killed_run_resumes_from_its_checkpoints(protocol, workers, tmp_path):
    out = tmp_path / protocol
    with pytest.raises(WorkerFailed):
        run(RunConfig(protocol=protocol, workload="digits", workers=workers, max_iterations=300,
                      step_time=5.0, stop_at_target=False, checkpoint_every=0.5, quiet=True,
                      fault="raise:rank=1,at=150", out=out))  # not at a time: a fast
    # machine reached iteration 290 of 300 in 2 s, leaving the resumed run nothing to show
    saved = [torch.load(checkpoint_path(out, r), weights_only=False) for r in range(workers)]
    result = run(resume_config(out, {}), resume=True)

    assert result.summary["stop_reason"] == "max_iterations"
    assert max(result.summary["iterations"]) >= 300
    assert result.summary["resumed_from"][0]["iterations"] == [s["iteration"] for s in saved]
    for rank in range(workers):
        rows = read_jsonl(out / "workers" / f"rank{rank}.jsonl")
        iterations, times = [r["iteration"] for r in rows], [r["t"] for r in rows]
        assert iterations == list(range(1, len(rows) + 1))  # up to the checkpoint, then on
        assert len(rows) > saved[rank]["iteration"] + 20
        assert all(a < b for a, b in zip(times, times[1:], strict=False))
        assert rows[saved[rank]["iteration"]]["t"] >= saved[rank]["t"]
