"""Hop's named variants (`hetsync.protocols.variant`): every option that changes who waits for
whom, on its default graph, the ring.

Hop's options left unset are resolved per run (`options.Options.for_graph`); every variant but
`hop-auto` sets them all, so that it runs what it ran before those defaults (the docs' figures).
"""

from hetsync.protocols.hop.options import STALE_SKIP
from hetsync.protocols.variant import NamedVariant

#: The paper's Hop: every in-neighbour waited for, each update fresh, no skipping.
_PAPER = {"backup": 0, "staleness": 0, "skip": False, "max_gap": 8, "send_ahead": 0,
          "average_once": False}
_SKIP = {**_PAPER, "backup": 1, "skip": True}

VARIANTS = (
    NamedVariant("hop", _PAPER, "hop, the paper's: every in-neighbour waited for, no skipping "
                 "(--backup 0 --staleness 0 --no-skip)", conserving=True, fault_fuzz=True),
    # `--protocol hop` with no options: on a ring of 3 or more hop-skip, of 2 hop-stale-skip.
    NamedVariant("hop-auto", description="hop with its defaults: a backup worker and skipping "
                 "where every rank has 2 in-neighbours or more, else staleness and skipping",
                 bench=False),
    NamedVariant("hop-notify-ack", {**_PAPER, "hop_mode": "notify-ack"}, conserving=True),
    NamedVariant("hop-backup1", {**_PAPER, "backup": 1}, fuzz=False, fault_fuzz=True),
    NamedVariant("hop-staleness2", {**_PAPER, "staleness": 2}, fuzz=False),
    # On an undirected ring with no backup worker nobody can fall behind: skipping needs one.
    NamedVariant("hop-skip", _SKIP, default=True, fuzz=False),
    # Where no backup worker can be set (a ring of 2), staleness lets a worker go on without
    # its in-neighbour's newest update, and skipping brings a slow one back up: s iterations
    # of staleness carry a worker whose step takes up to s + 1 of its neighbour's (12: the
    # measured choice, docs/notes/real-compute-log.md). A slow worker
    # takes in only the updates it uses (deferred updates), and the fast one averages each of
    # its updates in once, not again every iteration until a newer one comes (average once:
    # the same throughput, a final loss as low as AD-PSGD's; docs/hop-prague.md). Hop's
    # default where no backup worker can be set.
    NamedVariant("hop-stale-skip", {**_PAPER, **STALE_SKIP},
                 "hop, staleness 12, skipping, deferred updates, each update averaged once "
                 "(no backup worker needed)",
                 fault_fuzz=True),
    # The fuzzers' name for hop-skip (the fault fuzz's replays draw by label).
    NamedVariant("hop-backup1-skip", _SKIP, fault_fuzz=True, bench=False),
    # Staleness with a tight gap: the fuzz checks both bounds where they bind.
    NamedVariant("hop-staleness2-gap4", {**_PAPER, "staleness": 2, "max_gap": 4}, bench=False),
    NamedVariant("hop-lose1", {**_PAPER, "backup": 1, "on_failure": "continue"}, bench=False),
)
