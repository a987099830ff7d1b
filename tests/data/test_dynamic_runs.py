"""`hetsync train --epochs N --sampler dynamic`: real workers, one of them emulated 4x slow."""

from __future__ import annotations

import json

import pytest
import torch

from hetsync.cli import main
from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.checkpoint import checkpoint_path, resume_config
from hetsync.launch.launcher import run
from hetsync.workloads import get_workload

pytestmark = pytest.mark.integration

#: digits' whole batches an epoch: 1497 training samples, 16 a batch (the tail is dropped).
BATCHES = 1497 // get_workload("digits").batch_size


def _epoch(train_run, protocol: str, **options: object) -> list[int]:
    result = train_run(protocol=protocol, epochs=1, sampler="dynamic", step_time=50,
                       slowdown="deterministic:ranks=1,factor=4", stop_at_target=False,
                       label=protocol, **options)
    assert result.summary["stop_reason"].startswith("loop ended")
    return result.summary["iterations"]


def test_the_fast_worker_takes_more_of_the_epoch(train_run):
    fast, slow = _epoch(train_run, "adpsgd")
    assert fast + slow == BATCHES  # the epoch exactly, dealt whole batch by whole batch
    assert fast > 2 * slow


@pytest.mark.slow
def test_a_lock_step_protocol_gets_equal_shares_and_ends(train_run):
    assert _epoch(train_run, "allreduce") == [1497 // 2 // 16] * 2


@pytest.mark.slow
def test_a_killed_dynamic_run_resumes_without_reusing_a_batch(tmp_path):
    """Killed in its second epoch and resumed from its workers' checkpoints, a run of 2
    epochs of dealt data trains at most their 2 x 93 batches in all (none dealt twice),
    short of them only by what a worker drew after its checkpoint where another's is later
    (its model rolled back, the epoch's counter on from the latest checkpoint's)."""
    out = tmp_path / "run"
    with pytest.raises(WorkerFailed):
        run(RunConfig(protocol="adpsgd", workload="digits", workers=2, epochs=2,
                      sampler="dynamic", step_time=20.0, stop_at_target=False,
                      slowdown="deterministic:ranks=1,factor=4", checkpoint_every=0.5,
                      quiet=True, out=out, fault="raise:rank=0,at=90"))
    drawn = [i + 1 for i in json.loads((out / "summary.json").read_text())["iterations"]]
    saved = [torch.load(checkpoint_path(out, r), weights_only=False) for r in range(2)]
    assert all(s["data"]["sampler"]["dealt"] for s in saved)
    latest = max(s["t"] for s in saved)
    since = sum(d - s["iteration"] for d, s in zip(drawn, saved, strict=True)
                if s["t"] < latest)  # the batches a rolled-back worker drew (one in flight)
    result = run(resume_config(out, {}), resume=True)
    assert result.summary["stop_reason"].startswith("loop ended")
    assert 0 <= 2 * BATCHES - sum(result.summary["iterations"]) <= since


@pytest.mark.slow
def test_a_killed_workers_claim_is_dealt_again_and_the_summary_counts_it(tmp_path, capsys):
    """Rank 3 of 4 is killed mid-epoch (mid-step: its claim of one batch open) under
    `--on-failure continue`, 1.2 s into a first epoch of about 2.3 s (the loss declared
    before the others end it); the others deal its claim again, and the run's summary (and
    its last line) says how many items."""
    out = tmp_path / "run"
    assert main(["train", "--protocol", "adpsgd", "--workload", "digits", "--workers", "4",
                 "--epochs", "2", "--sampler", "dynamic", "--step-time", "100",
                 "--no-stop-at-target", "--on-failure", "continue", "--hang-timeout", "2",
                 "--fault", "kill:rank=3,at=1.2s", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"].startswith("loop ended")
    assert [w["rank"] for w in summary["lost_workers"]] == [3]
    batch = get_workload("digits").batch_size
    assert summary["redealt_items"] == batch  # its batch in hand
    assert f"1 worker(s) lost (ranks 3; {batch} items of their claims dealt again)" in (
        capsys.readouterr().out)
