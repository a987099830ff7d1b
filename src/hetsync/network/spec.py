"""`--network` and `--payload`: what the emulated cluster's links are and what a model weighs.

A network spec is a default link followed by per-rank overrides, separated by ";":

    bandwidth=10Gbit,latency=50us;ranks=3:bandwidth=1Gbit;ranks=5+6:egress=2Gbit

`bandwidth` sets both directions of a worker's NIC, `egress` and `ingress` one each, and
`latency` its one-way latency. Rates are per second, in bits (bit, Kbit, Mbit, Gbit) or bytes
(B, KB, MB, GB), decimal prefixes as network rates are quoted; times in s, ms, us or ns.

A payload is a byte count ("104857600", "100MB", "0.5GB") or a model name from `MODELS`, whose
fp32 parameters it weighs. Parsing is pure: everything here runs before any process starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from hetsync.errors import ConfigError

__all__ = ["MODELS", "Nic", "NetworkSpec", "parse_network", "parse_payload", "parse_rate"]

_RATE_UNITS = {
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}
_SIZE_UNITS = {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20,
               "gib": 2**30}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_KEYS = ("bandwidth", "egress", "ingress", "latency")
_FORM = ("bandwidth=10Gbit,latency=50us[;ranks=R[+R...]:bandwidth=1Gbit] (keys: "
         + ", ".join(_KEYS) + "; rates in bit, Kbit, Mbit, Gbit or B, KB, MB, GB per second; "
         "times in s, ms, us, ns)")

#: Parameter counts of models the papers and users train, for `--payload NAME` (fp32 bytes).
MODELS: dict[str, int] = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "alexnet": 61_100_840,
    "bert-base": 110_000_000,
    "bert-large": 340_000_000,
    "gpt2": 124_439_808,
}


@dataclass(frozen=True)
class Nic:
    """One worker's network interface: bytes per second each way and one-way latency."""

    egress: float
    ingress: float
    latency: float


@dataclass(frozen=True)
class NetworkSpec:
    """A parsed `--network`: the default NIC and the ranks that differ from it."""

    default: Nic
    overrides: dict[int, Nic] = field(default_factory=dict)
    text: str = ""

    def nic(self, rank: int) -> Nic:
        return self.overrides.get(rank, self.default)

    def check_ranks(self, workers: int) -> None:
        bad = sorted(r for r in self.overrides if r >= workers)
        if bad:
            raise ConfigError(f"--network names rank {bad[0]}, but the run has only {workers} "
                              f"workers (ranks 0-{workers - 1})")


def _number(text: str, units: dict[str, float], what: str, option: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-zA-Z]*)(?:/s)?\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in units:
        accepted = ", ".join(u for u in units if u)
        raise ConfigError(f"{option}: cannot read {what} {text!r} (a number with one of: "
                          f"{accepted})")
    value = float(match.group(1)) * units[unit]
    if value <= 0:
        raise ConfigError(f"{option}: {what} {text!r} must be positive")
    return value


def parse_rate(text: str, option: str) -> float:
    """A rate such as 100Mbit, in bytes per second; ConfigError naming `option` if not."""
    return _number(text, _RATE_UNITS, "rate", option)


def _apply(nic: Nic, settings: str, text: str) -> Nic:
    for item in filter(None, (s.strip() for s in settings.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise ConfigError(f"--network {text!r}: unknown setting {item!r}; expected {_FORM}")
        if key == "latency":
            seconds = 0.0 if value.strip() in ("0", "0s") else _number(
                value, _TIME_UNITS, "latency", "--network")
            nic = replace(nic, latency=seconds)
            continue
        rate = _number(value, _RATE_UNITS, "rate", "--network")
        if key in ("bandwidth", "egress"):
            nic = replace(nic, egress=rate)
        if key in ("bandwidth", "ingress"):
            nic = replace(nic, ingress=rate)
    return nic


def parse_network(text: str) -> NetworkSpec | None:
    """The spec `text` describes, or None for "" / "none" (a free network: nothing emulated)."""
    if text.strip().lower() in ("", "none"):
        return None
    sections = [s.strip() for s in text.split(";")]
    if not sections[0] or sections[0].startswith("ranks="):
        raise ConfigError(f"--network {text!r}: start with the default link; expected {_FORM}")
    default = _apply(Nic(float("inf"), float("inf"), 0.0), sections[0], text)
    if default.egress == float("inf") or default.ingress == float("inf"):
        raise ConfigError(f"--network {text!r}: give a bandwidth; expected {_FORM}")
    overrides: dict[int, Nic] = {}
    for section in sections[1:]:
        head, sep, settings = section.partition(":")
        match = re.fullmatch(r"ranks=(\d+(?:\+\d+)*)", head.strip())
        if not sep or match is None:
            raise ConfigError(f"--network {text!r}: cannot read {section!r}; expected {_FORM}")
        for rank in (int(r) for r in match.group(1).split("+")):
            overrides[rank] = _apply(overrides.get(rank, default), settings, text)
    return NetworkSpec(default, overrides, text)


def parse_payload(text: str) -> int | None:
    """Bytes of the declared model: a size, or a name in `MODELS`; None for "" / "none"."""
    name = text.strip().lower()
    if name in ("", "none"):
        return None
    if name in MODELS:
        return MODELS[name] * 4
    if re.fullmatch(r"[a-z][a-z0-9.-]*", name) and not re.fullmatch(r"[0-9.]+[a-z]+", name):
        raise ConfigError(f"--payload: unknown model {text!r}; known: {', '.join(MODELS)}, "
                          "or a size such as 100MB")
    return int(_number(name, _SIZE_UNITS, "size", "--payload"))
