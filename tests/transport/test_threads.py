"""How many torch threads `hetsync.init()` gives a worker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hetsync.transport.runtime import thread_count


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),  # a plain single process keeps torch's default
        ({"LOCAL_WORLD_SIZE": "1", "RANK": "3", "WORLD_SIZE": "8"}, None),  # torchrun, 1 per node
        ({"LOCAL_WORLD_SIZE": "4"}, 1),  # the launcher's workers, or torchrun's 4 per node
        ({"LOCAL_WORLD_SIZE": "4", "HETSYNC_THREADS": "3"}, 3),
        ({"HETSYNC_THREADS": "6"}, 6),
    ],
)
def test_thread_count(env, expected):
    assert thread_count(env) == expected


@pytest.mark.parametrize("value", ["0", "two", "-1", ""])
def test_bad_thread_count_is_named(value):
    with pytest.raises(ValueError, match="HETSYNC_THREADS must be a positive integer"):
        thread_count({"HETSYNC_THREADS": value})


_THREADS = "import torch; {} print(torch.get_num_threads())"


def _threads_in_fresh_process(before: str) -> int:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HETSYNC_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                        "MASTER_ADDR", "OMP_NUM_THREADS")}
    code = _THREADS.format(before)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60)
    return int(done.stdout.split()[-1])


def test_init_keeps_torch_default_in_a_single_process():
    default = _threads_in_fresh_process("")
    if default == 1:
        pytest.skip("torch's default is one thread here: nothing to tell apart")
    assert _threads_in_fresh_process("import hetsync; hetsync.init();") == default
