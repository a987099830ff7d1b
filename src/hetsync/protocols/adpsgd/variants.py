"""AD-PSGD's named variants (`hetsync.protocols.variant`), on its default graph, the ring."""

from hetsync.protocols.variant import NamedVariant

VARIANTS = (
    NamedVariant("adpsgd", default=True, conserving=True, fault_fuzz=True),
    # A passive worker at most 2 iterations ahead of its clients: no rank starved where
    # serving costs more than computing (8 workers, a 45 MB model), at the price of waiting
    # for a slow client (docs/protocols.md).
    NamedVariant("adpsgd-gap2", {"adpsgd_max_gap": 2},
                 "adpsgd, each passive worker at most 2 iterations ahead of its clients",
                 conserving=True, fault_fuzz=True),
    NamedVariant("adpsgd-lose1", {"on_failure": "continue"}, bench=False),
)
