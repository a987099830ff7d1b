from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from hetsync.transport.lost_workers import LOST_KEY, LostWorkers


def test_subscribers_hear_of_each_loss_once_from_the_watcher_thread():
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=1.0)
    heard: list[int] = []
    both = threading.Event()
    lost.subscribe(lambda rank: (heard.append(rank), len(heard) == 2 and both.set()))
    store.set(LOST_KEY, "2")
    time.sleep(0.3)
    store.set(LOST_KEY, "2,3")
    assert both.wait(2.0)
    time.sleep(0.3)
    assert heard == [2, 3]
    assert lost.ranks == {2, 3}
    lost.close()


def test_a_failed_transfer_goes_on_only_if_the_launcher_declares_the_peer_lost():
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=0.3)
    error = RuntimeError("Connection closed by peer")
    with pytest.raises(RuntimeError, match="closed by peer"):
        lost.confirm(1, error)  # not declared within the timeout: the error is real
    threading.Timer(0.1, store.set, args=(LOST_KEY, "1")).start()
    lost.confirm_timeout = 2.0
    lost.confirm(1, error)  # declared meanwhile: returns


def test_close_stops_the_watcher_before_the_store_goes():
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=1.0)
    heard: list[int] = []
    lost.subscribe(heard.append)
    watchers = [t for t in threading.enumerate() if t.name == "hetsync-lost"]
    lost.close()
    assert not any(t.is_alive() for t in watchers)
    store.set(LOST_KEY, "1")
    time.sleep(0.3)
    assert heard == []


def test_confirm_never_runs_a_callback_on_the_callers_thread():
    # A transfer that fails may run under a lock its protocol's callback takes (the parameter
    # server sends replies under one): the callback must come from the watcher thread only.
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=2.0)
    threads: list[str] = []
    told = threading.Event()
    lost.subscribe(lambda rank: (threads.append(threading.current_thread().name), told.set()))
    store.set(LOST_KEY, "1")
    lost.confirm(1, RuntimeError("Connection closed by peer"))
    assert told.wait(2.0)
    assert threads == ["hetsync-lost"]
    lost.close()


def test_a_failing_callback_is_reported_and_later_losses_still_reach_every_subscriber(capfd):
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=1.0)
    heard: list[int] = []
    both = threading.Event()

    def broken(rank: int) -> None:
        raise ValueError(f"cannot drop rank {rank}")

    lost.subscribe(broken)
    lost.subscribe(lambda rank: (heard.append(rank), len(heard) == 2 and both.set()))
    store.set(LOST_KEY, "1")
    time.sleep(0.3)
    store.set(LOST_KEY, "1,2")
    assert both.wait(2.0)
    assert heard == [1, 2]
    err = capfd.readouterr().err
    assert "lost rank 1" in err and "ValueError: cannot drop rank 1" in err
    with pytest.raises(RuntimeError, match="reacting to a lost worker failed.*cannot drop rank 1"):
        lost.raise_error()
    lost.close()
