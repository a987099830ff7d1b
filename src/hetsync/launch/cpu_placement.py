"""Where the workers run on this machine's CPUs: `--pin` (cores of their own, by affinity)
and `--slowdown cpu:` (a CPU quota, hetsync.launch.cpu_quota), set up by the launcher around
spawning; a straggler joins its quota as its training starts. Both are real, not emulated:
the kernel enforces them.

Under `--pin`, rank r gets the `--cpus-per-worker` cores after rank r-1's, and the launcher
(its evaluation and snapshots) moves to the cores left over. The order follows the machine's
SMT siblings (hyperthreads, which share one physical core's units), not the cores' numbers,
which put siblings side by side on some machines (0 and 1) and half the machine apart on
others (0 and 8): a worker asking for fewer cores than a physical core has threads gets one
thread of each physical core before any core's second thread is given out, so no two
workers share a physical core while there are enough of them; a worker asking for at least
that many gets whole physical cores. With none left over the launcher shares the last
rank's cores, and says so in the one line it prints: a launcher that takes cores from every
worker would slow them all. Its evaluation then runs at the lowest priority, so that the
rank keeps its core. With `--keep-awake` the workers' cores also get busy loops that run
only when they would idle (hetsync.launch.awake_cores).
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from hetsync.affinity import pin_process
from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch.awake_cores import AwakeCores
from hetsync.launch.cpu_quota import CpuQuota
from hetsync.slowdown import ENV_CPU_CGROUP

__all__ = ["CpuPlacement", "Pinning", "plan_pinning"]


@dataclass(frozen=True)
class Pinning:
    """Each rank's cores, the launcher's, and the line that tells the user."""

    workers: list[frozenset[int]]
    launcher: frozenset[int]
    note: str

    @property
    def launcher_shares(self) -> bool:
        """Whether the launcher runs on a worker's cores (none were left over)."""
        return self.launcher in self.workers


def plan_pinning(workers: int, per_worker: int, available: set[int],
                 physical: list[frozenset[int]] | None = None) -> Pinning:
    """Give each worker `per_worker` cores of `available` of its own; ConfigError if short.
    `physical`: the machine's physical cores as sets of SMT siblings (read from sysfs when
    None; a core missing from every set is a physical core of its own)."""
    cores = sorted(available)
    need = workers * per_worker
    if need > len(cores):
        raise ConfigError(f"--pin: {workers} workers x {per_worker} core(s) need {need} cores, "
                          f"but this process may run on {len(cores)} ({_names(cores)}): use "
                          "fewer workers or leave --pin out")
    groups = _physical_cores(cores, physical_cores() if physical is None else physical)
    width = max(len(group) for group in groups)
    order = _order(groups, spread=per_worker < width)
    own = [frozenset(order[r * per_worker:(r + 1) * per_worker]) for r in range(workers)]
    left = frozenset(order[need:])
    smt = ""
    if width > 1:
        smt = (", one thread of each physical core first" if per_worker < width else
               ", whole physical cores")
    if left:
        note = (f"--pin: {workers} workers on {_names(order[:need])} ({per_worker} each{smt}), "
                f"the launcher on {_names(left)}")
        return Pinning(own, left, note)
    note = (f"--pin: {workers} workers on {need} cores{smt}: the launcher shares "
            f"{_names(own[-1])} with rank {workers - 1} (its evaluation at the lowest priority)")
    return Pinning(own, own[-1], note)


def physical_cores(root: Path = Path("/sys/devices/system/cpu")) -> list[frozenset[int]]:
    """This machine's physical cores, each the set of its SMT siblings; [] where sysfs does
    not say (each core then counts as a physical core of its own)."""
    found = set()
    for path in root.glob("cpu[0-9]*/topology/thread_siblings_list"):
        try:
            found.add(frozenset(_parse_cpu_list(path.read_text())))
        except (OSError, ValueError):
            continue
    return sorted(found, key=min)


def _parse_cpu_list(text: str) -> list[int]:
    """The kernel's CPU list format: "0-3,8,10-11"."""
    cores: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores


def _physical_cores(cores: list[int], physical: list[frozenset[int]]) -> list[list[int]]:
    """`cores` grouped by physical core (siblings in numeric order), groups by first core."""
    of = {core: group for group in physical for core in group}
    groups: dict[frozenset[int], list[int]] = {}
    for core in cores:
        groups.setdefault(of.get(core, frozenset({core})), []).append(core)
    return sorted(groups.values(), key=min)


