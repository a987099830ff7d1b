"""`--fault SPEC`: failures injected on purpose, for tests and experiments.

A spec is one or more faults separated by ";":

    kill:rank=3,at=20s         the launcher kills worker 3 (SIGKILL) 20 s into the run
    stop:rank=2,at=10s,for=5s  the launcher stops worker 2 (SIGSTOP), and resumes it 5 s later
                               (without `for`, it stays stopped: a hang the monitor must name)
    raise:rank=1,at=40         worker 1 raises an error in iteration 40
    hang:rank=1,at=40          worker 1 blocks for good in iteration 40
    delay-messages:p=0.05,ms=200[,rank=R]
                               each message a worker (or only worker R) sends is held back
                               200 ms with probability 0.05, from the start of the run

`at` is seconds into the run with a unit (`20s`, `500ms`), or an iteration without one.
`kill` and `stop` come from outside the worker, as a node failure or a debugger would, so
they are the launcher's; `raise` and `hang` come from inside the training loop. Parsing is
pure; `FaultPlan` says what is due, and the launcher and the worker act on it.

`delay-messages` holds a message back in the thread that sends it, just before it is posted
(as a congested queue in front of the link would): a protocol's point-to-point message, a
P-Reduce or a collective (this worker's part of it) counts as one message. The draws come
from a generator seeded by the run's seed and the rank, so a run replays its delays.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from hetsync.errors import ConfigError

__all__ = ["Fault", "FaultPlan", "MessageDelay", "parse_faults"]

KINDS = ("kill", "stop", "raise", "hang", "delay-messages")
_FORM = ("kill:rank=R,at=T | stop:rank=R,at=T[,for=T] | raise:rank=R,at=I | hang:rank=R,at=I "
         "| delay-messages:p=P,ms=M[,rank=R] (T: seconds with a unit, 20s or 500ms; I: an "
         "iteration), several joined by ';'")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    at_s: float | None = None
    """Seconds into the run (kill, stop; raise and hang may use it too)."""
    at_iteration: int | None = None
    for_s: float | None = None
    """stop: seconds until the worker is resumed; None: never."""
    p: float = 0.0
    """delay-messages: the chance that a message is held back."""
    delay_s: float = 0.0
    """delay-messages: how long."""

    @property
    def external(self) -> bool:
        """Done to the worker's process by the launcher (kill, stop), not inside it."""
        return self.kind in ("kill", "stop")


def _time(text: str, spec: str) -> float:
    for unit, scale in (("ms", 1e-3), ("s", 1.0)):
        if text.endswith(unit):
            try:
                value = float(text[: -len(unit)]) * scale
            except ValueError:
                break
            if value >= 0:
                return value
            break
    raise ConfigError(f"--fault {spec!r}: {text!r} is not a time such as 20s or 500ms")


