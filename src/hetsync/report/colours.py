"""One colour per protocol family, the same in every figure hetsync draws.

A figure that numbered its lines `C0, C1, ...` gave a protocol whatever colour its position
drew, so one protocol changed colour between two figures of one report. Here the colour is
the family's (the label's leading name, else the run's protocol); variants of a family keep
its colour and differ by line style and marker, or by a shade where a figure fills areas.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from matplotlib.colors import to_hex, to_rgb

__all__ = ["FAMILY_COLOURS", "OTHER_COLOUR", "Style", "family", "protocol_colour",
           "protocol_styles", "rank_shades", "shade"]

#: Each family's colour (tab10): related families get neighbouring hues, none is grey.
FAMILY_COLOURS: Mapping[str, str] = {
    "allreduce": "tab:blue", "ddp": "tab:cyan", "ps": "tab:brown", "dpsgd": "tab:olive",
    "adpsgd": "tab:orange", "hop": "tab:green", "prague": "tab:purple",
    "localsgd": "tab:pink", "diloco": "tab:red",
}
#: A label of no known family (a reference run, a user's own name without a protocol).
OTHER_COLOUR = "tab:gray"

_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: A variant's shade: 0 the family's colour, > 0 towards white, < 0 towards black.
_SHADES = (0.0, 0.45, -0.4, 0.7, -0.6, 0.25, -0.2, 0.85)
_LEADING_NAME = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Style:
    """How one label is drawn: `colour` for lines and markers, `fill` for bars and points
    that tell a family's variants apart by shade."""

    colour: str
    linestyle: str | tuple[int, tuple[int, ...]]
    marker: str
    fill: str


def family(label: str, protocol: str | None = None) -> str | None:
    """The family a label belongs to ("prague-lag" -> "prague", "ps-sync" -> "ps"), else the
    protocol's; None if neither names one."""
    for name in (label, protocol or ""):
        match = _LEADING_NAME.match(name.lower())
        if match and match.group() in FAMILY_COLOURS:
            return match.group()
    return None


def shade(colour: str, amount: float) -> str:
    """`colour` mixed towards white (amount > 0) or black (amount < 0), as hex."""
    rgb = to_rgb(colour)
    if amount >= 0:
        return to_hex(tuple(c + (1 - c) * amount for c in rgb))
    return to_hex(tuple(c * (1 + amount) for c in rgb))


def protocol_colour(label: str, protocol: str | None = None) -> str:
    """The hex colour of a label's family (grey if it has none)."""
    name = family(label, protocol)
    return to_hex(FAMILY_COLOURS[name] if name else OTHER_COLOUR)


def protocol_styles(labels: Iterable[str],
                    protocols: Mapping[str, str] | None = None) -> dict[str, Style]:
    """A style per distinct label: the family's colour; the label that is the family's own
    name drawn plain (solid, circles, the colour itself), the other variants numbered in
    sorted order, so that a figure's style of a label depends on which labels it has, never
    on their order. `protocols` maps a label to its run's protocol, for labels of no family."""
    protocols = protocols or {}
    by_family: dict[str | None, list[str]] = {}
    for label in dict.fromkeys(labels):
        by_family.setdefault(family(label, protocols.get(label)), []).append(label)
    styles = {}
    for name, members in by_family.items():
        colour = to_hex(FAMILY_COLOURS[name] if name else OTHER_COLOUR)
        variants = sorted(m for m in members if m != name)
        for label in members:
            i = 0 if label == name else 1 + variants.index(label)
            styles[label] = Style(colour, _LINESTYLES[i % len(_LINESTYLES)],
                                  _MARKERS[i % len(_MARKERS)],
                                  shade(colour, _SHADES[i % len(_SHADES)]))
    return styles


def rank_shades(colour: str, ranks: int) -> list[str]:
    """`ranks` shades of one protocol's colour, dark to light, for a line per worker."""
    if ranks <= 1:
        return [to_hex(colour)] * ranks
    return [shade(colour, -0.5 + 1.1 * r / (ranks - 1)) for r in range(ranks)]
