"""A worker's connection to the run: rank, process group, control store and run settings.

`join()` (`hetsync.init()`) works the same under `hetsync launch`/`hetsync train` (the launcher
hosts a TCPStore and passes its port), under `torchrun` (RANK, WORLD_SIZE, MASTER_ADDR, ... from
the agent) and in a plain single process (a world of one). The backend and compute device come from
`hetsync.transport.placement.place()`, the launcher's own rule: NCCL where every local worker
has a GPU of its own, gloo otherwise; workers share GPUs round-robin.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from hetsync.config import RunConfig, default_out
from hetsync.errors import ConfigError, is_follow_on
from hetsync.faults import FaultPlan, MessageDelay, parse_faults
from hetsync.transport.control import ControlChannel
from hetsync.transport.links import Links, bind_thread
from hetsync.transport.lost_workers import LostWorkers
from hetsync.transport.membership import ENV_GENERATION, Generation, Membership
from hetsync.transport.placement import place, visible_gpus

__all__ = ["Runtime", "current_runtime", "join", "shutdown"]

#: Environment variables the launcher sets for its workers.
ENV_STORE_PORT = "HETSYNC_STORE_PORT"
ENV_RUN_DIR = "HETSYNC_RUN_DIR"
#: Torch threads per worker, overriding `thread_count`'s choice.
ENV_THREADS = "HETSYNC_THREADS"
#: How long a gloo wait (a receive, a send, a collective, a store read) may last before it
#: fails, and a timed-out wait closes its pair for good. Without hetsync's launcher: torch's
#: own default, 30 minutes (or --hang-timeout if longer), since nothing else tells a peer
#: that evaluates for minutes from a hung one. Under the launcher, whose monitor does that
#: (a busy worker is never hung, a stopped or blocked one is within --hang-timeout):
#: `LAUNCHED_PG_TIMEOUT`, as long as the longest run, so that gloo never decides (`pg_timeout`).
PG_TIMEOUT = dist.default_pg_timeout
LAUNCHED_PG_TIMEOUT = datetime.timedelta(days=30)
#: Without hetsync's launcher (torchrun, a script's own processes), how long a finished worker
#: waits at the end for the others: long, since a slow worker may finish much later.
END_WAIT_S = 3600.0
#: Control-store keys by which a launched worker tells the launcher's monitor that it called
#: `hetsync.init()` (`joining`) and that it is in the run (`joined`: the process group formed,
#: its crash and stack hooks installed): the monitor's start-up limits time each stage.
JOINING_KEY = "joining/{rank}"
JOINED_KEY = "joined/{rank}"


@dataclass
class Runtime:
    """What a worker knows about the run it belongs to."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    config: RunConfig
    store: dist.Store
    """Control store (heartbeats, stop flag); never used for tensors."""
    t0: float
    """Origin of the run's time axis: rank 0's clock when all workers were ready to train."""
    run_dir: Path | None
    launched: bool
    """True under `hetsync launch`/`train`, whose parent process monitors and evaluates."""
    hang_timeout: float
    """`--hang-timeout`: how long a worker without progress may go before it counts as hung."""
    clock_started: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set once `t0` is the run's (receiver threads may get a message before that)."""
    lost: LostWorkers | None = None
    """Under `--on-failure continue`, the workers lost from the run; None: a loss ends it."""
    membership: Membership | None = None
    """Under `--on-failure rejoin`, the run's generations (hetsync.transport.membership)."""
    rejoining: bool = False
    """A restarted worker, joining a running run: it takes the live state from a member."""
    message_delay: MessageDelay | None = None
    """`--fault delay-messages`: holds some of this worker's messages back."""
    links: Links = dataclasses.field(default_factory=Links)
    """The wire, per kind of traffic (hetsync.transport.links): every message goes through
    one of them. The default is a gloo run's (tests that build a Runtime by hand)."""
    control: ControlChannel | None = None
    """The training loop's heartbeats out and the run's stop in (`open_control`)."""
    exit_hooks: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    """Run by `shutdown()` (at interpreter exit too), last added first, before the process
    group goes: a `SyncOptimizer` its script never closed ends its part in the run there
    (its protocol's threads joined, the end rendezvous), not with gloo torn down under it."""
    crashed: bool = False
    """The script ended with an uncaught exception, or `shutdown()` ran while one propagated:
    at exit nothing waits for the others."""

    def elapsed(self) -> float:
        return time.time() - self.t0

    def members(self) -> tuple[int, ...]:
        """The run's ranks in its current membership (all of them but where a generation of
        `--on-failure rejoin` left some out)."""
        if self.membership is not None:
            return self.membership.current.members
        return tuple(range(self.world_size))

    def start_clock(self) -> None:
        """Barrier, then every rank takes rank 0's clock as the origin of the time axis (a
        restarted worker takes it without a barrier: the others are training)."""
        if self.world_size > 1 and not self.rejoining:
            self.links.direct.barrier()
        if self.rank == 0:
            self.store.set("t0", repr(time.time()))
        self.t0 = float(self.store.get("t0").decode())
        if self.lost is not None:  # ranks lost before the start (a resume): known before step 1
            self.lost.refresh()
        self.clock_started.set()

    def before_send(self) -> None:
        """Called by protocols right before a message leaves (`--fault delay-messages`)."""
        if self.message_delay is not None:
            self.message_delay()

    @property
    def wait_timeout(self) -> float:
        """How long a protocol waits for a peer before it fails: `--hang-timeout` where no
        launcher watches; under hetsync's launcher as long as gloo's own waits
        (`pg_timeout`): its monitor names a hung or stopped peer within --hang-timeout, and a
        peer busy in its script's own code (an evaluation of minutes) is not hung, so a
        waiting peer's own deadline could only fail a run that is alive (and, under
        `--on-failure continue`, race the news of a loss to the terminal)."""
        return self.group_timeout.total_seconds() if self.launched else self.hang_timeout

    @property
    def group_timeout(self) -> datetime.timedelta:
        """The timeout of this run's process groups, for a group a protocol makes itself
        (Prague's P-Reduce subgroups): see `PG_TIMEOUT`."""
        return pg_timeout(self.launched, self.hang_timeout)

    def open_control(self) -> ControlChannel:
        """A new control channel for a training loop (the one before, if any, is closed;
        `shutdown()` closes the last): its heartbeats are sent where the launcher watches."""
        if self.control is not None:
            self.control.close()
        self.control = ControlChannel(self.store, self.rank, beats=self.launched)
        return self.control

    def leave_together(self) -> None:
        """Wait until every other worker still in the run has finished too: a rank tearing
        down its gloo pairs while a peer still uses them made the peer abort at exit now and
        then. Over the control store, among the workers not lost, and not with a barrier:
        where workers stop independently (Prague's Group Generator, Hop's skips, AD-PSGD, the
        asynchronous server) a fast worker may finish long before a slow one, and gloo's
        barrier gives up after the process group's timeout. Under hetsync's launcher the
        wait has no deadline: the launcher sees the others' progress and ends a real hang
        itself, naming the hung worker (a finished one is never counted as hung); without
        it, the wait gives up after `END_WAIT_S`, naming the ranks it waited for."""
        if self.world_size == 1:
            return
        self.store.set(f"left/{self.rank}", "")
        began = time.monotonic()
        while True:
            lost = self.lost.refresh() if self.lost is not None else frozenset()
            waiting = [r for r in self.members()
                       if r not in lost and not self.store.check([f"left/{r}"])]
            if not waiting:
                return
            if not self.launched and time.monotonic() - began > END_WAIT_S:
                raise TimeoutError(f"rank {self.rank} waited {END_WAIT_S:g} s at the end of the "
                                   f"run for ranks {waiting} to finish")
            time.sleep(0.05)

    def log_path(self) -> Path | None:
        return self.run_dir / "logs" / f"rank{self.rank}.log" if self.run_dir else None