def _params(rest: str, keys: tuple[str, ...], spec: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in keys:
            named = ", ".join(k + "=" for k in keys[:-1]) + f" or {keys[-1]}="
            raise ConfigError(f"--fault {spec!r}: {item!r} is not {named} (forms: {_FORM})")
        params[key] = value
    return params


def _delay(rest: str, spec: str) -> Fault:
    params = _params(rest, ("p", "ms", "rank"), spec)
    try:
        p, ms = float(params["p"]), float(params["ms"])
    except KeyError:
        raise ConfigError(f"--fault {spec!r}: delay-messages needs p= and ms= "
                          f"(forms: {_FORM})") from None
    except ValueError:
        raise ConfigError(f"--fault {spec!r}: p= and ms= must be numbers") from None
    if not 0 <= p <= 1 or not 0 <= ms < float("inf"):
        raise ConfigError(f"--fault {spec!r}: p= must be in [0, 1] and ms= >= 0")
    rank = params.get("rank", "-1")
    if rank != "-1" and not rank.isdigit():
        raise ConfigError(f"--fault {spec!r}: rank={rank!r} is not a rank")
    return Fault("delay-messages", int(rank), p=p, delay_s=ms / 1000)


def _parse_one(part: str, spec: str) -> Fault:
    kind, _, rest = part.partition(":")
    if kind not in KINDS:
        raise ConfigError(f"--fault {spec!r}: unknown fault {kind!r} (forms: {_FORM})")
    if kind == "delay-messages":
        return _delay(rest, spec)
    params = _params(rest, ("rank", "at", "for"), spec)
    if "rank" not in params or "at" not in params:
        raise ConfigError(f"--fault {spec!r}: {kind} needs rank= and at= (forms: {_FORM})")
    if not params["rank"].isdigit():
        raise ConfigError(f"--fault {spec!r}: rank={params['rank']!r} is not a rank")
    at = params["at"]
    at_s = at_iteration = None
    if at.isdigit():
        if kind in ("kill", "stop"):
            raise ConfigError(f"--fault {spec!r}: {kind} happens at a time (at=20s), not an "
                              "iteration: the launcher does it from outside the worker")
        at_iteration = int(at)
        if at_iteration < 1:
            raise ConfigError(f"--fault {spec!r}: iterations count from 1")
    else:
        at_s = _time(at, spec)
    if "for" in params and kind != "stop":
        raise ConfigError(f"--fault {spec!r}: for= applies to stop only")
    for_s = _time(params["for"], spec) if "for" in params else None
    return Fault(kind, int(params["rank"]), at_s, at_iteration, for_s)


def parse_faults(spec: str) -> list[Fault]:
    """The faults of a `--fault` value ("none": no fault)."""
    if spec in ("", "none"):
        return []
    return [_parse_one(part.strip(), spec) for part in spec.split(";") if part.strip()]


class FaultPlan:
    """Which faults are due: `external_due(elapsed)` for the launcher, `inside_due(...)` for a
    worker's loop. Each fires once; a stop with `for` yields its resumption later."""

    def __init__(self, faults: list[Fault]) -> None:
        self._pending = list(faults)
        self._resume: list[tuple[float, int]] = []

    def external_due(self, elapsed: float) -> list[tuple[str, int]]:
        """(action, rank) pairs to do now: kill, stop or cont."""
        due = [f for f in self._pending if f.external and f.at_s is not None
               and elapsed >= f.at_s]
        actions = []
        for fault in due:
            self._pending.remove(fault)
            actions.append((fault.kind, fault.rank))
            if fault.kind == "stop" and fault.for_s is not None:
                self._resume.append((elapsed + fault.for_s, fault.rank))
        for when, rank in list(self._resume):
            if elapsed >= when:
                self._resume.remove((when, rank))
                actions.append(("cont", rank))
        return actions

    def message_delay(self, rank: int, seed: int) -> MessageDelay | None:
        """The delays of the messages `rank` sends, if a delay-messages fault names them."""
        for fault in self._pending:
            if fault.kind == "delay-messages" and fault.rank in (-1, rank):
                return MessageDelay(fault.p, fault.delay_s, random.Random(f"delay/{seed}/{rank}"))
        return None

    def inside_due(self, rank: int, iteration: int, elapsed: float) -> Fault | None:
        """The raise or hang of `rank` due in `iteration` (or by `elapsed` seconds)."""
        for fault in self._pending:
            if fault.external or fault.kind == "delay-messages" or fault.rank != rank:
                continue
            if (fault.at_iteration is not None and iteration >= fault.at_iteration) or (
                    fault.at_s is not None and elapsed >= fault.at_s):
                self._pending.remove(fault)
                return fault
        return None


@dataclass
class MessageDelay:
    """Holds a message back `delay_s` with probability `p` (see the module doc)."""

    p: float
    delay_s: float
    rng: random.Random

    def __call__(self) -> None:
        if self.rng.random() < self.p:
            time.sleep(self.delay_s)
