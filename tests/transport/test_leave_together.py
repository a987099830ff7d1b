"""The end-of-run rendezvous (`Runtime.leave_together`), among threads over a real store."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from hetsync.config import RunConfig
from hetsync.transport import runtime as runtime_module
from hetsync.transport.lost_workers import LOST_KEY, LostWorkers
from hetsync.transport.runtime import Runtime


def _runtimes(store: dist.Store, world: int, launched: bool) -> list[Runtime]:
    config = RunConfig(workers=world, on_failure="continue", hang_timeout=0.5)
    return [Runtime(rank=r, world_size=world, local_rank=r, device=torch.device("cpu"),
                    backend="gloo", config=config, store=store, t0=time.time(), run_dir=None,
                    launched=launched, hang_timeout=config.hang_timeout,
                    lost=LostWorkers(store, world, config.hang_timeout))
            for r in range(world)]


def _leave(runtime: Runtime, errors: list[BaseException]) -> threading.Thread:
    def leave() -> None:
        try:
            runtime.leave_together()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    thread = threading.Thread(target=leave)
    thread.start()
    return thread


def test_finished_workers_wait_for_a_slow_one_longer_than_any_timeout(monkeypatch):
    """Under the launcher, fast workers that finished wait at the end for as long as a slow
    one takes (the launcher, not a deadline, ends a real hang): not bounded by the process
    group's timeout nor by --hang-timeout."""
    monkeypatch.setattr(runtime_module, "PG_TIMEOUT", datetime.timedelta(seconds=0.5))
    store = dist.HashStore()
    fast, fast2, slow = _runtimes(store, 3, launched=True)
    errors: list[BaseException] = []
    waiting = [_leave(fast, errors), _leave(fast2, errors)]
    time.sleep(2.0)  # the slow worker still trains, four times the timeouts
    assert all(t.is_alive() for t in waiting) and not errors
    slow.leave_together()
    for thread in waiting:
        thread.join(5.0)
    assert not errors and not any(t.is_alive() for t in waiting)


def test_a_lost_worker_is_not_waited_for():
    store = dist.HashStore()
    first, second, _ = _runtimes(store, 3, launched=True)
    errors: list[BaseException] = []
    waiting = [_leave(first, errors), _leave(second, errors)]
    store.set(LOST_KEY, "2")
    for thread in waiting:
        thread.join(5.0)
    assert not errors and not any(t.is_alive() for t in waiting)


def test_without_the_launcher_a_real_hang_ends_naming_whom_it_waited_for(monkeypatch):
    monkeypatch.setattr(runtime_module, "END_WAIT_S", 0.5)
    store = dist.HashStore()
    first, _, _ = _runtimes(store, 3, launched=False)
    with pytest.raises(TimeoutError, match=r"rank 0 waited 0.5 s at the end of the run for "
                                           r"ranks \[1, 2\] to finish"):
        first.leave_together()
