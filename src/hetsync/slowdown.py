"""Slowdown injection: which iterations of which worker run slower, and by how much.

Pure logic (no sleeping here): `SlowdownSpec.factor(rank, iteration)` says how many times the
normal step time an iteration takes; `pacing()` turns that into the padding and delay to sleep.
Random slowdowns are drawn from a generator seeded by (seed, rank, iteration), so a run is
reproducible whatever order the workers query it in. `cpu:` slowdowns are real, not emulated:
the launcher has the kernel cap those workers' CPU time (hetsync.launch.cpu_quota), so their
factor here is 1 (nothing is slept); `emulated()` turns them into the factor they stand for
where there is no kernel to do it (the simulator).
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hetsync.affinity import pin_process
from hetsync.errors import ConfigError
from hetsync.user_files import read_user_text

__all__ = ["ENV_CPU_CGROUP", "SlowdownSpec", "join_cpu_quota", "parse_slowdown", "pacing"]

#: Where the launcher names a `cpu:` straggler's quota cgroup (its `cgroup.procs` file). The
#: worker joins it as its training starts: its start-up (importing torch, loading the data,
#: building the model; most of a minute at a quarter core) runs at full speed, since every
#: slowdown acts on iterations, and a suite's straggler run is not a minute longer.
ENV_CPU_CGROUP = "HETSYNC_CPU_CGROUP"
#: The largest slowdown factor: a worker 1000 times slower is as good as stopped, and a
#: sleep of an infinite or overflowing time would fail inside the worker.
MAX_FACTOR = 1000.0

_FORMS = ("none, deterministic:ranks=R[+R...],factor=F, random:p=P,factor=F, "
          "cpu:ranks=R[+R...],share=S or trace:FILE")


@dataclass(frozen=True)
class SlowdownSpec:
    """A parsed `--slowdown` value."""

    kind: str
    ranks: frozenset[int] = frozenset()
    factor_value: float = 1.0
    p: float = 0.0
    share: float = 1.0
    """cpu: the share of one core the kernel gives each of `ranks`."""
    seed: int = 0
    trace: dict[tuple[int, int], float] = field(default_factory=dict)
    text: str = "none"

    def factor(self, rank: int, iteration: int) -> float:
        """How many times its normal time `iteration` (counted from 1) of `rank` takes."""
        if self.kind == "deterministic":
            return self.factor_value if rank in self.ranks else 1.0
        if self.kind == "random":
            draw = random.Random(f"hetsync/{self.seed}/{rank}/{iteration}").random()
            return self.factor_value if draw < self.p else 1.0
        if self.kind == "trace":
            return self.trace.get((rank, iteration), 1.0)
        return 1.0

    def mean_factor(self, rank: int) -> float:
        """The factor `rank`'s iterations take on average (a trace: over its listed ones)."""
        if self.kind == "deterministic":
            return self.factor(rank, 1)
        if self.kind == "random":
            return 1.0 + self.p * (self.factor_value - 1.0)
        if self.kind == "trace":
            listed = [f for (r, _), f in self.trace.items() if r == rank]
            return sum(listed) / len(listed) if listed else 1.0
        return 1.0

    def emulated(self) -> SlowdownSpec:
        """This spec with a `cpu:` share S as the deterministic factor 1/S it stands for."""
        if self.kind != "cpu":
            return self
        return SlowdownSpec(kind="deterministic", ranks=self.ranks,
                            factor_value=1.0 / self.share, text=self.text)

    def check_ranks(self, workers: int) -> None:
        """Raise ConfigError if the spec names a rank that does not exist."""
        named = set(self.ranks) | {rank for rank, _ in self.trace}
        bad = sorted(r for r in named if r >= workers)
        if bad:
            raise ConfigError(
                f"--slowdown names rank {bad[0]}, but there are only {workers} workers "
                f"(ranks 0..{workers - 1})"
            )


def join_cpu_quota(env: Mapping[str, str] = os.environ) -> None:
    """Move this process (all its threads) into the quota cgroup the launcher named, if any;
    a refusal is one line that names the cgroup.

    Joining a cgroup whose `cpuset` controller is on (cgroup v2 where the parent enables
    it, as on the lent 16-core machines) resets the joining threads' affinity to that
    cpuset's cores, all of the machine's, on kernels before 6.2 (later ones keep what
    `sched_setaffinity` asked): a pinned straggler could then run on the other workers'
    cores. Its threads are put back on the cores it had."""
    procs = env.get(ENV_CPU_CGROUP)
    if not procs:
        return
    cores = os.sched_getaffinity(0)
    try:
        Path(procs).write_text(f"{os.getpid()}\n")
    except OSError as error:
        raise RuntimeError(f"--slowdown cpu: could not join the quota cgroup "
                           f"{Path(procs).parent}: {error.strerror or error}") from None
    pin_process(cores)


