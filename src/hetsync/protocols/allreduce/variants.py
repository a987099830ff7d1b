"""All-Reduce's named variants (`hetsync.protocols.variant`)."""

from hetsync.protocols.variant import NamedVariant

VARIANTS = (NamedVariant("allreduce", default=True, conserving=True),)
