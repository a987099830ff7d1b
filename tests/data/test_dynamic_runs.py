"""`hetsync train --epochs N --sampler dynamic`: real workers, one of them emulated 4x slow."""

from __future__ import annotations

import pytest

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
