"""What the launcher puts in a worker's environment (no run: the environment itself, and one
child process that allocates as a worker would)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.launch.cpu_placement import CpuPlacement
from hetsync.launch.launcher import worker_environment

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _environment(rank: int = 1) -> dict[str, str]:
    config = RunConfig(workers=2)
    return worker_environment(config, rank, Path("/tmp/run"), 29500, CpuPlacement(config, "t"))


def test_a_worker_knows_its_rank_world_and_store():
    env = _environment()
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "2", "29500")
    assert env["OMP_NUM_THREADS"] == "1"


def test_torch_allocates_on_huge_pages_unless_the_user_said_otherwise(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert _environment()["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert _environment()["THP_MEM_ALLOC_ENABLE"] == "0"


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(),
                    reason="the kernel gives no transparent huge pages here")
def test_a_workers_large_tensor_lands_on_huge_pages(monkeypatch):
    """The setting does what it is there for, with the torch installed: a 64 MB tensor of a
    process with the worker's environment is on huge pages (a backward pass's gradients are
    such tensors, fresh every step)."""
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    code = ("import torch; t = torch.ones(16 << 20); print(next(line.split()[1] for line in "
            "open('/proc/self/smaps_rollup') if line.startswith('AnonHugePages')))")
    done = subprocess.run([sys.executable, "-c", code], env=_environment(), capture_output=True,
                          text=True, check=True, timeout=120)
    assert int(done.stdout.split()[-1]) >= 32 << 10  # kB: half the tensor at least


MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@pytest.mark.parametrize("chosen", [*MALLOC_VARIABLES, "GLIBC_TUNABLES", "LD_PRELOAD"])
def test_malloc_keeps_freed_memory_unless_the_user_chose_their_own(monkeypatch, chosen):
    for name in (*MALLOC_VARIABLES, "GLIBC_TUNABLES", "LD_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    env = _environment()
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 256 << 20
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= int(env["MALLOC_MMAP_THRESHOLD_"])
    monkeypatch.setenv(chosen, "x")
    env = _environment()
    assert {name: env.get(name) for name in MALLOC_VARIABLES} == {
        name: ("x" if name == chosen else None) for name in MALLOC_VARIABLES}
