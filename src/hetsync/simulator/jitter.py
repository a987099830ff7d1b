"""Random delays for fuzzing: every compute and every message takes a random extra time.

Messages keep the order of their channel (a sender's messages to one receiver never overtake
each other, as on the TCP connections real runs use), since the protocols rely on FIFO
channels; everything else may reorder. Drawn from one seeded generator, so a failing
schedule replays from its seed.
"""

from __future__ import annotations

import random

__all__ = ["Jitter"]


class Jitter:
    """Extra compute time (x U(1 - spread, 1 + spread)) and message delay (exponential)."""

    def __init__(self, seed: int, message_s: float, spread: float = 0.9) -> None:
        self.rng = random.Random(seed)
        self.message_s, self.spread = message_s, spread
        self._last: dict[tuple[int, int], float] = {}

    def compute_factor(self) -> float:
        return self.rng.uniform(1.0 - self.spread, 1.0 + self.spread)

    def arrive(self, src: int, dst: int, at: float) -> float:
        """A message from `src` to `dst` due at `at` arrives later, but not before the one
        sent before it on the same channel."""
        at += self.rng.expovariate(1.0 / self.message_s)
        key = (src, dst)
        at = max(at, self._last.get(key, at))
        self._last[key] = at
        return at
