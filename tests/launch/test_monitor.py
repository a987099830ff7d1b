"""The launcher's hang rules on real processes and a real store, with the workers' heartbeats
written by the test: a worker that announced a long emulated compute is not hung, nor is one
busy in its own code (the kernel sees its training thread on a core), and peers waiting for
a worker that still makes progress are not deadlocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from hetsync.errors import WorkerFailed
from hetsync.launch import monitor as monitor_module
from hetsync.launch.activity import Activity
from hetsync.launch.monitor import Monitor, _process_state

_IDLE = [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); time.sleep(60)"]
_SPIN = "while True: pass"
_SLEEP = "import time; time.sleep(60)"
_ONLY_A_THREAD_SPINS = ("import threading, time\n"
                        f"threading.Thread(target=exec, args=({_SPIN!r},), daemon=True).start()\n"
                        "time.sleep(60)")
_A_CHILD_SPINS = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_SPIN!r}])"


@pytest.fixture
def monitor(tmp_path):
    procs = [subprocess.Popen(_IDLE) for _ in range(3)]
    yield Monitor(procs=procs, store=dist.HashStore(), log_dir=tmp_path, hang_timeout=0.5)
    for proc in procs:
        proc.kill()
        proc.wait()


def _signal(pid: int, sig: signal.Signals) -> None:
    """Send `sig` (SIGSTOP or SIGCONT) and return once the kernel shows the process stopped
    or running again: on a loaded machine that can take longer than any fixed sleep."""
    os.kill(pid, sig)
    deadline = time.monotonic() + 10
    while (_process_state(pid) in ("T", "t")) != (sig == signal.SIGSTOP):
        assert time.monotonic() < deadline, f"process {pid} did not take {sig.name}"
        time.sleep(0.01)


def _beat(monitor: Monitor, beats: dict[int, str]) -> None:
    for rank, beat in beats.items():
        monitor.store.set(f"hb/{rank}", beat)


def test_a_worker_that_announced_a_long_emulated_compute_is_not_hung(monitor):
    _beat(monitor, {0: "3 compute 1.0", 1: "3 delay 1.0 2.0", 2: "3 compute 1.0"})
    assert monitor.check() is False
    _beat(monitor, {0: "3 sync 1.2", 2: "3 sync 1.2"})  # its peers wait for it
    time.sleep(1.0)  # past --hang-timeout, within the announced 2 s
    assert monitor.check() is False


def test_peers_in_sync_are_not_deadlocked_while_one_worker_makes_progress(monitor):
    _beat(monitor, {0: "3 sync 1.0", 1: "3 compute 1.0", 2: "3 sync 1.0"})
    monitor.check()
    for k in range(4):  # rank 1 beats every 0.25 s; ranks 0 and 2 wait in sync for 1 s
        time.sleep(0.25)
        _beat(monitor, {1: f"{4 + k} compute {1.25 + k / 4}"})
        assert monitor.check() is False


def test_every_worker_stalled_in_sync_is_a_deadlock(monitor):
    _beat(monitor, {0: "3 sync 1.0", 1: "2 sync 1.0", 2: "3 sync 1.0"})
    monitor.check()
    time.sleep(0.7)
    with pytest.raises(WorkerFailed, match="worker rank 1 is furthest behind in a deadlock"):
        monitor.check()


def test_a_finished_worker_is_never_hung_for_waiting_but_a_stopped_one_fails(monitor):
    _beat(monitor, {0: "70 done 3.0", 1: "70 closing 3.0", 2: "70 closing 3.0"})
    monitor.check()
    time.sleep(0.7)  # quiet past --hang-timeout: waiting in the end rendezvous is not a hang
    assert monitor.check() is False
    _signal(monitor.procs[1].pid, signal.SIGSTOP)
    assert monitor.check() is False  # quiet for long, but stopped only now: a short stop is
    _signal(monitor.procs[1].pid, signal.SIGCONT)  # no failure (a debugger, SIGSTOP+SIGCONT)
    time.sleep(0.7)
    assert monitor.check() is False
    _signal(monitor.procs[1].pid, signal.SIGSTOP)
    monitor.check()
    time.sleep(0.7)  # stopped for longer than --hang-timeout
    with pytest.raises(WorkerFailed, match="rank 1 was stopped .* while finishing, after "
                                           "iteration 70, for more than 0.5 s"):
        monitor.check()


def test_a_finished_worker_stopped_for_good_is_lost_under_on_failure_continue(monitor):
    monitor.essential = frozenset({0})
    _beat(monitor, {0: "70 done 3.0", 1: "70 closing 3.0", 2: "70 closing 3.0"})
    monitor.check()
    _signal(monitor.procs[2].pid, signal.SIGSTOP)
    monitor.check()
    time.sleep(0.7)
    assert monitor.check() is False
    assert set(monitor.lost) == {2}
    assert monitor.store.get("lost") == b"2"


def test_workers_that_called_init_but_never_joined_fail_at_the_join_limit(monitor, monkeypatch):
    """Every rank is in `hetsync.init()` and the process group never forms: no script to
    blame, so the line says where they are (the integration tests cover the other cases)."""
    monkeypatch.setattr(monitor_module, "JOIN_LIMIT_S", 0.5)
    for rank in range(3):
        monitor.store.set(f"joining/{rank}", "")
    assert monitor.check() is False
    time.sleep(0.7)  # past --hang-timeout (0.5 s) and the join limit
    with pytest.raises(WorkerFailed, match=r"^worker rank 0 called hetsync.init\(\) but did not "
                       r"join the run within 0.5 s of its start \(the process group did not "
                       r"form\); nor did ranks 1, 2$"):
        monitor.check()


@pytest.fixture
def spawn():
    """Start `python -c CODE` in a session of its own (killed with its children after)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
        time.sleep(0.5)  # past its start-up: its own import's CPU is not what is tested
        return procs[-1]

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _busy(pid: int, window: float = 0.5) -> bool:
    """Sample `pid` over one window, as the monitor does while its heartbeat is quiet."""
    activity = Activity(pid, window)
    began = time.monotonic()
    while time.monotonic() - began < window:
        activity.sample(time.monotonic())
        time.sleep(0.05)
    activity.sample(time.monotonic())
    return activity.busy(time.monotonic())


