"""`hetsync train` and `hetsync launch` on one machine: spawn, watch, evaluate, summarise.

The launcher hosts the run's TCPStore (workers join the gloo/NCCL group through it and send
heartbeats to it), spawns one process per worker, shows their output above a progress bar
(`hetsync.launch.output`), evaluates snapshots in a background thread, and writes
`summary.json` at the end. It is the only process that outlives the workers, so it is the
one that can report a crash or a hang by rank.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from hetsync.config import RunConfig, default_out
from hetsync.data.dealing import REDEALT_KEY
from hetsync.errors import ConfigError, WorkerFailed
from hetsync.faults import FaultPlan, parse_faults
from hetsync.launch.checkpoint import Resume, lost_before, prepare_resume
from hetsync.launch.cpu_placement import CpuPlacement
from hetsync.launch.monitor import Monitor, terminate
from hetsync.launch.output import OutputRelay
from hetsync.launch.restarts import Restarts
from hetsync.malloc_settings import child_environment, keep_freed_memory
from hetsync.metrics.evaluator import Evaluator, WorkloadMeasure
from hetsync.metrics.script_evaluation import EvaluationThread, stop_at_target
from hetsync.metrics.summary import summarize, write_summary
from hetsync.protocols.catalog import essential_ranks
from hetsync.protocols.registry import validated
from hetsync.transport.control import STOP_KEY
from hetsync.transport.lost_workers import LOST_KEY
from hetsync.transport.placement import place, visible_gpus
from hetsync.transport.runtime import ENV_RUN_DIR, ENV_STORE_PORT, thread_count
from hetsync.user_files import out_folder
from hetsync.workloads import get_workload

__all__ = ["RunResult", "evaluates_while_running", "run", "worker_environment"]

_RUN_FILES = ("workers", "snapshots", "logs", "eval.jsonl", "summary.json", "checkpoints")


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict[str, Any]


def run(config: RunConfig, resume: bool = False) -> RunResult:
    """Run `config` to its end; raise ConfigError before starting, WorkerFailed on failure.
    However it ends (a failure, Ctrl-C, SIGTERM), the run directory gets a summary.json of
    what was measured, with the reason it stopped. `resume`: go on with the run in
    `config.out` from its workers' checkpoints (hetsync.launch.checkpoint)."""
    check_capacity(config.workers)  # first: validate() sizes structures by the worker count
    config = placed(validated(config).resolved())
    thread_count(os.environ)  # the workers read it: a bad value is refused here, not N times
    run_dir = Path(config.out) if config.out else default_out(config)
    with CpuPlacement(config, run_id=str(os.getpid())) as placement, RunLock(run_dir):
        extra: dict[str, Any] = _placement_facts(placement)
        if resume:
            lost = lost_before(run_dir, config)
            at = prepare_resume(run_dir, config, frozenset(w["rank"] for w in lost))
            extra["resumed_from"] = [*_earlier_resumes(run_dir), dataclasses.asdict(at)]
            extra["lost_workers"] = lost
            config.out = run_dir
            (run_dir / "config.json").write_text(config.to_json() + "\n")
            (run_dir / "logs").mkdir(exist_ok=True)
        else:
            prepare_run_dir(config, run_dir)
        try:
            return _run(config, run_dir, extra, placement)
        except BaseException as error:
            _summarize_failure(run_dir, config, error, extra)
            raise


def _earlier_resumes(run_dir: Path) -> list[dict[str, Any]]:
    """The resumes the run before this one went through, from its summary."""
    try:
        return list(json.loads((run_dir / "summary.json").read_text()).get("resumed_from", []))
    except (OSError, ValueError, AttributeError):
        return []


def placed(config: RunConfig) -> RunConfig:
    """`config` with its backend and device decided, once, before spawning: what cannot run
    (`--device cuda` without a GPU, NCCL with workers sharing a GPU) fails here in one line,
    and the workers, reading the resolved `backend` and device kind from config.json, each
    take `cuda:(rank % GPUs)` or the CPU by the same rule (hetsync.transport.placement)."""
    placement = place(config.backend, config.device, gpus=visible_gpus(),
                      local_workers=config.workers, local_rank=0)
    if placement.note and not config.quiet:
        print(f"hetsync: note: {placement.note}", file=sys.stderr)
    kind = placement.device.split(":")[0]
    resolved = dataclasses.replace(config, backend=placement.backend, device=kind)
    if resolved.on_failure == "continue":  # a protocol may not go on without one on NCCL
        essential_ranks(resolved)
    return resolved


#: Resident memory of one worker process (torch imported, a small model trained), measured
#: 150-250 MB here; the estimate errs on the side of starting.
WORKER_MEMORY_BYTES = 200 * 2**20


