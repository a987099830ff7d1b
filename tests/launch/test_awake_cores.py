"""`--keep-awake`: a busy loop per pinned core, at SCHED_IDLE, gone when the run ends."""

from __future__ import annotations

import os
import time

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch.awake_cores import AwakeCores


def test_keep_awake_needs_pin():
    with pytest.raises(ConfigError, match="--keep-awake keeps pinned workers' cores busy: add"):
        RunConfig(workers=2, keep_awake=True).validate()


def test_one_loop_per_core_at_the_lowest_priority_on_its_core_then_none(busy_loops_of):
    cores = sorted(os.sched_getaffinity(0))
    with AwakeCores(cores) as awake:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # each loop sets its policy as it starts
            loops = busy_loops_of(os.getpid())
            if len(loops) == len(cores) and all(p == os.SCHED_IDLE for _, p, _ in loops):
                break
            time.sleep(0.05)
        assert sorted(pid for pid, _, _ in loops) == sorted(awake.pids)
        assert all(policy == os.SCHED_IDLE for _, policy, _ in loops)
        assert sorted(min(affinity) for _, _, affinity in loops) == cores
        assert all(len(affinity) == 1 for _, _, affinity in loops)
    assert busy_loops_of(os.getpid()) == []
