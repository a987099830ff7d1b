"""DDP's named variants (`hetsync.protocols.variant`). Not fuzzed: its simulation is
All-Reduce's, which the fuzz runs as `allreduce`."""

from hetsync.protocols.variant import NamedVariant

VARIANTS = (NamedVariant("ddp", default=True, fuzz=False),)