def check_capacity(workers: int, meminfo: Path = Path("/proc/meminfo"),
                   per_worker: int = WORKER_MEMORY_BYTES, what: str = "workers") -> None:
    """Refuse a worker count whose processes (or simulated workers, `per_worker` bytes each)
    this machine's free memory cannot hold."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines())
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return  # not Linux: nothing to check against
    fit = available // per_worker
    if isinstance(workers, int) and workers > fit:
        each = f"{per_worker >> 20} MB" if per_worker >= 2**20 else f"{per_worker >> 10} KB"
        raise ConfigError(f"--workers {workers}: this machine has {available / 2**30:.1f} GiB of "
                          f"memory available, enough for about {fit} {what} ({each} each)")


def _placement_facts(placement: CpuPlacement) -> dict[str, Any]:
    """summary.json's `placement`: the run's real (kernel-enforced) pinning and CPU quotas."""
    facts = placement.facts()
    return {} if facts is None else {"placement": facts}


def _run(config: RunConfig, run_dir: Path, extra: dict[str, Any],
         placement: CpuPlacement) -> RunResult:
    torch.set_num_threads(1)
    keep_freed_memory()  # the evaluation loads every snapshot into fresh tensors
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    control = dist.PrefixStore("hetsync", store)
    lost: list[dict[str, Any]] = extra.setdefault("lost_workers", [])
    before = {w["rank"]: WorkerFailed(w["rank"], w["reason"]) for w in lost}
    if before:  # lost before this resume: spawned to form the group, lost from the start
        control.set(LOST_KEY, ",".join(str(r) for r in sorted(before)))
    resume = extra.get("resumed_from")
    procs = _spawn(config, run_dir, store.port, Resume(**resume[-1]) if resume else None,
                   placement)
    output = OutputRelay(procs, run_dir / "logs")
    evaluation = (None if config.script else
                  _start_evaluation(config, run_dir, control, placement.launcher_shares_a_worker))
    clock = _RunClock(control, resume[-1]["at_s"] if resume else 0.0)

    rejoin = config.on_failure == "rejoin"
    restarts = Restarts(control, config.workers, config.max_restarts,
                        partial(_spawn_one, config, run_dir, store.port, placement),
                        clock.elapsed) if rejoin else None

    def on_lost(rank: int, failure: WorkerFailed) -> None:
        elapsed = clock.elapsed()
        lost.append({"rank": rank, "reason": failure.reason,
                     "at_s": None if elapsed is None else round(elapsed, 3)})
        if evaluation is not None:
            evaluation.evaluator.lose(rank)
        if restarts is not None:
            restarts.after_loss(rank, failure, restarted)

    def restarted(rank: int, proc: subprocess.Popen[bytes]) -> None:
        monitor.restarted(rank, proc)
        output.add(rank, proc)

    def on_back(rank: int) -> None:
        assert restarts is not None
        restarts.back(rank)
        if evaluation is not None:
            evaluation.evaluator.rejoin(rank)

    if evaluation is not None:
        for rank in before:
            evaluation.evaluator.lose(rank)
    essential = (essential_ranks(config) if config.on_failure == "continue"
                 else frozenset() if rejoin else None)
    monitor = Monitor(procs, control, run_dir / "logs", config.hang_timeout, output,
                      essential=essential, on_lost=on_lost, lost=before,
                      on_back=on_back if rejoin else None, announce=not rejoin)
    bar = _progress_bar(config)
    faults = FaultPlan(parse_faults(config.fault))
    try:
        while not monitor.check():
            _inject(faults, procs, clock)
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
        _finish_evaluation(evaluation, placement)
    _warn_unprepared(monitor)
    reasons = [_stop_reason(control, r) for r in range(config.workers) if r not in monitor.lost]
    extra["redealt_items"] = control.add(REDEALT_KEY, 0)  # lost workers' claims dealt again
    if restarts is not None:
        extra["rejoined"] = restarts.records
        extra["generations"] = restarts.generation.number
    summary = {**summarize(run_dir, config, next((r for r in reasons if r), None)), **extra}
    write_summary(run_dir, summary)
    return RunResult(run_dir, summary)


def _finish_evaluation(evaluation: EvaluationThread, placement: CpuPlacement) -> None:
    """The workers are gone: what is left to evaluate (the sets a busy run left no CPU for,
    the bisection of the target's crossing, the final models; tens of seconds for a real
    suite's run on 2 cores) gets every core the launcher may use, in torch's threads."""
    placement.free_launcher()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        evaluation.finish()
    finally:
        torch.set_num_threads(1)


class _RunClock:
    """The run's time axis as the workers keep it (rank 0's `t0` in the store, plus where a
    resumed run starts), read by the wall clock: the workers' heartbeats would stop with them
    when one is stopped and the others wait for it."""

    def __init__(self, control: dist.Store, offset: float) -> None:
        self.control, self.offset = control, offset
        self._t0: float | None = None

    def elapsed(self) -> float | None:
        """Run time now; None before the workers have started the clock."""
        if self._t0 is None and self.control.check(["t0"]):
            self._t0 = float(self.control.get("t0").decode())
        return None if self._t0 is None else time.time() - self._t0 + self.offset


def _inject(faults: FaultPlan, procs: list[subprocess.Popen[bytes]], clock: _RunClock) -> None:
    """`--fault`'s kills and stops, done to the workers' processes when due (run time)."""
    elapsed = clock.elapsed()
    if elapsed is None:
        return
    for sig, rank in faults.signals_due(elapsed):
        if procs[rank].poll() is None:
            os.kill(procs[rank].pid, sig)


def _summarize_failure(
    run_dir: Path, config: RunConfig, error: BaseException, extra: dict[str, Any]
) -> None:
    """What a failed or interrupted run measured, so that `hetsync report` can show it. A
    summary that cannot be written (a full disk) must not hide the failure itself."""
    if isinstance(error, KeyboardInterrupt):
        reason = "interrupted"
    elif isinstance(error, WorkerFailed):
        reason = f"failed: worker rank {error.rank} {error.reason}"
    else:
        first = str(error).splitlines()[0] if str(error) else ""
        reason = f"failed: {type(error).__name__}: {first}"
    try:
        write_summary(run_dir, {**summarize(run_dir, config, reason), **extra})
    except Exception as failure:  # noqa: BLE001 - reported, the original error goes on
        print(f"hetsync: could not write {run_dir / 'summary.json'}: {failure}", file=sys.stderr)


class RunLock:
    """An exclusive lock on a run directory for the length of a run (`.lock`, flock): a
    second run into the same --out is refused instead of deleting the first one's files."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._file: IO[str] | None = None

    def __enter__(self) -> RunLock:
        with out_folder(self.run_dir):
            self._file = open(self.run_dir / ".lock", "a+")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise ConfigError(f"--out {self.run_dir} is in use by a run in progress ({holder}); "
                              "choose another --out") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._file is not None
        self._file.close()  # releases the lock


