"""All-Reduce has no options of its own: what it brings to a run beyond its driver.

Its lost workers can rejoin (`--on-failure rejoin`): its core takes a new generation of the
run's membership in the middle of a step (`Regrouped`) and contributes again with the new
divisor, and a worker that is not back goes on out of a smaller generation."""

from __future__ import annotations

__all__ = ["REJOINS"]

#: `--on-failure rejoin` (hetsync.protocols.catalog.REJOIN).
REJOINS = True
