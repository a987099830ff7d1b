"""Watching spawned workers: start-up, exits, crashes, hangs and progress.

A worker that exits non-zero, is killed, or makes no progress for `hang_timeout` seconds ends
the run with `WorkerFailed`. Progress is a new heartbeat or, for a worker in its script's own
code between two steps (evaluating, checkpointing, loading data: its phase `compute`), a
training thread that the kernel sees busy (`hetsync.launch.activity`): such a worker is never
hung for being quiet, a stopped, sleeping or blocked one is. The failure names its rank and
shows its traceback (from
`logs/rank{r}.log`), its stack (dumped on SIGUSR1 into `logs/rank{r}.stack`), or its last
output (`logs/rank{r}.out`) when it failed before `hetsync.init()` installed those hooks.
When several workers fail together, the one that failed first and for its own reason is
blamed: peers of a dead worker fail too, with "Connection closed by peer".

Under `--on-failure continue` (`essential` given), a worker that failed for its own reason
(it died, was stopped, hung while computing) and hosts nothing the run needs is *lost*
instead: the monitor kills it if it still runs (so that its peers' transfers with it end),
announces it in the control store (key `lost`, the lost ranks joined by commas), where the
workers' `LostWorkers` watchers read it, and the run goes on. A deadlock, or a peer failing
with it (a follow-on error: the protocol did not tolerate the loss), still ends the run.

Before its first heartbeat a worker is starting, and its peers wait for it, in
`hetsync.init()` (the process group forms once every rank is in it) or in building their
`SyncOptimizer` (the model's broadcast, the clock's barrier), without a deadline the launcher
would see: the start-up limits below bound each stage, and one that exits cleanly before
joining ends the run at once. None of these can be lost: the others cannot start without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist
from tqdm import tqdm

from hetsync.errors import LOOP_ENDED, WorkerFailed, is_follow_on
from hetsync.launch.activity import Activity
from hetsync.launch.output import TAIL_LINES, OutputRelay
from hetsync.transport.lost_workers import LOST_KEY
from hetsync.transport.runtime import JOINED_KEY, JOINING_KEY

__all__ = ["Monitor", "Progress"]

#: How long a worker may take from its launch to joining the run (import torch and whatever its
#: script does before `hetsync.init()`, which then waits for every rank): 5-10 s here with 8
#: workers importing torch at once on 2 cores; a loaded machine takes several times that.
JOIN_LIMIT_S = 60.0
#: How long a worker may take from joining to its first heartbeat (load its data, build its
#: model and its SyncOptimizer), while the peers that built theirs wait for it.
SETUP_LIMIT_S = 60.0
# A longer --hang-timeout lengthens both (`Monitor.start_limits`). Both stay far under the
# process group's own timeout, which under this launcher outlasts any run
# (`hetsync.transport.runtime.pg_timeout`): the monitor, not gloo, tells a late peer.
#: How far back the CPU of a quiet worker counts (`Activity`): a worker that stops being busy
#: is hung --hang-timeout after this window at most.
ACTIVITY_WINDOW_S = 2.0


@dataclass
class Progress:
    """The latest heartbeat of every worker: iteration, phase and run time."""

    iterations: list[int]
    phases: list[str]
    elapsed: float


@dataclass
class Monitor:
    procs: list[subprocess.Popen[bytes]]
    store: dist.Store
    log_dir: Path
    hang_timeout: float
    output: OutputRelay | None = None
    essential: frozenset[int] | None = None
    """`--on-failure continue`: the ranks whose loss still ends the run; None: any does."""
    on_lost: Callable[[int, WorkerFailed], None] | None = None
    """Told of each worker lost (the launcher's evaluator and summary)."""
    on_back: Callable[[int], None] | None = None
    """Told of a restarted worker's first heartbeat (`--on-failure rejoin`)."""
    announce: bool = True
    """Say on the terminal that the run goes on without a lost worker (`continue`'s)."""
    lost: dict[int, WorkerFailed] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    _beats: dict[int, str] = field(default_factory=dict)
    _changed: dict[int, float] = field(default_factory=dict)
    _warned: set[int] = field(default_factory=set)
    _stopped_since: dict[int, float] = field(default_factory=dict)
    """Finished workers seen stopped, and since when (`_check_finishing`)."""
    _joining: set[int] = field(default_factory=set)
    """Workers that called `hetsync.init()` and have not joined yet."""
    _joined: dict[int, float] = field(default_factory=dict)
    """Workers in the run (a heartbeat counts), and since when (as first seen)."""
    _activity: dict[int, Activity] = field(default_factory=dict)
    """The CPU of each worker quiet in its own code, sampled since its last heartbeat."""
    _busy: dict[int, float] = field(default_factory=dict)
    """When each of those was last seen busy."""
    _spawned: dict[int, float] = field(default_factory=dict)
    """When each restarted worker was spawned (the others: `started`)."""

    def start_limits(self) -> tuple[float, float]:
        """The seconds a worker gets to join the run, and then to start training: a longer
        --hang-timeout (a slow machine's users lengthen it) lengthens both."""
        return max(JOIN_LIMIT_S, self.hang_timeout), max(SETUP_LIMIT_S, self.hang_timeout)

    def check(self) -> bool:
        """True once every worker exited cleanly (a lost one counts as exited); raise
        WorkerFailed on a failure or hang that the run cannot go on without."""
        try:
            return self._check()
        except WorkerFailed as failure:
            if self.essential is None or not failure.own or failure.rank in self.essential:
                raise
            self._lose(failure)
            return False

    def _lose(self, failure: WorkerFailed) -> None:
        """Go on without `failure.rank`: see the module doc."""
        rank = failure.rank
        proc = self.procs[rank]
        if proc.poll() is None:
            proc.kill()  # stopped or hung: dead, its connections close and its peers go on
            proc.wait()
        self.lost[rank] = failure
        self.store.set(LOST_KEY, ",".join(str(r) for r in sorted(self.lost)))
        now = time.monotonic()
        for other in self._changed:  # its peers may have waited for it: a fresh allowance
            self._changed[other] = now
        if self.output is not None:
            self.output.mute(keep=set(range(len(self.procs))) - set(self.lost))
        if self.announce:
            tqdm.write(f"hetsync: worker rank {rank} {failure.reason}; going on without it "
                       f"(--on-failure continue; details in logs/rank{rank}.*)", file=sys.stderr)
        if self.on_lost is not None:
            self.on_lost(rank, failure)

    def restarted(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        """`rank` lost, and restarted as `proc` (`--on-failure rejoin`): watched afresh, from
        its start-up on, as a worker of the run."""
        self.procs[rank] = proc
        self.lost.pop(rank, None)
        for state in (self._beats, self._changed, self._activity, self._busy,
                      self._stopped_since, self._joined):
            state.pop(rank, None)  # type: ignore[attr-defined]
        self._joining.discard(rank)
        self._spawned[rank] = time.monotonic()
        if self.output is not None:
            self.output.mute(keep=set(range(len(self.procs))) - set(self.lost))

    def _check(self) -> bool:
        codes = [self._exit_code(rank) for rank in range(len(self.procs))]
        if any(c not in (None, 0) for c in codes):
            if self.output is not None:
                self.output.mute(keep={r for r, c in enumerate(codes) if c not in (None, 0)})
            time.sleep(0.5)  # let the failure's echo reach the other workers' exit codes
            raise self._failure([self._exit_code(r) for r in range(len(self.procs))])
        self._read_beats()
        self._read_joins()  # after the exit codes: a worker says it joined before it exits
        left = [r for r, c in enumerate(codes)
                if c == 0 and r not in self.lost and r not in self._joined]
        if left:  # the others wait for it in init() (no gloo deadline ends that), or exit 0
            raise self._blame(left[0], _LEFT_BEFORE_JOINING)
        if all(c == 0 for c in codes):
            return True
        self._check_start(codes)
        self._check_hang(codes)
        return False

    def _read_joins(self) -> None:
        now = time.monotonic()
        for rank in range(len(self.procs)):
            if rank in self._joined:
                continue
            if rank in self._beats or self.store.check([JOINED_KEY.format(rank=rank)]):
                self._joined[rank] = now
                self._joining.discard(rank)
            elif self.store.check([JOINING_KEY.format(rank=rank)]):
                self._joining.add(rank)

    def _check_start(self, codes: list[int | None]) -> None:
        """Workers still starting past a start-up limit (see the module doc): blame one
        whose script has not got as far as its peers, which wait for it."""
        join_limit, setup_limit = self.start_limits()
        now = time.monotonic()
        live = [r for r, c in enumerate(codes) if c is None and r not in self._beats]
        late = [r for r in live if r not in self._joined
                and now - self._spawned.get(r, self.started) > join_limit]
        if late:
            never = [r for r in late if r not in self._joining]
            if never:  # the ranks in init() wait for it: the process group needs every rank
                waiting = [r for r in late if r in self._joining]
                reason = (f"did not join the run within {join_limit:g} s of its start (its "
                          f"script never called hetsync.init()){_nor(never[1:], 'did')}"
                          f"{_wait(waiting, 'for it in hetsync.init()')}")
            else:
                never = late
                reason = (f"called hetsync.init() but did not join the run within "
                          f"{join_limit:g} s of its start (the process group did not form)"
                          f"{_nor(late[1:], 'did')}")
            raise self._blame(never[0], reason, self._recent_output(never[0]))
        late = [r for r in live if r in self._joined and now - self._joined[r] > setup_limit]
        if not late:
            return
        stacks = {r: self._dump_stack(r) for r in late}  # joined: its hooks answer SIGUSR1
        waiting = [r for r in late if _IN_SYNC_OPTIMIZER in stacks[r]]
        behind = [r for r in late if r not in waiting]
        reason = f"joined the run but did not start training within {setup_limit:g} s of joining"
        if behind:
            reason += (f": its script has not built its SyncOptimizer (hetsync.prepare) since "
                       f"hetsync.init(){_nor(behind[1:], 'has')}"
                       f"{_wait(waiting, 'for it in building its own')}")
        else:  # hetsync's own set-up hangs: no script to blame
            behind = late
            reason += f": stuck building its SyncOptimizer{_nor(late[1:], 'is')}"
        raise self._blame(behind[0], reason, f"its stack:\n{stacks[behind[0]]}")

    def _blame(self, rank: int, reason: str, details: str = "") -> WorkerFailed:
        """A start-up failure of `rank`, its output alone shown from now on: never a loss,
        since the others cannot start without it."""
        if self.output is not None:
            self.output.mute(keep={rank})
        return WorkerFailed(rank, reason, details, own=False)

    def _recent_output(self, rank: int) -> str:
        """The last lines a worker that is still running wrote, for a failure report."""
        if self.output is None:
            return ""
        lines = self.output.tail(rank, stderr=True) or self.output.tail(rank, stderr=False)
        if not lines:
            return ""
        return f"its last output (all of it in logs/rank{rank}.out):\n" + "\n".join(lines)

    def _exit_code(self, rank: int) -> int | None:
        """The worker's exit code, with an abort after its final heartbeat counted as clean.

        A few C++ destructors (gloo, TCPStore) can abort the interpreter's exit after the
        worker has finished and written everything; that is not a failed run. A lost worker
        counts as exited cleanly: the run goes on without it.
        """
        if rank in self.lost:
            return 0
        code = self.procs[rank].poll()
        if code == -signal.SIGABRT:
            self._read_beats()
            if self._beats.get(rank, "").split()[1:2] == ["done"]:
                if rank not in self._warned:
                    self._warned.add(rank)
                    tqdm.write(f"hetsync: warning: worker rank {rank} aborted while exiting, "
                               "after it had finished; its results are complete", file=sys.stderr)
                return 0
        return code

    def progress(self) -> Progress:
        """Heartbeats read so far (call `check()` first to refresh them)."""
        iterations, phases, elapsed = [], [], 0.0
        for rank in range(len(self.procs)):
            beat = self._beats.get(rank, "0 starting 0").split()
            iterations.append(int(beat[0]))
            phases.append(beat[1])
            elapsed = max(elapsed, float(beat[2]))
        return Progress(iterations, phases, elapsed)

    def _read_beats(self) -> None:
        now = time.monotonic()
        for rank in range(len(self.procs)):
            key = f"hb/{rank}"
            if not self.store.check([key]):
                continue
            beat = self.store.get(key).decode()
            if rank in self._spawned and rank not in self._beats and self.on_back is not None:
                self.on_back(rank)  # a restarted worker's first: it trains again
            if beat != self._beats.get(rank):
                self._beats[rank] = beat
                self._changed[rank] = now
                self._activity.pop(rank, None)
                self._busy.pop(rank, None)

    def _check_hang(self, codes: list[int | None]) -> None:
        """Workers that have started training (the others are `_check_start`'s)."""
        now = time.monotonic()
        live = [r for r, c in enumerate(codes) if c is None and r in self._beats]
        stalled, active = [], 0
        for rank in live:
            beat = self._beats[rank].split()
            if beat[1] in ("closing", "done"):
                self._check_finishing(rank, int(beat[0]), now)
                continue
            active += 1
            limit = self.hang_timeout
            if beat[1] == "delay":  # an emulated compute of the seconds it announced
                limit += float(beat[3])
            if beat[1] != "sync":  # in a wait, its peers' progress tells (below)
                self._watch_activity(rank, now)
            if now - max(self._changed[rank], self._busy.get(rank, 0.0)) > limit:
                stalled.append(rank)
        if not stalled:
            return
        progress = self.progress()
        stopped = [r for r in live if _process_state(self.procs[r].pid) in ("T", "t")]
        computing = [r for r in stalled if progress.phases[r] != "sync"]
        restarting = [r for r in self._spawned if r not in self._beats and codes[r] is None]
        if not stopped and not computing and (len(stalled) < active or restarting):
            return  # they wait for a worker that still makes progress: slow, not deadlocked
            # (or for a restarted one, which the start-up limits watch: `_check_start`)
        if self.output is not None:
            self.output.mute()
        if stopped:  # a stopped process cannot answer for its stack: the kernel says it
            rank = stopped[0]
            raise WorkerFailed(rank, f"was stopped (SIGSTOP or a debugger) at iteration "
                               f"{progress.iterations[rank] + 1} and made no progress for "
                               f"{self.hang_timeout:g} s")
        ended = [r for r in live if self._loop_ended(r)]
        if not computing and ended:  # a lock-step protocol's peers wait for it for good
            rank = ended[0]
            raise WorkerFailed(rank, (
                f"ended its loop by itself after iteration {progress.iterations[rank]} (its "
                f"data ran out before the run's stop) while the others wait for it in "
                f"synchronisation: this protocol needs every worker to run as many iterations "
                f"(equal shards, or stop with --max-iterations or --max-time)"), own=False)
        if computing:
            rank = computing[0]
            what = (f"hung: no progress for {self.hang_timeout:g} s while computing, its "
                    f"training thread asleep or blocked")
        else:
            rank = min(live, key=lambda r: progress.iterations[r])
            what = (
                f"is furthest behind in a deadlock: every stalled worker waited more than "
                f"{self.hang_timeout:g} s in synchronisation"
            )
        stack = self._dump_stack(rank)
        raise WorkerFailed(rank, f"{what} (iteration {progress.iterations[rank] + 1})",
                           f"its stack:\n{stack}", own=bool(computing))

    def _watch_activity(self, rank: int, now: float) -> None:
        """Sample the CPU of `rank`, quiet outside a wait, once it has been quiet for a
        window (or a quarter of --hang-timeout if shorter: a training worker beats far more
        often, nothing is read for it), and note when it was last busy (see the module doc)."""
        window = min(ACTIVITY_WINDOW_S, self.hang_timeout / 2)
        if now - self._changed[rank] < min(window, self.hang_timeout / 4):
            return
        activity = self._activity.get(rank)
        if activity is None:
            activity = self._activity[rank] = Activity(self.procs[rank].pid, window)
        activity.sample(now)
        if activity.busy(now):
            self._busy[rank] = now

    def _check_finishing(self, rank: int, iteration: int, now: float) -> None:
        """A finished worker waits, without heartbeats, for the others at the end of the run
        (`Runtime.leave_together`), for as long as they take: it is never hung for being
        quiet. A stopped one never leaves that wait, and its peers would wait for it for
        good: stopped for longer than --hang-timeout, as the kernel says, it failed (lost
        under `--on-failure continue`, and the others leave without it)."""
        if _process_state(self.procs[rank].pid) not in ("T", "t"):
            self._stopped_since.pop(rank, None)
            return
        # Its heartbeat is quiet since it finished, however long ago: time the stop itself,
        # so that a short one (a debugger, SIGSTOP then SIGCONT) is no failure.
        since = self._stopped_since.setdefault(rank, now)
        if now - since > self.hang_timeout:
            if self.output is not None:
                self.output.mute()
            raise WorkerFailed(rank, f"was stopped (SIGSTOP or a debugger) while finishing, "
                               f"after iteration {iteration}, for more than "
                               f"{self.hang_timeout:g} s")

    def _loop_ended(self, rank: int) -> bool:
        """`rank` closed without a stop condition: its script's loop ended by itself."""
        key = f"stopped/{rank}"
        return self.store.check([key]) and self.store.get(key).decode().startswith(LOOP_ENDED)

    def _dump_stack(self, rank: int) -> str:
        stack_file = self.log_dir / f"rank{rank}.stack"
        try:
            os.kill(self.procs[rank].pid, signal.SIGUSR1)
        except ProcessLookupError:
            return "(process already gone)"
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if stack_file.is_file() and stack_file.stat().st_size > 0:
                time.sleep(0.2)
                return stack_file.read_text()
        return "(no stack: the worker did not answer SIGUSR1)"

    def _failure(self, codes: list[int | None]) -> WorkerFailed:
        candidates = []
        for rank, code in enumerate(codes):
            if code in (None, 0):
                continue
            log = self.log_dir / f"rank{rank}.log"
            text = log.read_text() if log.is_file() else ""
            secondary = is_follow_on(text)
            when = log.stat().st_mtime if text else 0.0  # killed: no log, surely first
            candidates.append((secondary, when, rank, code, text))
        secondary, _, rank, code, text = min(candidates)
        self._read_beats()
        if secondary:  # every failure echoes a peer's: one that left before training?
            self._read_joins()
            quit_early = [r for r, c in enumerate(codes)
                          if c == 0 and r not in self.lost and r not in self._beats]
            if quit_early:
                return self._blame(quit_early[0], (
                    "exited (code 0) after joining the run, before it started training, and "
                    "the others failed without it" if quit_early[0] in self._joined else
                    _LEFT_BEFORE_JOINING))
        at = f" at iteration {self.progress().iterations[rank] + 1}" if rank in self._beats else (
            " before it started training")
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            stack_file = self.log_dir / f"rank{rank}.stack"
            stack = stack_file.read_text() if stack_file.is_file() else ""
            if stack:
                return WorkerFailed(rank, f"was killed by signal {name}{at}",
                                    f"its stack:\n{stack}", own=not secondary)
            return WorkerFailed(rank, f"was killed by signal {name}{at} (no traceback)",
                                own=not secondary)
        details = f"its traceback:\n{text}" if text else self._last_output(rank)
        return WorkerFailed(rank, f"failed with exit code {code}{at}", details,
                            own=not secondary)

    def _last_output(self, rank: int) -> str:
        """Its last lines on stderr (where an uncaught exception's traceback goes), else on
        stdout, else what logs/rank{r}.out holds."""
        lines, what = [], "output"
        if self.output is not None:
            self.output.wait_for(rank)
            lines = self.output.tail(rank, stderr=True)
            what = "error output" if lines else what
            lines = lines or self.output.tail(rank, stderr=False)
        out = self.log_dir / f"rank{rank}.out"
        if not lines and out.is_file():
            lines = out.read_text(errors="replace").splitlines()
        if not lines:
            return "(no traceback was written)"
        tail = "\n".join(lines[-TAIL_LINES:])
        return (f"no traceback was written; its last {what} (all of it in logs/rank{rank}.out):"
                f"\n{tail}")


_LEFT_BEFORE_JOINING = ("exited (code 0) before joining the run (its script ended without "
                        "calling hetsync.init())")
#: In a worker's stack, a frame of SyncOptimizer's construction: it waits for its peers there.
_IN_SYNC_OPTIMIZER = str(Path("hetsync", "api.py"))


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _nor(ranks: list[int], verb: str) -> str:
    """The other ranks in the same state ("; nor did rank 2"), or nothing."""
    return f"; nor {verb} {_ranks(ranks)}" if ranks else ""


def _wait(ranks: list[int], where: str) -> str:
    """The ranks that wait for the one blamed ("; rank 1 waits for it in ...")."""
    return f"; {_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} {where}" if ranks else ""


def _process_state(pid: int) -> str:
    """The kernel's state letter for `pid` (R running, S sleeping, T stopped, ...), or "?"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[-1].split()[0]  # after the command name, which may hold spaces


def terminate(procs: list[subprocess.Popen[bytes]], grace: float = 3.0) -> None:
    """Stop every worker still running: SIGTERM, then SIGKILL after `grace` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