_RUNTIME: Runtime | None = None


def current_runtime() -> Runtime:
    """The runtime made by `hetsync.init()`, or a clear error if it was not called."""
    if _RUNTIME is None:
        raise RuntimeError("hetsync.init() must be called before using hetsync's synchronizers")
    return _RUNTIME


def join(read_config: Callable[[Path | None], RunConfig]) -> Runtime:
    """Join the run: set up the process group (idempotent); this is `hetsync.init()`
    (hetsync.session). `read_config(run_dir)` gives the run's options, from the run directory
    the launcher named (None without one): which files say them, and which protocols exist,
    is the session's to know, not the transport's.
    """
    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME
    threads = thread_count(os.environ)
    if threads is not None:
        torch.set_num_threads(threads)
    run_dir = Path(os.environ[ENV_RUN_DIR]) if ENV_RUN_DIR in os.environ else None
    config = read_config(run_dir)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend, device = _placement(config, local_rank)
    config = dataclasses.replace(config, backend=backend, device=device.type)  # as decided
    if run_dir is None and config.out is not None:
        run_dir = Path(config.out)
    launched = ENV_STORE_PORT in os.environ
    timeout = pg_timeout(launched, config.hang_timeout)
    membership: Membership | None = None
    group: dist.ProcessGroup | None = None
    rejoining = launched and ENV_GENERATION in os.environ
    if config.on_failure == "rejoin" and not launched and world > 1:
        raise ConfigError("--on-failure rejoin needs hetsync's launcher (hetsync train or "
                          "launch), which restarts lost workers; under torchrun its agent "
                          "restarts them, and they resume from their checkpoints")
    if rejoining:  # restarted: the others are in a generation past the default group's
        store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                              int(os.environ[ENV_STORE_PORT]), is_master=False, timeout=timeout)
        dist.PrefixStore("hetsync", store).set(JOINING_KEY.format(rank=rank), "")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        membership, group = Membership.join_generation(
            dist.PrefixStore("hetsync", store), _group_store(timeout), rank, timeout,
            _confirm_s(config.hang_timeout), int(os.environ[ENV_GENERATION]))
    elif launched:
        store: dist.Store = dist.TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ[ENV_STORE_PORT]),
            is_master=False,
            timeout=timeout,
        )
        # Before the process group, which waits for every rank: the monitor then tells a
        # rank whose script never called init() from the ranks waiting for it.
        dist.PrefixStore("hetsync", store).set(JOINING_KEY.format(rank=rank), "")
        dist.init_process_group(
            backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
            timeout=timeout, device_id=device if backend == "nccl" else None,
        )
    elif "MASTER_ADDR" in os.environ:
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world, timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
        store = dist.distributed_c10d._get_default_store()
        config = dataclasses.replace(config, workers=world)
        if run_dir is None:
            run_dir = _agree_on_run_dir(dist.PrefixStore("hetsync", store), rank, config)
            config = dataclasses.replace(config, out=run_dir)
    else:
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    host_group = (dist.new_group(backend="gloo", timeout=timeout)
                  if backend == "nccl" and world > 1 else None)
    control = dist.PrefixStore("hetsync", store)
    lost = (LostWorkers(control, world, config.hang_timeout)
            if config.on_failure == "continue" else None)
    if config.on_failure == "rejoin" and membership is None and world > 1:
        membership = Membership(control, _group_store(timeout), rank, timeout,
                                _confirm_s(config.hang_timeout), Generation(0, tuple(range(world))))
    if lost is not None and not launched and world > 1:
        raise ConfigError("--on-failure continue needs hetsync's launcher (hetsync train or "
                          "launch), which detects lost workers; under torchrun use its own "
                          "restarts")
    _RUNTIME = Runtime(
        rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend,
        config=config, store=control, t0=time.time(), run_dir=run_dir, launched=launched,
        hang_timeout=config.hang_timeout,
        lost=lost, links=Links.of(backend, device, host_group, lost, membership, group),
        membership=membership, rejoining=rejoining,
        message_delay=FaultPlan(parse_faults(config.fault)).message_delay(rank, config.seed),
    )
    _install_failure_reporting(_RUNTIME)
    _note_crashes(_RUNTIME)
    atexit.register(shutdown)  # a process group alive at exit aborts the interpreter (gloo)
    if launched:  # after the hooks: the monitor may now ask for its stack (SIGUSR1)
        control.set(JOINED_KEY.format(rank=rank), "")
    return _RUNTIME


