"""`hetsync train` and `hetsync launch` on one machine: spawn, watch, evaluate, summarise.

The launcher hosts the run's TCPStore (workers join the gloo/NCCL group through it and send
heartbeats to it), spawns one process per worker, shows their output above a progress bar
(`hetsync.launch.output`), evaluates snapshots in a background thread, and writes
`summary.json` at the end. It is the only process that outlives the workers, so it is the
one that can report a crash or a hang by rank.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from hetsync.api import STOP_KEY
from hetsync.config import RunConfig
from hetsync.launch.monitor import Monitor, terminate
from hetsync.launch.output import OutputRelay
from hetsync.metrics.evaluator import Evaluator
from hetsync.metrics.script_evaluation import EvaluationThread, stop_at_target
from hetsync.metrics.summary import summarize, write_summary
from hetsync.transport.runtime import ENV_RUN_DIR, ENV_STORE_PORT
from hetsync.workloads import get_workload

__all__ = ["RunResult", "run"]

_RUN_FILES = ("workers", "snapshots", "logs", "eval.jsonl", "summary.json")


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict[str, Any]


def run(config: RunConfig) -> RunResult:
    """Run `config` to its end; raise ConfigError before starting, WorkerFailed on failure."""
    config = config.validate().resolved()
    run_dir = _prepare_run_dir(config)
    torch.set_num_threads(1)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    control = dist.PrefixStore("hetsync", store)
    procs = _spawn(config, run_dir, store.port)
    output = OutputRelay(procs, run_dir / "logs")
    monitor = Monitor(procs, control, run_dir / "logs", config.hang_timeout, output)
    evaluation = None if config.script else _start_evaluation(config, run_dir, control)
    bar = _progress_bar(config)
    try:
        while not monitor.check():
            _update_bar(bar, config, monitor, evaluation)
            time.sleep(0.2)
            if evaluation is not None:
                evaluation.raise_error()
    except BaseException:
        if evaluation is not None:
            evaluation.abandon()
        raise
    finally:
        terminate(procs)
        output.close()  # the workers' last lines, above the bar
        if bar is not None:
            bar.close()
    if evaluation is not None:
        evaluation.finish()
    reasons = [_stop_reason(control, r) for r in range(config.workers)]
    summary = summarize(run_dir, config, next((r for r in reasons if r), None))
    write_summary(run_dir, summary)
    return RunResult(run_dir, summary)


def default_out(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.label or config.protocol}-{stamp}"


def _prepare_run_dir(config: RunConfig) -> Path:
    run_dir = Path(config.out) if config.out else default_out(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in _RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (run_dir / "logs").mkdir()
    config.out = run_dir
    (run_dir / "config.json").write_text(config.to_json() + "\n")
    return run_dir


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the worker gets SIGKILL if the launcher dies, so no process is left behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _spawn(config: RunConfig, run_dir: Path, port: int) -> list[subprocess.Popen[bytes]]:
    command = (
        [sys.executable, *config.script]
        if config.script
        else [sys.executable, "-m", "hetsync.launch.worker"]
    )
    procs = []
    for rank in range(config.workers):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(config.workers),
            "LOCAL_WORLD_SIZE": str(config.workers),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",  # plain env:// scripts join our store too
            "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",  # a pipe would hold a worker's prints back until exit
            ENV_STORE_PORT: str(port),
            ENV_RUN_DIR: str(run_dir),
        }
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, preexec_fn=_die_with_parent))
    return procs


def _start_evaluation(config: RunConfig, run_dir: Path, control: dist.Store) -> EvaluationThread:
    """The built-in workload's evaluation beside the monitor loop; stops the run at target."""
    evaluator = Evaluator.for_workload(
        run_dir, get_workload(config.workload), config.workers, config.eval_samples,
        data_dir=config.data_dir, keep_snapshots=config.keep_snapshots,
        on_consensus=stop_at_target(config, partial(control.set, STOP_KEY)),
        target_loss=config.target_loss,
    )
    return EvaluationThread(evaluator)


def _progress_bar(config: RunConfig) -> tqdm | None:
    if config.quiet:
        return None
    unit = "s" if config.max_time is not None else " it"
    total = round(config.max_time) if config.max_time is not None else config.max_iterations
    fmt = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total}" + unit
    fmt += " [{elapsed}<{remaining}{postfix}]"
    return tqdm(total=total, desc=config.label, bar_format=fmt, dynamic_ncols=True)


def _update_bar(
    bar: tqdm | None, config: RunConfig, monitor: Monitor, evaluation: EvaluationThread | None
) -> None:
    if bar is None:
        return
    progress = monitor.progress()
    if config.max_time is not None:
        bar.n = min(round(progress.elapsed), bar.total)
    else:
        bar.n = min(min(progress.iterations), bar.total)
    postfix = {"iters": f"{min(progress.iterations)}-{max(progress.iterations)}"}
    if evaluation is not None and evaluation.evaluator.latest_loss is not None:
        postfix["loss"] = f"{evaluation.evaluator.latest_loss:.3f}"
    bar.set_postfix(postfix, refresh=False)
    bar.refresh()


def _stop_reason(control: dist.Store, rank: int) -> str | None:
    key = f"stopped/{rank}"
    return control.get(key).decode() or None if control.check([key]) else None