@pytest.mark.parametrize(("code", "busy"), [
    (_SPIN, True),  # its script computes between two steps
    (_A_CHILD_SPINS, True),  # it waits for a child that computes (a DataLoader's worker)
    (_SLEEP, False),  # asleep, as a deadlocked or blocked training thread is
    (_ONLY_A_THREAD_SPINS, False),  # a protocol thread spins, the training thread sleeps
], ids=["computing", "a child computing", "sleeping", "only another thread computing"])
def test_busy_is_the_training_thread_or_a_child_on_a_core(spawn, code, busy):
    assert _busy(spawn(code).pid) is busy


def test_a_stopped_worker_is_not_busy_and_busy_again_once_continued(spawn):
    pid = spawn(_SPIN).pid
    _signal(pid, signal.SIGSTOP)
    assert not _busy(pid)
    _signal(pid, signal.SIGCONT)
    assert _busy(pid)


def test_a_worker_busy_in_its_own_code_is_not_hung_until_it_stops(tmp_path, spawn):
    """Rank 0 computes between two steps (its heartbeat `compute`, quiet) for four times
    --hang-timeout while rank 1 waits for it: no failure. Stopped, it is named within
    --hang-timeout of its last busy window."""
    procs = [spawn(_SPIN), spawn(_SLEEP)]
    monitor = Monitor(procs=procs, store=dist.HashStore(), log_dir=tmp_path, hang_timeout=0.5)
    _beat(monitor, {0: "3 compute 1.0", 1: "3 sync 1.0"})
    quiet = time.monotonic()
    while time.monotonic() - quiet < 2.0:
        assert monitor.check() is False
        time.sleep(0.05)
    _signal(procs[0].pid, signal.SIGSTOP)
    stopped = time.monotonic()
    with pytest.raises(WorkerFailed, match="worker rank 0 was stopped"):
        while time.monotonic() - stopped < 5.0:
            monitor.check()
            time.sleep(0.05)
    assert time.monotonic() - stopped < 0.5 + monitor_module.ACTIVITY_WINDOW_S