def _group_store(timeout: datetime.timedelta) -> Callable[[], dist.Store]:
    """A new client of the launcher's store, where the process groups meet, for each of the
    run's generations (`Membership`)."""
    def client() -> dist.Store:
        return dist.PrefixStore("pg", dist.TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ[ENV_STORE_PORT]),
            is_master=False, timeout=timeout))
    return client


def _confirm_s(hang_timeout: float) -> float:
    """How long a collective that failed waits for the launcher's new generation: its
    detection of a dead or hung peer takes up to `hang_timeout`, and a restart's spawn."""
    return hang_timeout + 10.0


def pg_timeout(launched: bool, hang_timeout: float) -> datetime.timedelta:
    """The process groups' and the control store's timeout (see `PG_TIMEOUT`)."""
    floor = LAUNCHED_PG_TIMEOUT if launched else PG_TIMEOUT
    return max(floor, datetime.timedelta(seconds=(4 if launched else 1) * hang_timeout))


def thread_count(env: Mapping[str, str]) -> int | None:
    """Torch threads for a worker with environment `env`; None: keep torch's default.

    One thread when several workers share the machine: the launcher's defaults and
    torchrun's OMP_NUM_THREADS=1 agree, and emulated slowdowns stay the only heterogeneity.
    A single process, or torchrun with one process per node, keeps all its cores.
    """
    if ENV_THREADS in env:
        value = env[ENV_THREADS]
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{ENV_THREADS} must be a positive integer (got {value!r})")
        return int(value)
    return 1 if int(env.get("LOCAL_WORLD_SIZE", "1")) > 1 else None


