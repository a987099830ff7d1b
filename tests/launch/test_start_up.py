"""A launched script that never joins, never starts training, or leaves before joining: the
monitor's start-up limits name the worker in one line instead of the run waiting for good
(real processes; the limits are shortened here, their defaults are 60 s)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch import monitor
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration


@contextmanager
def _within(seconds: float) -> Iterator[None]:
    """Fail, rather than hang the suite, if the block is still running after `seconds` (the
    launcher's loop sleeps in the main thread, where SIGALRM's handler raises)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"the run still waited after {seconds:g} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)



def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(text)
    return str(path)


def _stop_reason(out: Path) -> str:
    return str(json.loads((out / "summary.json").read_text())["stop_reason"])


def _failure(script: str, out: Path, hang_timeout: float, within: float, ends_by: float) -> str:
    """The WorkerFailed line of a 2-worker run of `script`, which must fail in `ends_by`
    seconds (and is stopped as a hang at `within`)."""
    started = time.monotonic()
    with _within(within), pytest.raises(WorkerFailed) as failure:
        run(RunConfig(script=[script], workers=2, max_time=3.0, hang_timeout=hang_timeout,
                      out=out, quiet=True, device="cpu"))
    assert time.monotonic() - started < ends_by
    return str(failure.value)


def test_a_script_that_never_calls_init_is_named_within_the_join_limit(tmp_path, monkeypatch,
                                                                       processes_of):
    monkeypatch.setattr(monitor, "JOIN_LIMIT_S", 2.0)
    out = tmp_path / "run"
    script = _script(tmp_path, "import time\ntime.sleep(1000)\n")
    message = _failure(script, out, hang_timeout=1.0, within=30, ends_by=15)
    assert message.startswith("worker rank 0 did not join the run within 2 s of its start "
                              "(its script never called hetsync.init()); nor did rank 1"), message
    assert _stop_reason(out).startswith("failed: worker rank 0 did not join the run")
    assert processes_of(out) == []


#: The scripts' imports.
HEAD = "import os, sys, time\nimport torch\nimport hetsync\n\n"
#: Build a SyncOptimizer, where rank 0 waits for a rank 1 that never builds one.
BUILDS = ("model = torch.nn.Linear(2, 1)\n"
          "hetsync.SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)\n")
SLEEPS = "if int(os.environ['RANK']) in {sleepers}:\n    time.sleep(1000)  # joined, never builds\n"


@pytest.mark.parametrize(("sleepers", "expected"), [
    ({1}, "worker rank 1 joined the run but did not start training within 2 s of joining: its "
          "script has not built its SyncOptimizer (hetsync.prepare) since hetsync.init(); rank "
          "0 waits for it in building its own"),
    ({0, 1}, "worker rank 0 joined the run but did not start training within 2 s of joining: "
             "its script has not built its SyncOptimizer (hetsync.prepare) since "
             "hetsync.init(); nor has rank 1"),
])
def test_a_worker_that_joins_and_never_trains_is_named_within_the_set_up_limit(
        sleepers, expected, tmp_path, monkeypatch, processes_of):
    """The worker whose script sleeps is blamed, not its peer waiting for it in
    SyncOptimizer's set-up (the model's broadcast, the clock's barrier); its stack shows
    where it is."""
    monkeypatch.setattr(monitor, "SETUP_LIMIT_S", 0.0)  # --hang-timeout's 2 s then
    out = tmp_path / "run"
    script = _script(tmp_path, HEAD + "hetsync.init()\n" + SLEEPS.format(sleepers=sleepers)
                     + BUILDS)
    message = _failure(script, out, hang_timeout=2.0, within=45, ends_by=30)
    assert message.startswith(expected), message
    assert "its stack:" in message and "script.py" in message and "<module>" in message
    assert _stop_reason(out).startswith(f"failed: {expected}")
    assert processes_of(out) == []


QUITS = "if os.environ['RANK'] == '1':\n    sys.exit(0)\n"


@pytest.mark.parametrize(("before", "after", "expected"), [
    ("", "hetsync.init()\n",
     "worker rank 1 exited (code 0) before joining the run (its script ended without calling "
     "hetsync.init())"),
    ("hetsync.init()\n", BUILDS,
     "worker rank 1 exited (code 0) after joining the run, before it started training, and "
     "the others failed without it"),
])
def test_a_worker_that_exits_cleanly_before_training_is_named_at_once(before, after, expected,
                                                                      tmp_path, processes_of):
    """Rank 1 ends cleanly, without joining while rank 0 waits for it in `hetsync.init()`,
    or after, while rank 0 fails in building its SyncOptimizer without it: one line on the
    terminal, long before any limit (the default ones here), naming rank 1."""
    out = tmp_path / "run"
    script = _script(tmp_path, HEAD + before + QUITS + after)
    command = [str(Path(sys.executable).parent / "hetsync"), "launch", "--workers", "2",
               "--max-time", "3", "--quiet", "--device", "cpu", "--out", str(out), script]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=40)
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"hetsync: run failed: {expected}\n"
    assert _stop_reason(out) == f"failed: {expected}"
    assert processes_of(out) == []
