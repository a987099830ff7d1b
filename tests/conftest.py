"""Shared fixtures: integration runs are real processes over gloo on loopback."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetsync.config import RunConfig
from hetsync.launch.launcher import RunResult, run
from hetsync.metrics.evaluator import WorkloadMeasure
from hetsync.workloads import get_workload


@pytest.fixture
def train_run(tmp_path):
    """Run a short built-in training job and return its RunResult."""

    def start(**options: object) -> RunResult:
        defaults: dict[str, object] = {
            "workload": "digits", "workers": 2, "quiet": True, "eval_every": 0.5,
            "hang_timeout": 20.0, "out": tmp_path / str(options.get("label", "run")),
        }
        return run(RunConfig(**{**defaults, **options}))

    return start


class Spawned:
    """`target(rank, port, *args)` in `nprocs` spawned processes around a TCPStore that the
    test process holds (`store`; `port` is its port): the kernel picks the port (no race for a
    free one), and the test can play the launcher on it (declare a worker lost)."""

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
    """Real processes over torch.distributed for the transport's and P-Reduce's tests."""
    return Spawned


#: Where the `gpu` tests put their models: "cuda" (the default), or "cpu" to check their logic
#: on a machine without a GPU (not in CI: there they skip).
GPU_DEVICE_ENV = "HETSYNC_TEST_GPU_DEVICE"


def gpu_test_device() -> str:
    return os.environ.get(GPU_DEVICE_ENV, "cuda")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `gpu` test skips itself where its device is CUDA and none is visible."""
    if not gpu_test_device().startswith("cuda") or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"no CUDA device ({GPU_DEVICE_ENV}=cpu runs the logic here)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def gpu_device() -> str:
    """The device a `gpu` test puts its models on (see GPU_DEVICE_ENV)."""
    return gpu_test_device()


CONSERVATION_SCRIPT = Path(__file__).parent / "launch" / "scripts" / "conservation.py"


@pytest.fixture
def check_zero_lr_consensus(tmp_path):
    """Run the conservation script (lr 0, each rank from its own model, set after the
    optimizer is built; `late_even_ranks`: even ranks set theirs 0.5 s later) under
    `options`: the sum of the models must be conserved and (unless `consensus` is False, for
    runs too short to mix) the models must converge to their average. Returns the run."""

    def check(
        workers: int = 4, late_even_ranks: bool = False, consensus: bool = True,
        script_args: tuple[str, ...] = (), **options: object,
    ) -> RunResult:
        out = tmp_path / "zero-lr"
        out.mkdir()
        script = [str(CONSERVATION_SCRIPT), str(out), *script_args]
        script += ["late"] if late_even_ranks else []
        result = run(RunConfig(workers=workers, script=script, out=out, quiet=True,
                               **{"device": "cpu", **options}))  # a CPU model
        saved = [torch.load(out / f"final_rank{r}.pt") for r in range(workers)]
        initial = torch.stack([s["initial"] for s in saved])
        final = torch.stack([s["final"] for s in saved])
        assert torch.allclose(final.sum(0), initial.sum(0), atol=1e-5)
        if consensus:
            spread = (final - final.mean(0)).abs().max()
            assert spread < 1e-4 * (initial - initial.mean(0)).abs().max()
        return result

    return check


def consensus_loss_fell(result: RunResult, factor: float = 0.8) -> bool:
    """The final model's held-out loss is below `factor` x the initial model's (every worker
    starts from the model `torch.manual_seed(seed)` builds; measured here on the same split,
    as the first evaluation of a loaded machine may come after most of the learning)."""
    workload = get_workload(result.summary["workload"])
    measure = WorkloadMeasure(workload, eval_samples=10**9)
    torch.manual_seed(result.summary["seed"])
    initial_loss, _ = measure(workload.build_model().state_dict(), subset=False)
    return result.summary["final_loss"] < factor * initial_loss


@pytest.fixture
def loss_fell():
    return consensus_loss_fell


def _processes_of(run_dir: Path) -> list[int]:
    """PIDs of live processes whose environment names this run (leftover workers)."""
    marker = f"HETSYNC_RUN_DIR={run_dir}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.fixture
def processes_of():
    """The live processes of a run directory: none may be left once its run has ended."""
    return _processes_of


@pytest.fixture
def busy_loops_of():
    """The `--keep-awake` busy loops (hetsync.launch.awake_cores) a process has as children:
    (pid, scheduling policy, affinity) each."""
    def loops(parent: int) -> list[tuple[int, int, set[int]]]:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                stat = (proc / "stat").read_text()
                cmdline = (proc / "cmdline").read_bytes()
                if int(stat.rsplit(")", 1)[1].split()[1]) != parent or b"SCHED_IDLE" not in cmdline:
                    continue
                pid = int(proc.name)
                found.append((pid, os.sched_getscheduler(pid), os.sched_getaffinity(pid)))
            except (OSError, ValueError, IndexError):
                continue
        return found
    return loops