def pacing(compute_s: float, step_time_s: float, factor: float) -> tuple[float, float]:
    """Return (padding, injected delay) in seconds for one iteration.

    The padding brings the real compute time up to the emulated step time; a slowed iteration
    then takes `factor` times that, so the delay is (factor - 1) x the padded step.
    """
    base = max(compute_s, step_time_s)
    return base - compute_s, (factor - 1.0) * base


def parse_slowdown(text: str, seed: int = 0) -> SlowdownSpec:
    """Parse a `--slowdown` value; raise ConfigError naming what is wrong."""
    text = text.strip()
    kind, _, rest = text.partition(":")
    if kind == "none" and not rest:
        return SlowdownSpec(kind="none")
    if kind == "trace":
        return _parse_trace(rest, text)
    if kind not in ("deterministic", "random", "cpu"):
        raise ConfigError(f"bad --slowdown {text!r}: expected {_FORMS}")
    params = _key_values(rest, text)
    if kind == "cpu":
        return _parse_cpu(params, text)
    factor = _number(params.pop("factor", None), "factor", text)
    if not 1 <= factor <= MAX_FACTOR:
        raise ConfigError(f"bad --slowdown {text!r}: factor must be in [1, {MAX_FACTOR:g}] "
                          f"(got {factor:g})")
    if kind == "deterministic":
        ranks = _ranks(params, text)
        _no_extra(params, text)
        return SlowdownSpec(kind=kind, ranks=ranks, factor_value=factor, text=text)
    p = _number(params.pop("p", None), "p", text)
    if not 0 <= p <= 1:
        raise ConfigError(f"bad --slowdown {text!r}: p must be in [0, 1] (got {p:g})")
    _no_extra(params, text)
    return SlowdownSpec(kind=kind, factor_value=factor, p=p, seed=seed, text=text)


def _parse_cpu(params: dict[str, str], text: str) -> SlowdownSpec:
    ranks = _ranks(params, text)
    share = _number(params.pop("share", None), "share", text)
    if not 0 < share <= 1:
        raise ConfigError(f"bad --slowdown {text!r}: share must be in (0, 1], a share of one "
                          f"core (got {share:g})")
    _no_extra(params, text)
    return SlowdownSpec(kind="cpu", ranks=ranks, share=share, text=text)


def _ranks(params: dict[str, str], text: str) -> frozenset[int]:
    ranks_text = params.pop("ranks", None)
    if ranks_text is None:
        raise ConfigError(f"bad --slowdown {text!r}: missing ranks=R[+R...]")
    return frozenset(_rank(r, text) for r in ranks_text.split("+"))


def _key_values(rest: str, text: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise ConfigError(f"bad --slowdown {text!r}: {item!r} is not key=value")
        params[key.strip()] = value.strip()
    return params


def _number(value: str | None, name: str, text: str) -> float:
    if value is None:
        raise ConfigError(f"bad --slowdown {text!r}: missing {name}=")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"bad --slowdown {text!r}: {name}={value} is not a number") from None
    if not math.isfinite(number):
        raise ConfigError(f"bad --slowdown {text!r}: {name}={value} is not a finite number")
    return number


def _rank(value: str, text: str) -> int:
    if not value.strip().isdigit():
        raise ConfigError(f"bad --slowdown {text!r}: rank {value!r} is not a non-negative integer")
    return int(value)


def _no_extra(params: dict[str, str], text: str) -> None:
    if params:
        raise ConfigError(f"bad --slowdown {text!r}: unknown key {sorted(params)[0]!r}")


def _parse_trace(path_text: str, text: str) -> SlowdownSpec:
    content = read_user_text(path_text, f"bad --slowdown {text!r}: trace file")
    path = Path(path_text)
    trace: dict[tuple[int, int], float] = {}
    for line_no, row in enumerate(csv.reader(content.splitlines()), start=1):
        if not row or row[0].strip().startswith("#") or (line_no == 1 and row[0] == "rank"):
            continue
        try:
            rank, iteration, factor = int(row[0]), int(row[1]), float(row[2])
        except (ValueError, IndexError):
            raise ConfigError(
                f"bad trace {path}: line {line_no} is not 'rank,iteration,factor'"
            ) from None
        if rank < 0 or iteration < 1 or not 1 <= factor <= MAX_FACTOR:
            raise ConfigError(
                f"bad trace {path}: line {line_no} needs rank >= 0, iteration >= 1, "
                f"factor in [1, {MAX_FACTOR:g}]"
            )
        trace[(rank, iteration)] = factor
    return SlowdownSpec(kind="trace", trace=trace, text=text)
