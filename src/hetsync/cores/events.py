"""What the protocol cores share of their values: how each event and decision is declared, and
the training loop's two events that several cores take.

Events and decisions are frozen, slotted and keyword-only (h11's rule): a value cannot change
after a core saw it, and every field is named where it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FROZEN", "ComputeFinished", "IterationStarted"]

#: The dataclass settings of every event and decision: `@dataclass(**FROZEN)`.
FROZEN: dict[str, Any] = {"frozen": True, "slots": True, "kw_only": True}


@dataclass(**FROZEN)
class IterationStarted:
    """Iteration `iteration` begins: its gradient is computed on the current model."""

    iteration: int


@dataclass(**FROZEN)
class ComputeFinished:
    """The gradient of `iteration` is computed; `wants_stop`: this worker's stop conditions met
    (D-PSGD votes on the stop with its exchange; the others agree on it elsewhere)."""

    iteration: int
    wants_stop: bool = False
