"""The evaluation thread beside training: at the lowest priority when it shares a worker's core."""

from __future__ import annotations

import os
import sys
import threading

import pytest

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