def _order(groups: list[list[int]], spread: bool) -> list[int]:
    """Whole physical cores one after the other, or (`spread`) every physical core's first
    thread, then every one's second, and so on."""
    if not spread:
        return [core for group in groups for core in group]
    width = max(len(group) for group in groups)
    return [group[i] for i in range(width) for group in groups if i < len(group)]


class CpuPlacement:
    """The run's pinning and CPU quotas: set up on entry (ConfigError before anything starts
    if they cannot be); a worker's pinning is applied by `place` right after it is spawned,
    its quota by the worker itself as its training starts (`environment`); undone on exit
    however the run ends (the launcher's own affinity restored, the cgroups removed).
    """

    def __init__(self, config: RunConfig, run_id: str, cgroup_root: Path | None = None) -> None:
        self.config = config
        spec = config.slowdown_spec()
        shares = {rank: spec.share for rank in spec.ranks} if spec.kind == "cpu" else {}
        self.quota = CpuQuota(shares, run_id, cgroup_root) if shares else None
        self.pinning: Pinning | None = None
        self.awake: AwakeCores | None = None
        self._launcher_was: set[int] | None = None
        self._undo = ExitStack()

    def __enter__(self) -> CpuPlacement:
        if self.config.pin:
            self.pinning = plan_pinning(self.config.workers, self.config.cpus_per_worker,
                                        os.sched_getaffinity(0))
        # One stack for the quota, the affinity and the busy loops: whichever step fails,
        # what the earlier ones set up is undone before the error leaves.
        with ExitStack() as stack:
            if self.quota is not None:
                self.quota.create()
                stack.callback(self._remove_quota)
            if self.pinning is not None:
                self._launcher_was = os.sched_getaffinity(0)
                pin_process(self.pinning.launcher)
                stack.callback(self.free_launcher)
                awake = "; their cores kept awake" if self.config.keep_awake else ""
                print(f"hetsync: {self.pinning.note}{awake}", file=sys.stderr)  # --quiet: bar
                if self.config.keep_awake:
                    self.awake = stack.enter_context(AwakeCores(
                        core for cores in self.pinning.workers for core in cores))
            self._undo = stack.pop_all()
        return self

    def free_launcher(self) -> None:
        """The launcher back on the cores it had before (the workers are gone: what it does
        now, such as the evaluation left over, takes no core from them)."""
        if self._launcher_was is not None:
            pin_process(self._launcher_was)

    @property
    def launcher_shares_a_worker(self) -> bool:
        """Whether the launcher runs on a pinned worker's cores (none were left over): its
        evaluation must then yield them (`EvaluationThread(yield_cpu=True)`)."""
        return self.pinning is not None and self.pinning.launcher_shares

    def environment(self, rank: int) -> dict[str, str]:
        """What `rank`'s environment needs: the quota cgroup it joins as its training starts
        (hetsync.slowdown.join_cpu_quota), if it is a `cpu:` straggler."""
        procs = self.quota.procs_file(rank) if self.quota is not None else None
        return {ENV_CPU_CGROUP: str(procs)} if procs is not None else {}

    def place(self, rank: int, pid: int) -> None:
        """Pin a just-spawned worker before it gets to training. One that is already gone is
        left to the monitor to report."""
        try:
            if self.pinning is not None:
                os.sched_setaffinity(pid, self.pinning.workers[rank])
        except ProcessLookupError:
            pass

    def facts(self) -> dict[str, Any] | None:
        """What was done, for summary.json's `placement`; None if nothing was."""
        if self.pinning is None and self.quota is None:
            return None
        facts: dict[str, Any] = {}
        if self.pinning is not None:
            facts["cores"] = {str(r): sorted(c) for r, c in enumerate(self.pinning.workers)}
            facts["launcher_cores"] = sorted(self.pinning.launcher)
            facts["kept_awake"] = self.awake is not None
        if self.quota is not None:
            facts["cpu_share"] = {str(r): s for r, s in sorted(self.quota.shares.items())}
            facts["cgroup"] = "v2" if self.quota.v2 else "v1"
        return facts

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._undo.close()

    def _remove_quota(self) -> None:
        assert self.quota is not None
        for problem in self.quota.remove():
            print(f"hetsync: {problem}", file=sys.stderr)


def _names(cores: set[int] | frozenset[int] | list[int]) -> str:
    ordered = sorted(cores)
    if len(ordered) == 1:
        return f"core {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"cores {ordered[0]}-{ordered[-1]}"
    return "cores " + ",".join(map(str, ordered))
