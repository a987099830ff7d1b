"""glibc's malloc thresholds for hetsync's processes: a freed tensor's memory kept for the next.

glibc serves every allocation above its `mmap` threshold (dynamic, at most 32 MB) with a
mapping of its own and unmaps it when it is freed, and returns freed memory at the heap's top
to the kernel. A backward pass's gradients are fresh tensors every step, and the launcher's
evaluation loads every snapshot into fresh tensors: each time, the kernel faults the memory in
and zeroes it. Raised thresholds keep that memory in the heap for the next allocation, as
jemalloc or tcmalloc would (PyTorch's CPU tuning guide preloads one): a process then keeps up
to `TRIM_THRESHOLD` of freed memory instead of returning it.

A worker's first seconds still took fresh memory: the heap grows until then, and the threads
that receive messages allocate their buffers in arenas of their own. So every thread allocates
from the one heap (`ARENA_MAX`), and a worker touches room for a step's buffers (`touch_heap`,
a few times the model's bytes) before its run's clock starts, then frees it: glibc keeps it at
the heap's top, under both thresholds, and the first buffers come from memory already touched.
What it saved: docs/design.md, "glibc's malloc thresholds".

Nothing changes where the user chose their own settings (either variable, `GLIBC_TUNABLES`, or
a preloaded allocator in `LD_PRELOAD`). Without glibc the variables are ignored and `mallopt`
is missing: nothing happens either.
"""

from __future__ import annotations

import ctypes
import os

import torch

__all__ = ["ARENA_MAX", "HEAP_ROOM_MAX", "MMAP_THRESHOLD", "TRIM_THRESHOLD",
           "child_environment", "keep_freed_memory", "touch_heap"]

MMAP_THRESHOLD = 512 << 20
TRIM_THRESHOLD = 1 << 30
ARENA_MAX = 1
HEAP_ROOM_MAX = MMAP_THRESHOLD * 7 // 8
"""The most `touch_heap` touches: one block below the mmap threshold, freed under the trim one."""
_OURS = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
         "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD), "MALLOC_ARENA_MAX": str(ARENA_MAX)}
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX",
                  "GLIBC_TUNABLES", "LD_PRELOAD")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # <malloc.h>
_kept = False  # whether keep_freed_memory set the thresholds in this process


def _user_chose() -> bool:
    return any(name in os.environ for name in _USER_SETTINGS)


def child_environment() -> dict[str, str]:
    """The variables that give a process about to start (a worker) these thresholds."""
    return {} if _user_chose() else dict(_OURS)


def keep_freed_memory() -> None:
    """The same thresholds for this process, from now on (`mallopt`): the launcher, and a
    worker started by torchrun, which did not get the variables."""
    if _user_chose():
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    mallopt(_M_ARENA_MAX, ARENA_MAX)  # for the threads that have not allocated yet
    global _kept
    _kept = True


def touch_heap(nbytes: int) -> None:
    """Touch `nbytes` (at most `HEAP_ROOM_MAX`) of fresh heap now and free them, for the buffers
    to come; only where this module's thresholds hold, which keep them (else they would go
    back to the kernel at once, or never have come from the heap)."""
    if _kept or all(os.environ.get(name) == value for name, value in _OURS.items()):
        torch.empty(min(nbytes, HEAP_ROOM_MAX), dtype=torch.uint8).fill_(0)
