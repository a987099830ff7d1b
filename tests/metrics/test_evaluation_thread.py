"""The evaluation thread beside training: at the lowest priority when it shares a worker's core."""

from __future__ import annotations

import errno
import os
import sys
import threading

import pytest

from hetsync.errors import OutputFailed
from hetsync.metrics.atomic import replacing
from hetsync.metrics.script_evaluation import EvaluationThread


class _Priorities:
    """An Evaluator stand-in that records the nice value of the thread that polls it."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.polled = threading.Event()

    def poll(self) -> int:
        self.seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        self.polled.set()
        return 0

    def finish(self) -> None:
        return None


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("yield_cpu", [True, False])
def test_a_yielding_evaluation_polls_at_nice_19_and_leaves_the_caller_alone(yield_cpu):
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    evaluator = _Priorities()
    thread = EvaluationThread(evaluator, period_s=0.01, yield_cpu=yield_cpu)  # type: ignore[arg-type]
    assert evaluator.polled.wait(10)
    thread.finish()
    assert evaluator.seen[0] == (19 if yield_cpu else before)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


class _FullDisk:
    """An Evaluator stand-in whose writes fail as a full disk's do."""

    def __init__(self, run_dir) -> None:
        self.run_dir = run_dir
        self.polled = threading.Event()

    def poll(self) -> int:
        self.polled.set()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_under_the_evaluation_is_one_line_naming_the_folder(tmp_path):
    evaluator = _FullDisk(tmp_path)
    thread = EvaluationThread(evaluator, period_s=0.01)  # type: ignore[arg-type]
    assert evaluator.polled.wait(10)
    thread.abandon()
    with pytest.raises(OutputFailed, match=f"could not write into {tmp_path}: No space left"):
        thread.raise_error()


def test_a_replaced_file_that_fails_to_be_written_leaves_no_partial(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with pytest.raises(OSError), replacing(target) as partial:
        partial.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]
