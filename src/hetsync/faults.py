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
    slow-link:ranks=2[+5],at=20s,bandwidth=100Mbit
                               from 20 s on, every message to or from worker 2 (and 5) is
                               charged at 100 Mbit/s on the emulated network (`--network`),
                               in real runs and simulated ones alike

`at` is seconds into the run with a unit (`20s`, `500ms`), or an iteration without one.
`kill` and `stop` come from outside the worker, as a node failure or a debugger would, so
they are the launcher's; `raise` and `hang` come from inside the training loop. Parsing is
pure; `FaultPlan` says what is due, and the launcher and the worker act on it.

Each kind is one class here (`Kill`, `Stop`, `Raise`, `Hang`, `DelayMessages`) that carries all
of it: its form, how its parameters parse, where it acts (`WHERE`: the launcher, the training
loop or the sending thread), how (the signals the launcher sends, or what the loop does) and
whether `hetsync simulate` models it. A new kind is a new class in `KINDS`; the launcher, the
worker and the simulator ask the fault, never its name.

`delay-messages` holds a message back in the thread that sends it, just before it is posted
(as a congested queue in front of the link would): a protocol's point-to-point message, a
P-Reduce or a collective (this worker's part of it) counts as one message. The draws come
from a generator seeded by the run's seed and the rank, so a run replays its delays.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

from hetsync.errors import ConfigError
from hetsync.network.model import LinkChange
from hetsync.network.spec import parse_rate

__all__ = ["KINDS", "DelayMessages", "Fault", "FaultPlan", "Hang", "Kill", "MessageDelay",
           "Raise", "SlowLink", "Stop", "link_changes", "parse_faults"]

Where = Literal["launcher", "loop", "sender", "network"]


@dataclass(frozen=True)
class Fault:
    """One fault: a rank (-1: every worker) and when. Subclasses are the kinds."""

    rank: int
    at_s: float | None = None
    """Seconds into the run (kill, stop; raise and hang may use it too)."""
    at_iteration: int | None = None

    NAME: ClassVar[str]
    FORM: ClassVar[str]
    WHERE: ClassVar[Where]
    SIMULATED: ClassVar[bool] = False
    """Modelled by `hetsync simulate` (a lost worker), not only by real runs."""
    RESUMES: ClassVar[bool] = False
    """Takes `for=`: how long until it is undone."""

    @property
    def kind(self) -> str:
        return self.NAME

    @classmethod
    def parse(cls, rest: str, spec: str) -> Fault:
        """The fault from the text after `kind:`; ConfigError in one line if it is wrong."""
        params = _params(rest, ("rank", "at", "for"), spec)
        if "rank" not in params or "at" not in params:
            raise ConfigError(f"--fault {spec!r}: {cls.NAME} needs rank= and at= "
                              f"(forms: {_form()})")
        if not params["rank"].isdigit():
            raise ConfigError(f"--fault {spec!r}: rank={params['rank']!r} is not a rank")
        if "for" in params and not cls.RESUMES:
            resuming = ", ".join(kind.NAME for kind in KINDS.values() if kind.RESUMES)
            raise ConfigError(f"--fault {spec!r}: for= applies to {resuming} only")
        at_s, at_iteration = _at(params["at"], cls.WHERE == "launcher", cls.NAME, spec)
        resume = _time(params["for"], spec) if "for" in params else None
        return cls._make(int(params["rank"]), at_s, at_iteration, resume)

    @classmethod
    def _make(cls, rank: int, at_s: float | None, at_iteration: int | None,
              for_s: float | None) -> Fault:
        return cls(rank, at_s, at_iteration)

    def signals(self) -> list[tuple[float, signal.Signals]]:
        """A launcher's fault: (seconds into the run, signal) to send its worker."""
        raise NotImplementedError(f"{self.NAME} is not done by the launcher")

    def act(self) -> None:
        """A training loop's fault: what the worker does when it is due."""
        raise NotImplementedError(f"{self.NAME} is not done in the training loop")


@dataclass(frozen=True)
class Kill(Fault):
    NAME = "kill"
    FORM = "kill:rank=R,at=T"
    WHERE = "launcher"
    SIMULATED = True

    def signals(self) -> list[tuple[float, signal.Signals]]:
        assert self.at_s is not None
        return [(self.at_s, signal.SIGKILL)]


@dataclass(frozen=True)
class Stop(Fault):
    for_s: float | None = None
    """Seconds until the worker is resumed; None: never (a hang the monitor must name)."""

    NAME = "stop"
    FORM = "stop:rank=R,at=T[,for=T]"
    WHERE = "launcher"
    RESUMES = True

    @classmethod
    def _make(cls, rank: int, at_s: float | None, at_iteration: int | None,
              for_s: float | None) -> Fault:
        return cls(rank, at_s, at_iteration, for_s)

    def signals(self) -> list[tuple[float, signal.Signals]]:
        assert self.at_s is not None
        resume = [] if self.for_s is None else [(self.at_s + self.for_s, signal.SIGCONT)]
        return [(self.at_s, signal.SIGSTOP), *resume]


@dataclass(frozen=True)
class Raise(Fault):
    NAME = "raise"
    FORM = "raise:rank=R,at=I"
    WHERE = "loop"

    def act(self) -> None:
        raise RuntimeError("injected fault (--fault)")


@dataclass(frozen=True)
class Hang(Fault):
    NAME = "hang"
    FORM = "hang:rank=R,at=I"
    WHERE = "loop"

    def act(self) -> None:
        while True:
            time.sleep(1)


@dataclass(frozen=True)
class DelayMessages(Fault):
    p: float = 0.0
    """The chance that a message is held back."""
    delay_s: float = 0.0
    """How long."""

    NAME = "delay-messages"
    FORM = "delay-messages:p=P,ms=M[,rank=R]"
    WHERE = "sender"

    @classmethod
    def parse(cls, rest: str, spec: str) -> Fault:
        params = _params(rest, ("p", "ms", "rank"), spec)
        try:
            p, ms = float(params["p"]), float(params["ms"])
        except KeyError:
            raise ConfigError(f"--fault {spec!r}: delay-messages needs p= and ms= "
                              f"(forms: {_form()})") from None
        except ValueError:
            raise ConfigError(f"--fault {spec!r}: p= and ms= must be numbers") from None
        if not 0 <= p <= 1 or not 0 <= ms < float("inf"):
            raise ConfigError(f"--fault {spec!r}: p= must be in [0, 1] and ms= >= 0")
        rank = params.get("rank", "-1")
        if rank != "-1" and not rank.isdigit():
            raise ConfigError(f"--fault {spec!r}: rank={rank!r} is not a rank")
        return cls(int(rank), p=p, delay_s=ms / 1000)

    def delay(self, rank: int, seed: int) -> MessageDelay:
        """The delays of the messages `rank` sends: replayed from the run's seed."""
        return MessageDelay(self.p, self.delay_s, random.Random(f"delay/{seed}/{rank}"))


@dataclass(frozen=True)
class SlowLink(Fault):
    """A link that slows down mid-run: the network model's NICs change (`LinkChange`), so
    every charge of every protocol, real or simulated, sees it with no code of theirs."""

    ranks: tuple[int, ...] = ()
    bandwidth: float = 0.0
    """Bytes per second, each way."""

    NAME = "slow-link"
    FORM = "slow-link:ranks=R[+R],at=T,bandwidth=B"
    WHERE = "network"
    SIMULATED = True

    @classmethod
    def parse(cls, rest: str, spec: str) -> Fault:
        params = _params(rest, ("ranks", "at", "bandwidth"), spec)
        if set(params) != {"ranks", "at", "bandwidth"}:
            raise ConfigError(f"--fault {spec!r}: slow-link needs ranks=, at= and bandwidth= "
                              f"(forms: {_form()})")
        ranks = params["ranks"].split("+")
        if not all(r.isdigit() for r in ranks):
            raise ConfigError(f"--fault {spec!r}: ranks={params['ranks']!r} is not ranks "
                              "such as 2 or 2+5")
        if params["at"].isdigit():
            raise ConfigError(f"--fault {spec!r}: slow-link happens at a time (at=20s), not "
                              "an iteration")
        at_s = _time(params["at"], spec)
        rate = parse_rate(params["bandwidth"], f"--fault {spec!r}")
        numbers = tuple(int(r) for r in ranks)
        return cls(max(numbers), at_s, None, numbers, rate)

    def change(self) -> LinkChange:
        assert self.at_s is not None
        return LinkChange(self.ranks, self.at_s, self.bandwidth)


KINDS: dict[str, type[Fault]] = {kind.NAME: kind for kind in (Kill, Stop, Raise, Hang,
                                                             DelayMessages, SlowLink)}


def link_changes(faults: list[Fault]) -> list[LinkChange]:
    """The network changes `--fault slow-link` makes (the network model applies them)."""
    return [fault.change() for fault in faults if isinstance(fault, SlowLink)]


def _form() -> str:
    return (" | ".join(kind.FORM for kind in KINDS.values()) + " (T: seconds with a unit, 20s "
            "or 500ms; I: an iteration), several joined by ';'")


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


def _at(text: str, timed_only: bool, kind: str, spec: str) -> tuple[float | None, int | None]:
    """(seconds, iteration) of `at=`: one of them, as the text says."""
    if not text.isdigit():
        return _time(text, spec), None
    if timed_only:
        raise ConfigError(f"--fault {spec!r}: {kind} happens at a time (at=20s), not an "
                          "iteration: the launcher does it from outside the worker")
    if int(text) < 1:
        raise ConfigError(f"--fault {spec!r}: iterations count from 1")
    return None, int(text)


def _params(rest: str, keys: tuple[str, ...], spec: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in keys:
            named = ", ".join(k + "=" for k in keys[:-1]) + f" or {keys[-1]}="
            raise ConfigError(f"--fault {spec!r}: {item!r} is not {named} (forms: {_form()})")
        params[key] = value
    return params


def parse_faults(spec: str) -> list[Fault]:
    """The faults of a `--fault` value ("none": no fault)."""
    if spec in ("", "none"):
        return []
    faults = []
    for part in filter(None, (part.strip() for part in spec.split(";"))):
        name, _, rest = part.partition(":")
        if name not in KINDS:
            raise ConfigError(f"--fault {spec!r}: unknown fault {name!r} (forms: {_form()})")
        faults.append(KINDS[name].parse(rest, spec))
    return faults


class FaultPlan:
    """Which faults are due: `signals_due(elapsed)` for the launcher, `inside_due(...)` for a
    worker's loop, `message_delay(...)` for its sending threads. Each fires once."""

    def __init__(self, faults: list[Fault]) -> None:
        self._pending = list(faults)
        self._signals = sorted(((when, i, sig, f.rank) for i, f in enumerate(faults)
                                if f.WHERE == "launcher" for when, sig in f.signals()),
                               key=lambda item: item[:2])

    def signals_due(self, elapsed: float) -> list[tuple[signal.Signals, int]]:
        """(signal, rank) pairs the launcher sends now, in the order they fall due."""
        due = [(sig, rank) for when, _, sig, rank in self._signals if elapsed >= when]
        self._signals = [item for item in self._signals if elapsed < item[0]]
        return due

    def message_delay(self, rank: int, seed: int) -> MessageDelay | None:
        """The delays of the messages `rank` sends, if a delay-messages fault names them."""
        for fault in self._pending:
            if isinstance(fault, DelayMessages) and fault.rank in (-1, rank):
                return fault.delay(rank, seed)
        return None

    def inside_due(self, rank: int, iteration: int, elapsed: float) -> Fault | None:
        """The training loop's fault of `rank` due in `iteration` (or by `elapsed` seconds):
        its caller `act()`s on it."""
        for fault in self._pending:
            if fault.WHERE != "loop" or fault.rank != rank:
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