def shutdown() -> None:
    """Leave the run: close what the script left open (`Runtime.exit_hooks`: its
    SyncOptimizer), then destroy the process group (idempotent; at interpreter exit too)."""
    global _RUNTIME
    if _RUNTIME is not None:
        _RUNTIME.crashed = _RUNTIME.crashed or _failing()
        while _RUNTIME.exit_hooks:
            _RUNTIME.exit_hooks.pop()()
        if _RUNTIME.lost is not None:
            _RUNTIME.lost.close()
        if _RUNTIME.control is not None:  # its last beat: where a failing worker got to
            _RUNTIME.control.close()
        # Free the TCPStore client now: one destroyed during interpreter finalization (the
        # user's SyncOptimizer still holding it) aborts the process now and then.
        _RUNTIME.store = dist.HashStore()
    if dist.is_initialized():
        dist.destroy_process_group()
    _RUNTIME = None


def _agree_on_run_dir(store: dist.Store, rank: int, config: RunConfig) -> Path:
    """Under torchrun without `out`: rank 0 names a fresh run directory for everyone (the
    ranks' clocks may disagree on the time stamp in the name)."""
    if rank == 0:
        store.set("run_dir", str(default_out(config).resolve()))
    return Path(store.get("run_dir").decode())


def _placement(config: RunConfig, local_rank: int) -> tuple[str, torch.device]:
    """This worker's backend and compute device, by the launcher's rule (under the launcher,
    `config` already holds what it resolved); the note, where there is one, is printed once
    per machine: by the launcher, else by local rank 0."""
    local_workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    placement = place(config.backend, config.device, gpus=visible_gpus(),
                      local_workers=local_workers, local_rank=local_rank)
    if (placement.note and local_rank == 0 and not config.quiet
            and ENV_STORE_PORT not in os.environ):
        print(f"hetsync: note: {placement.note}", file=sys.stderr)
    device = torch.device(placement.device)
    bind_thread(device)  # the main thread's GPU, as each protocol thread binds its own
    return placement.backend, device


def _failing() -> bool:
    """Whether `shutdown()` runs while an error propagates (a script's `try: ... finally:
    hetsync.shutdown()`): its exit hooks must not close the run as if the loop had ended.
    A clean exit on its way (`sys.exit(0)`, `hetsync.RunStopped`) is no failure."""
    error = sys.exc_info()[1]
    return error is not None and not (isinstance(error, SystemExit) and not error.code)


def _note_crashes(runtime: Runtime) -> None:
    """Mark `runtime` crashed when the script dies of an uncaught exception (the interpreter
    calls `sys.excepthook` before its exit hooks): its exit then leaves at once, while a script
    that ended normally closes its part in the run first (`Runtime.exit_hooks`)."""
    previous = sys.excepthook

    def note(kind: type[BaseException], value: BaseException, tb: object) -> None:
        runtime.crashed = True
        previous(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = note


def _install_failure_reporting(runtime: Runtime) -> None:
    """Tracebacks of crashes and stacks of hangs go to logs/rank{r}.log for the launcher."""
    log = runtime.log_path()
    if log is None:
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    stack_file = open(log.with_suffix(".stack"), "w")  # kept open: faulthandler writes to it
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file, all_threads=True)  # SIGSEGV, SIGABRT, ...

    def write_traceback(kind: type[BaseException], value: BaseException, tb: object) -> None:
        text = "".join(traceback.format_exception(kind, value, tb))  # type: ignore[arg-type]
        log.write_text(text)
        if not (runtime.launched and is_follow_on(text)):  # the launcher names the cause
            sys.__excepthook__(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = write_traceback
    threading.excepthook = lambda args: write_traceback(
        args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback
    )
