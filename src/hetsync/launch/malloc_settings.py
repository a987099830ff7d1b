"""glibc's malloc thresholds for hetsync's processes: a freed tensor's memory kept for the next.

glibc serves every allocation above its `mmap` threshold (dynamic, at most 32 MB) with a
mapping of its own and unmaps it when it is freed, and returns freed memory at the heap's top
to the kernel. A backward pass's gradients are fresh tensors every step (34 MB for
`mlp-wide`'s widest layer), and the launcher's evaluation loads every snapshot into fresh
tensors: each time, the kernel faults the memory in and zeroes it. Raised thresholds keep that
memory in the heap for the next allocation, as jemalloc or tcmalloc would (PyTorch's CPU
tuning guide preloads one): a process then keeps up to `TRIM_THRESHOLD` of freed memory
instead of returning it. A worker's step (`mlp-wide`, on huge pages): 870-1,381 page faults
before, 0 in its steady state. That state can take a dozen allocations to come: glibc 2.36's
`memalign` asks for the size plus the alignment (2 MB on huge pages), so a freed tensor's memory
alone does not fit the next one until freed neighbours merge (tests/launch/test_malloc_settings.py).
The launcher of a 10 s, two-worker `mlp-wide` run, whose
tensors are not on huge pages and so are placed less tidily: 1.3 million, 0.77-0.81 million.

Nothing changes where the user chose their own settings (either variable, `GLIBC_TUNABLES`, or
a preloaded allocator in `LD_PRELOAD`). Without glibc the variables are ignored and `mallopt`
is missing: nothing happens either.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "child_environment", "keep_freed_memory"]

MMAP_THRESHOLD = 512 << 20
TRIM_THRESHOLD = 1 << 30
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES",
                  "LD_PRELOAD")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def _user_chose() -> bool:
    return any(name in os.environ for name in _USER_SETTINGS)


def child_environment() -> dict[str, str]:
    """The variables that give a process about to start (a worker) these thresholds."""
    if _user_chose():
        return {}
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
            "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


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
