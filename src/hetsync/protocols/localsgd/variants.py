"""Local SGD's named variants (see hetsync.protocols.variant)."""

from __future__ import annotations

from hetsync.protocols.variant import NamedVariant

__all__ = ["VARIANTS"]

# Both conserve the sum of the models with lr 0: the mean does, and DiLoCo's pseudo-gradients
# sum to zero when no worker moved from its anchor, so its outer steps cancel out in the sum.
VARIANTS = (
    NamedVariant("localsgd", default=True, conserving=True),
    NamedVariant("diloco", {"outer_optimizer": "nesterov"}, conserving=True,
                 description="DiLoCo: local SGD with an outer Nesterov step (lr 0.7, "
                 "momentum 0.9) on the averaged pseudo-gradient"),
)
