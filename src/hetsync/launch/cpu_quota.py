"""Real stragglers: the kernel caps a worker's CPU time with a CPU-quota cgroup.

`--slowdown cpu:ranks=R,share=S` is not emulated: each named worker runs in a cgroup of its
own, `hetsync-<run id>-rank<R>`, whose quota is S times its period (S of one core), so its
compute, its communication threads and everything else it runs are throttled by the
scheduler, as a slower or busier machine would be. The launcher creates the cgroups before
spawning (so a refusal is one line before anything starts), moves each worker in right after
spawning it (threads it starts later inherit the cgroup) and removes them after the run,
however it ends: a dead worker leaves its cgroup empty, and an empty cgroup can be removed.

cgroup v1 (a `cpu` hierarchy at ROOT/cpu: cpu.cfs_quota_us, cpu.cfs_period_us) is what this
was tested on; cgroup v2 (ROOT/cgroup.controllers exists: cpu.max = "quota period") is
implemented the same way but untested; there, a run that had to enable the `cpu` controller
in the root's cgroup.subtree_control disables it again after the run, unless another run's
cgroup is still there.

A launcher killed with SIGKILL removes nothing: its workers die with it (PR_SET_PDEATHSIG),
and its cgroups stay behind, empty. The next run's `create` removes those, every empty
`hetsync-<pid>-rank<R>` whose launcher `pid` no longer runs (a cgroup that still holds a
process cannot be removed, so nothing alive loses one).
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

from hetsync.errors import ConfigError

__all__ = ["CGROUP_ROOT", "CpuQuota"]

#: Where the cgroup file system is mounted; tests point a CpuQuota elsewhere to be refused.
CGROUP_ROOT = Path("/sys/fs/cgroup")
_V2_PERIOD_US = 100_000
#: A run's cgroup, named by its launcher's pid (launch/launcher.py's run id).
_RUN_CGROUP = re.compile(r"hetsync-(\d+)-rank\d+")


class CpuQuota:
    """The quota cgroups of one run: `shares` maps a rank to its share of one core."""

    def __init__(self, shares: dict[int, float], run_id: str, root: Path | None = None) -> None:
        self.shares, self.run_id = shares, run_id
        self.root = root = CGROUP_ROOT if root is None else root
        self.v2 = (root / "cgroup.controllers").exists()
        self.base = root if self.v2 else root / "cpu"
        self.dirs: dict[int, Path] = {}
        self.enabled_cpu = False
        """Whether this run enabled the v2 `cpu` controller in the root (undone by `remove`)."""

    def create(self) -> None:
        """Make every rank's cgroup with its quota, after removing the ones killed launchers
        left; ConfigError (one line) if not permitted, with whatever was made already
        removed."""
        try:
            self._check_controller()
            self.remove_stale()
            for rank, share in sorted(self.shares.items()):
                path = self.base / f"hetsync-{self.run_id}-rank{rank}"
                self._mkdir(path)
                self.dirs[rank] = path
                self._set_quota(path, share)
        except ConfigError:
            self.remove()
            raise

    def procs_file(self, rank: int) -> Path | None:
        """The file that moves a process (all its threads) into `rank`'s cgroup, if it has
        one: the worker writes its pid there as its training starts (hetsync.slowdown)."""
        return self.dirs[rank] / "cgroup.procs" if rank in self.dirs else None

    def remove(self, wait: float = 2.0) -> list[str]:
        """Remove the cgroups; returns a line for each one that could not be removed. A
        process that has just died may take a moment to leave: EBUSY is retried a while."""
        problems = []
        deadline = time.monotonic() + wait
        for rank, path in sorted(self.dirs.items()):
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    if error.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    problems.append(f"could not remove cgroup {path}: {error.strerror}")
                    break
            del self.dirs[rank]
        if self.enabled_cpu and not any(self.base.glob("hetsync-*")):  # no other run's
            try:
                (self.root / "cgroup.subtree_control").write_text("-cpu\n")
                self.enabled_cpu = False
            except OSError as error:
                problems.append(f"could not disable the cpu controller in "
                                f"{self.root / 'cgroup.subtree_control'}: {error.strerror}")
        return problems

    def remove_stale(self) -> list[Path]:
        """Remove the empty cgroups of launchers that no longer run (killed, so that they
        could not remove their own); returns them. One still in use, or that this process
        may not remove, is left. (A launcher in another PID namespace that shares this
        hierarchy looks gone: its cgroups are safe only once its workers are in them.)"""
        removed = []
        for path in sorted(self.base.glob("hetsync-*")):
            named = _RUN_CGROUP.fullmatch(path.name)
            if named is None or named[1] == self.run_id or _runs(int(named[1])):
                continue
            try:
                path.rmdir()  # EBUSY while a process is in it
            except OSError:
                continue
            removed.append(path)
        return removed

    def _check_controller(self) -> None:
        if self.v2:
            controllers = (self.root / "cgroup.controllers").read_text().split()
            if "cpu" not in controllers:
                raise ConfigError(f"--slowdown cpu: the cgroup v2 hierarchy at {self.root} has "
                                  "no cpu controller")
            control = self.root / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                self._write(control, "+cpu")
                self.enabled_cpu = True
        elif not (self.base / "cpu.cfs_quota_us").exists():
            raise ConfigError(f"--slowdown cpu needs the cgroup cpu controller: none at "
                              f"{self.base} (cgroup v1) nor {self.root / 'cgroup.controllers'} "
                              "(cgroup v2)")

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir(exist_ok=True)
        except OSError as error:
            raise ConfigError(f"--slowdown cpu: cannot create cgroup {path}: {error.strerror} "
                              f"({_why(error)})") from None

    def _set_quota(self, path: Path, share: float) -> None:
        if self.v2:
            self._write(path / "cpu.max", f"{round(share * _V2_PERIOD_US)} {_V2_PERIOD_US}")
        else:
            try:
                period = int((path / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                raise ConfigError(f"--slowdown cpu: {path} has no readable cpu.cfs_period_us: "
                                  f"{self.base} is not a cgroup cpu hierarchy") from None
            self._write(path / "cpu.cfs_quota_us", str(round(share * period)))

    @staticmethod
    def _write(path: Path, value: str) -> None:
        try:
            path.write_text(value + "\n")
        except OSError as error:
            raise ConfigError(f"--slowdown cpu: the kernel refuses {value!r} in {path}: "
                              f"{error.strerror} ({_why(error)})") from None


def _runs(pid: int) -> bool:
    """Whether process `pid` exists (another user's, or a zombie, does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _why(error: OSError) -> str:
    """What a refusal usually means, for the one line the user reads."""
    if error.errno in (errno.EACCES, errno.EPERM):
        return "needs root, or a cgroup delegated to this user" if os.geteuid() else \
            "not permitted in this container"
    if error.errno == errno.EROFS:
        return "the cgroup file system is mounted read-only"
    if error.errno == errno.ENOENT:
        return "no such cgroup hierarchy"
    if error.errno == errno.EINVAL:
        return "a value this kernel does not take; a quota's minimum is 1 ms per period"
    return "the kernel refused it"