def prepare_run_dir(config: RunConfig, run_dir: Path) -> None:
    """Empty the run's files out of `run_dir`, refusing one that holds a run unless told to."""
    if not config.overwrite and any((run_dir / name).exists() for name in _RUN_FILES):
        raise ConfigError(f"--out {run_dir} already holds a run: pass --overwrite to replace "
                          "it, or choose another --out")
    for name in _RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (run_dir / "logs").mkdir()
    config.out = run_dir
    (run_dir / "config.json").write_text(config.to_json() + "\n")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the worker gets SIGKILL if the launcher dies, so no process is left behind. It
    ignores SIGINT: Ctrl-C reaches the whole process group, and the launcher, whose signal it
    is, stops the workers itself (SIGTERM); a worker interrupted first printed a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def worker_environment(config: RunConfig, rank: int, run_dir: Path, port: int,
                       placement: CpuPlacement) -> dict[str, str]:
    """The environment of worker `rank`: the launcher's, with what torch.distributed and
    hetsync read."""
    return {
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
        # torch's CPU allocator puts tensors of 2 MB or more on transparent huge pages: a
        # backward pass's fresh gradients (34 MB for mlp-wide's widest layer, mapped and
        # unmapped every step) fault in 512 times fewer pages. One worker alone went from
        # 510-515 to 622-649 samples/s on this project's VM. A value the user set wins.
        "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE", "1"),
        **child_environment(),  # a step's fresh gradients in the last step's memory
        "PYTHONUNBUFFERED": "1",  # a pipe would hold a worker's prints back until exit
        ENV_STORE_PORT: str(port),
        ENV_RUN_DIR: str(run_dir),
        **placement.environment(rank),
    }


def _spawn(
    config: RunConfig, run_dir: Path, port: int, resume: Resume | None,
    placement: CpuPlacement,
) -> list[subprocess.Popen[bytes]]:
    extra = resume.environment() if resume is not None else {}
    return [_spawn_one(config, run_dir, port, placement, rank, extra)
            for rank in range(config.workers)]


