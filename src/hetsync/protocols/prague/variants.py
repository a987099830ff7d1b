"""Prague's named variants (`hetsync.protocols.variant`): its policies, the paper's loop, and
every option that changes who waits for whom.

Prague's default P-Reduces beside the next step (`--overlap`); `prague-lag` steps on past a
group a slow member holds up (`--group-lag`); `prague-no-overlap` and `prague-paper` run them
between steps (`--no-overlap`), the paper's loop, which has its own worker core.
"""

from hetsync.protocols.variant import NamedVariant

#: What `--overlap` (Prague's default) makes of a Prague variant: not the paper's update.
OVERLAPPED = ("Prague with {}, overlapped: D-PSGD's combine-then-adapt update with "
              "one-step-stale averages (docs/hop-prague.md)")
_RANDOM = {"gg_policy": "random"}
#: The Prague paper's loop: random groups, Group Buffer as the docs read it, and the P-Reduce
#: between steps (members leave it holding the group average).
_PAPER = {**_RANDOM, "group_buffer": True, "overlap": False}
_BUFFER = {**_RANDOM, "group_buffer": True}
_LOSE1 = {"on_failure": "continue"}

VARIANTS = (
    # The default: groups of ready workers, P-Reduces beside the next step's compute.
    NamedVariant("prague", description=OVERLAPPED.format("ready groups"), default=True,
                 conserving=True, fault_fuzz=True),
    NamedVariant("prague-lag", {"group_lag": 12}, OVERLAPPED.format(
        "ready groups, up to 12 steps on past a group not done"), conserving=True,
        fault_fuzz=True),
    NamedVariant("prague-no-overlap", {"overlap": False}, "Prague's ready groups, P-Reduce "
                 "between steps (the default before issue 15)", fuzz=False, fault_fuzz=True),
    NamedVariant("prague-static", {"schedule": "static"}, OVERLAPPED.format("static schedule"),
                 conserving=True),
    NamedVariant("prague-random", _RANDOM, OVERLAPPED.format("random groups"), conserving=True),
    NamedVariant("prague-paper", _PAPER, "the Prague paper's loop: random groups, Group Buffer, "
                 "P-Reduce between steps", conserving=True),
    NamedVariant("prague-paper-overlap", _BUFFER, OVERLAPPED.format(
        "the paper's random groups + Group Buffer"), conserving=True),
    NamedVariant("prague-division2", {**_RANDOM, "group_division": 2},
                 OVERLAPPED.format("random groups, Group Division 2"), fuzz=False),
    # The simulator fuzz's name for prague-no-overlap.
    NamedVariant("prague-between", {"overlap": False}, conserving=True, bench=False),
    NamedVariant("prague-batch", {**_BUFFER, "group_buffer_mode": "batch"}, conserving=True,
                 bench=False),
    # The fault fuzz's name for prague-paper-overlap (its replays draw by label).
    NamedVariant("prague-buffer", _BUFFER, fuzz=False, fault_fuzz=True, bench=False),
    NamedVariant("prague-lose1", _LOSE1, bench=False),
    NamedVariant("prague-between-lose1", {"overlap": False, **_LOSE1}, bench=False),
    NamedVariant("prague-paper-lose1", {**_PAPER, **_LOSE1}, bench=False),
)
