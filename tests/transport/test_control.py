"""The worker's control channel (hetsync.transport.control): heartbeats leave the training
thread as recorded, never freshened, and the run's stop is seen without the training thread
asking the store."""

from __future__ import annotations

import time

import torch.distributed as dist

from hetsync.transport.control import STOP_KEY, ControlChannel


def _until(condition, timeout: float = 5.0) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_a_recorded_beat_is_sent_by_the_thread_once_and_never_freshened():
    store = dist.HashStore()
    control = ControlChannel(store, 3, beats=True, every=0.02)
    try:
        control.beat("7 sync 1.250")
        assert _until(lambda: store.check(["hb/3"]))
        assert store.get("hb/3") == b"7 sync 1.250"
        # A worker that makes no progress records nothing new: the monitor must see it stall.
        store.delete_key("hb/3")
        time.sleep(0.2)
        assert not store.check(["hb/3"])
        control.beat("8 compute 1.300")
        assert _until(lambda: store.check(["hb/3"]))
        assert store.get("hb/3") == b"8 compute 1.300"
    finally:
        control.close()


def test_a_flush_sends_at_once_and_close_sends_the_last_beat():
    store = dist.HashStore()
    control = ControlChannel(store, 0, beats=True, every=60.0)
    control.beat("2 closing 3.000")
    control.flush()
    assert store.get("hb/0") == b"2 closing 3.000"
    control.beat("2 done 3.100")
    began = time.monotonic()
    control.close()
    assert time.monotonic() - began < 1.0  # the thread's wait ends with close
    assert store.get("hb/0") == b"2 done 3.100"
    control.beat("3 compute 3.200")  # closed: it has let go of the store
    control.flush()
    control.close()
    assert store.get("hb/0") == b"2 done 3.100"


def test_the_stop_key_is_seen_once_set_and_without_beats_nothing_is_written():
    store = dist.HashStore()
    control = ControlChannel(store, 1, beats=False, every=0.02)
    try:
        control.beat("1 compute 0.100")
        assert control.stop_reason() is None
        store.set(STOP_KEY, "target")
        assert _until(lambda: control.stop_reason() == "target")
        assert not store.check(["hb/1"])
    finally:
        control.close()
