"""AD-PSGD's named variants (`hetsync.protocols.variant`), on its default graph, the ring."""

from hetsync.protocols.variant import NamedVariant

VARIANTS = (
    NamedVariant("adpsgd", default=True, conserving=True, fault_fuzz=True),
    NamedVariant("adpsgd-lose1", {"on_failure": "continue"}, bench=False),
)
