"""The parameter server's named variants (`hetsync.protocols.variant`)."""

from hetsync.protocols.variant import NamedVariant

_BACKUP1 = {"ps_mode": "sync", "ps_backup": 1}

VARIANTS = (
    NamedVariant("ps-sync", {"ps_mode": "sync"}, default=True, fault_fuzz=True),
    NamedVariant("ps-async", {"ps_mode": "async"}, fault_fuzz=True),
    # Synchronous SGD that waits for the fastest n-1 workers (Chen et al. 2016).
    NamedVariant("ps-backup1", _BACKUP1),
    # The fault fuzz's name for ps-backup1 (its replays draw by label).
    NamedVariant("ps-sync-backup1", _BACKUP1, fuzz=False, fault_fuzz=True, bench=False),
    NamedVariant("ps-async-lose1", {"ps_mode": "async", "on_failure": "continue"},
                 bench=False),
    NamedVariant("ps-sync-lose1", {"on_failure": "continue"}, bench=False),
)
