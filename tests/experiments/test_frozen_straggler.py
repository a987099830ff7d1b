"""experiments/frozen_straggler.py: it finds the straggler among its own children, freezes it
for the last (1 - share) of each period, and never leaves it stopped."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time

import pytest

from hetsync.launch.monitor import _process_state


@pytest.fixture(scope="module")
def frozen(experiments_on_path):
    return importlib.import_module("frozen_straggler")


@pytest.fixture
def worker_3():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env={**os.environ, "RANK": "3"})
    yield proc
    proc.kill()
    proc.wait()


def test_the_straggler_is_frozen_most_of_each_period_and_left_running(frozen, worker_3,
                                                                     tmp_path):
    assert frozen._child_with_rank(3) == worker_3.pid
    assert frozen._child_with_rank(5) is None
    first_row = tmp_path / "rank3.jsonl"
    first_row.touch()  # its training has started
    done = threading.Event()
    freezer = threading.Thread(target=frozen.freeze, args=(3, 0.25, 0.1, done, first_row))
    freezer.start()
    states = []
    for _ in range(100):  # 1 s, in steps of 10 ms
        states.append(_process_state(worker_3.pid))
        time.sleep(0.01)
    done.set()
    freezer.join(timeout=5)
    assert not freezer.is_alive()
    # 75 % stopped on an idle machine; a loaded one moves the samples and the freezer's wake-ups
    stopped = states.count("T") / len(states)
    assert 0.4 < stopped < 1, states
    assert _process_state(worker_3.pid) != "T"