def _spawn_one(config: RunConfig, run_dir: Path, port: int, placement: CpuPlacement,
               rank: int, extra: dict[str, str]) -> subprocess.Popen[bytes]:
    """Worker `rank`'s process (at the start, or restarted: `extra` says which)."""
    command = (
        [sys.executable, *config.script]
        if config.script
        else [sys.executable, "-m", "hetsync.launch.worker"]
    )
    env = {**worker_environment(config, rank, run_dir, port, placement), **extra}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_die_with_parent)
    placement.place(rank, proc.pid)  # before it gets to training
    return proc


def _start_evaluation(config: RunConfig, run_dir: Path, control: dist.Store,
                      yield_cpu: bool) -> EvaluationThread:
    """The built-in workload's evaluation beside the monitor loop; stops the run at target.
    `yield_cpu`: the launcher shares a pinned worker's core, which the evaluation leaves it.

    When it may, a pinned run that does not stop at the target (the real suites') evaluates
    nothing until its workers are done (`evaluates_while_running`)."""
    evaluator = Evaluator.for_workload(
        run_dir, get_workload(config.workload), config.workers, config.eval_samples,
        data_dir=config.data_dir, device=config.device, keep_snapshots=config.keep_snapshots,
        recompute_bn=config.eval_bn == "recompute",
        on_consensus=stop_at_target(config, partial(control.set, STOP_KEY)),
        target_loss=config.target_loss,
    )
    measure = evaluator.measure
    model = measure.model if isinstance(measure, WorkloadMeasure) else None
    set_bytes = config.workers * sum(t.numel() * t.element_size()
                                     for t in (model.state_dict().values() if model else ()))
    poll = evaluates_while_running(config, set_bytes, shutil.disk_usage(run_dir).free)
    return EvaluationThread(evaluator, poll=poll, yield_cpu=yield_cpu)


def evaluates_while_running(config: RunConfig, set_bytes: int, free_bytes: int) -> bool:
    """Whether the launcher evaluates snapshots during the run, or leaves them all to after.

    The evaluation takes a core beside the workers it measures, and nothing in a pinned run
    that does not stop at the target depends on it: such a run evaluates after its workers
    (the time to target found by bisection all the same), if the snapshots written by then
    (`set_bytes` a set, one set each `eval_every`) fit in a quarter of the disk's
    `free_bytes`: an evaluation during the run drops the sets behind it."""
    if config.stop_at_target or not config.pin or config.max_time is None:
        return True
    sets = config.max_time / config.eval_every + 2  # the first and the final
    return sets * set_bytes > free_bytes / 4


def _progress_bar(config: RunConfig) -> tqdm | None:
    if config.quiet:
        return None
    unit = "s" if config.max_time is not None else " it"
    total = round(config.max_time) if config.max_time is not None else config.max_iterations
    if total is None:  # a script's loop ends the run: no end to show, the iterations so far
        fmt = "{desc}: {n} it [{elapsed}{postfix}]"
    else:
        fmt = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total}" + unit
        fmt += " [{elapsed}<{remaining}{postfix}]"
    return tqdm(total=total, desc=config.label, bar_format=fmt, dynamic_ncols=True)


def _update_bar(
    bar: tqdm | None, config: RunConfig, monitor: Monitor, evaluation: EvaluationThread | None
) -> None:
    if bar is None:
        return
    progress = monitor.progress()
    iterations = [it for r, it in enumerate(progress.iterations) if r not in monitor.lost]
    if config.max_time is not None:
        bar.n = min(round(progress.elapsed), bar.total)
    elif bar.total is not None:
        bar.n = min(min(iterations), bar.total)
    else:
        bar.n = min(iterations)
    postfix = {"iters": f"{min(iterations)}-{max(iterations)}"}
    if monitor.lost:
        postfix["lost"] = str(len(monitor.lost))
    if evaluation is not None and evaluation.evaluator.latest_loss is not None:
        postfix["loss"] = f"{evaluation.evaluator.latest_loss:.3f}"
    bar.set_postfix(postfix, refresh=False)
    bar.refresh()


def _warn_unprepared(monitor: Monitor) -> None:
    """A script that joined the run but trained with its own optimizer (`hetsync.prepare`
    never called) ends cleanly with nothing measured: say so, rather than a silent 0.0 s."""
    phases = monitor.progress().phases
    never = [r for r, phase in enumerate(phases) if phase == "starting" and r not in monitor.lost]
    if never:
        ranks = ", ".join(map(str, never))
        tqdm.write(f"hetsync: warning: worker rank{'s' if len(never) > 1 else ''} {ranks} "
                   f"ended without calling hetsync.prepare(model, optimizer): the script "
                   f"trained without synchronising, and the run measured nothing",
                   file=sys.stderr)


def _stop_reason(control: dist.Store, rank: int) -> str | None:
    key = f"stopped/{rank}"
    return control.get(key).decode() or None if control.check([key]) else None
