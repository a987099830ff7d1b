"""D-PSGD's named variants (`hetsync.protocols.variant`), on its default graph, the ring."""

from hetsync.protocols.variant import NamedVariant

VARIANTS = (NamedVariant("dpsgd", default=True, conserving=True),)
