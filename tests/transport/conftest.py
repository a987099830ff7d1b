"""Real processes for the transport's tests, spawned around a TCPStore that the test process
holds: the kernel picks its port (no race for a free one), and the test can play the launcher
on it (declare a worker lost)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


class Spawned:
    """`target(rank, port, *args)` in `nprocs` spawned processes; `port` is `store`'s."""

    def __init__(self, target: Callable[..., None], nprocs: int, *args: object) -> None:
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self._context = mp.start_processes(target, args=(self.store.port, *args),
                                           nprocs=nprocs, join=False, start_method="spawn")
        self.processes = self._context.processes

    def join(self, timeout_s: float = 60.0) -> None:
        """Wait for every process (a process's error is raised); fail the test, leaving none
        behind, if they run longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in self.processes:
                    process.kill()
                pytest.fail(f"test processes still running after {timeout_s:g} s")


@pytest.fixture(scope="session")
def spawn() -> type[Spawned]:
    return Spawned
