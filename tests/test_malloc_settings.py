"""glibc's malloc thresholds do what they are there for, with this machine's glibc: a child
process that allocates and frees 64 MB tensors as a training loop does (on huge pages, as the
launcher's workers allocate) fills them, once in its steady state, without page faults.

How soon that steady state comes depends on where the process's first allocations fell (its
environment's size is enough to move them): glibc 2.36's `memalign` asks for the size plus the
alignment, so a freed 2 MB-aligned tensor's memory alone does not fit the next one, and the
heap grows until freed neighbours merge. In 196 layouts (an environment variable of 0-6,000
bytes, either way of setting the thresholds) the last allocation that faulted was among the
first 14; 5 were too few for some (CI's, 2026-11-29)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hetsync.malloc_settings import child_environment

pytestmark = pytest.mark.skipif(not os.confstr("CS_GNU_LIBC_VERSION"), reason="not glibc")

SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX",
            "GLIBC_TUNABLES", "LD_PRELOAD")


def _faults(env: dict[str, str], first: str, before: str, measured: str) -> int:
    """Page faults a child takes to run the lines `measured`, once `first` (before torch is
    imported) and `before` have run."""
    code = (f"{first}\nimport resource, threading, torch\n{before}\n"
            "faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            f"{measured}\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=120)
    return int(done.stdout.split()[-1])


def _faults_of_fresh_64_mb_tensors(env: dict[str, str], first: str = "") -> int:
    """Page faults a child takes to fill three 64 MB tensors, each allocated once the one
    before was freed, after 24 such (a backward pass's gradients, every step)."""
    return _faults(env, first, "for _ in range(24): torch.ones(16 << 20)",
                   "for _ in range(3): torch.ones(16 << 20)")


def _plain() -> dict[str, str]:
    plain = {name: value for name, value in os.environ.items() if name not in SETTINGS}
    return {**plain, "THP_MEM_ALLOC_ENABLE": "1"}


def test_a_child_with_the_variables_reuses_freed_memory_without_faults():
    """Without them glibc maps each tensor anew and the kernel faults and zeroes it again:
    32 huge pages a tensor, or 16,384 small ones."""
    assert _faults_of_fresh_64_mb_tensors({**_plain(), **child_environment()}) < 8
    assert _faults_of_fresh_64_mb_tensors(_plain()) >= 16


KEEP = "from hetsync.malloc_settings import keep_freed_memory; keep_freed_memory()"


def test_a_process_that_keeps_freed_memory_reuses_it_unless_the_user_chose():
    """The launcher's and a torchrun worker's own setting (`mallopt`), and a user's choice
    left as it is: glibc's own trim threshold alone does not stop the mapping."""
    assert _faults_of_fresh_64_mb_tensors(_plain(), first=KEEP) < 8
    chosen = {**_plain(), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
    assert _faults_of_fresh_64_mb_tensors(chosen, first=KEEP) >= 16


TOUCH = "from hetsync.malloc_settings import touch_heap; touch_heap(8 * (45 << 20))"


def _faults_of_first_buffers(env: dict[str, str], first: str) -> int:
    """Page faults a child takes to fill its first buffers of a 45 MB model: three that a
    receiving thread keeps (as Hop's), then three gradients, each freed."""
    receive = ("kept = []\n"
               "def receive():\n"
               "    for _ in range(3):\n"
               "        kept.append(torch.empty(45 << 20, dtype=torch.uint8).fill_(1))")
    return _faults(env, first, receive,
                   "thread = threading.Thread(target=receive)\nthread.start()\nthread.join()\n"
                   "for _ in range(3): torch.ones(45 << 18)")


def test_a_heap_touched_before_the_clock_serves_every_threads_first_buffers():
    """A worker's (`touch_heap`, with the launcher's variables: one arena for every thread):
    2,500-3,300 faults without it, about 20 with it."""
    ours = {**_plain(), **child_environment()}
    assert _faults_of_first_buffers(ours, first=TOUCH) < 64
    assert _faults_of_first_buffers(ours, first="") >= 512
    chosen = {**_plain(), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}  # the user's: left alone
    assert _faults_of_first_buffers(chosen, first=TOUCH) >= 512
