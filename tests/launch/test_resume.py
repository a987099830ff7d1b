"""A run killed mid-way and resumed from its workers' checkpoints (real processes, gloo)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.checkpoint import checkpoint_path, resume_config
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl
from hetsync.protocols.prague.static_schedule import static_group, static_schedule

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



def _copy_when_written(path: Path, into: Path, done: threading.Event) -> None:
    """Copy the checkpoint at `path` as soon as it exists (whole: it is renamed into place)."""
    while not done.is_set():
        if path.exists():
            shutil.copy(path, into)
            return
        time.sleep(0.005)


@pytest.mark.parametrize(("protocol", "options"), [
    ("prague", {"schedule": "static"}),  # counted from each worker's own: a deadlock
    pytest.param("dpsgd", {}, marks=pytest.mark.slow),  # counted from each's own: ends short
])
def test_workers_resumed_from_different_iterations_all_go_on_for_the_same_steps(
        protocol, options, tmp_path):
    """Rank 1 goes on from its first checkpoint, a second older than the others' (as if
    killed just before its second): `--max-iterations` K counts every worker's steps from the
    earliest checkpoint, so each ends at its own checkpoint's iteration plus K - earliest.
    K is the one past the others' where rank 0's next group holds a worker that went on from
    earlier: counted from each worker's own, that worker waited there for good (Prague's
    static schedule), or every worker stopped at the others' K (D-PSGD, rank 1 short of it)."""
    out, workers = tmp_path / protocol, 4
    first, done = tmp_path / "rank1-first.pt", threading.Event()
    copier = threading.Thread(target=_copy_when_written,
                              args=(checkpoint_path(out, 1), first, done))
    copier.start()
    try:
        run(RunConfig(protocol=protocol, workload="svm", workers=workers, max_time=2.6,
                      step_time=10.0, hang_timeout=2.0, stop_at_target=False, quiet=True,
                      checkpoint_every=1.0, out=out, **options))
    finally:
        done.set()
        copier.join()
    shutil.copy(first, checkpoint_path(out, 1))
    saved = [torch.load(checkpoint_path(out, r), weights_only=False)["iteration"]
             for r in range(workers)]
    assert saved[1] < saved[0], f"rank 1 checkpointed once only: {saved}"
    period = static_schedule(workers)
    more = next(d for d in range(1, 2 * len(period))
                if any(saved[j] < saved[0] for j in static_group(period, d + 1, 0)))
    limit = max(saved) + more
    summary = run(resume_config(out, {"max_iterations": limit, "max_time": 60.0}),
                  resume=True).summary

    assert summary["stop_reason"] == "max_iterations"
    assert summary["iterations"] == [c + limit - min(saved) for c in saved]
    for rank in range(workers):
        rows = read_jsonl(out / "workers" / f"rank{rank}.jsonl")
        assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
