"""Prague's options (`--group-size`, `--schedule`, `--gg-policy`, `--group-buffer`, ...), their
checks, and the Group Generator they configure."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError
from hetsync.protocols.option_field import option
from hetsync.protocols.prague.group_generator import POLICIES, GroupGeneratorCore
from hetsync.protocols.prague.static_schedule import static_schedule, validate_period

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["GROUP_SIZE", "PREDUCE_KINDS", "Options", "check", "group_generator", "group_size",
           "tolerate_loss"]

GROUP_SIZE = 3
"""Workers per group unless `--group-size` says (the paper does not give its value)."""

#: The P-Reduce implementations (`--preduce`; hetsync.protocols.prague.preduce builds them).
PREDUCE_KINDS = ("auto", "mesh", "ring", "leader", "subgroup")


@dataclass
class Options:
    group_size: int | None = option(None, at_least=1, default_text=f"{GROUP_SIZE}, or every "
                                    "worker where there are fewer",
                                    help="Prague: workers per group")
    schedule: str = option("random", choices=("random", "static"), help="Prague: random (Group "
                           "Generator) or static (fixed periodic partitions)")
    gg_policy: str = option("ready", choices=POLICIES, help="Prague: ready (groups of waiting "
                            "workers) or random (the paper's)")
    """Ready was measured fastest."""
    group_buffer: bool = option(False, help="Prague: Group Buffer (fewer conflicts; see "
                                "--group-buffer-mode)")
    group_buffer_mode: str = option("queue", choices=("queue", "batch"), help="Prague: queue "
                                    "(recommended) or batch reading of Group Buffer")
    group_division: int = option(1, at_least=1, help="Prague: Group Division, groups form "
                                 "within K divisions")
    ready_wait: float = option(20.0, at_least=0, at_most=60_000, finite=True,
                               help="Prague, --gg-policy "
                               "ready: ms to wait for a full group (at most a minute)")
    """Then the Group Generator groups whoever waits."""
    preduce: str = option("auto", choices=PREDUCE_KINDS, help="Prague: P-Reduce "
                          "implementation: auto (by the network model; without one, mesh under "
                          "4 MiB and ring from there), mesh, ring, leader or "
                          "subgroup")
    """Auto: on a free network mesh under 4 MiB, ring from there (`preduce.free_network_kind`)."""
    overlap: bool = option(True, help="Prague (Group Generator): P-Reduces run beside the next "
                           "step's compute (averages land one step late)")
    """As D-PSGD's; measured sooner to the target, and 94-97 % of the ideal throughput against
    78-86 % between steps; the static schedule ignores it."""
    group_lag: int = option(0, at_least=0, help="Prague, --overlap: steps a worker may run on "
                            "past its previous group before it waits for it (no merge, no "
                            "request meanwhile)")
    """0 waits a step later, as D-PSGD; with a slow member, a lag keeps its partners computing
    (PragueWorkerCore's module doc)."""
    workers_per_node: int | None = option(None, default_text="the power-of-two schedule",
                                          help="Prague, --schedule static: node size "
                                          "(node-aware schedule)")


def group_size(config: RunOptions) -> int:
    """Workers per group: `--group-size`, else `GROUP_SIZE` where there are that many workers
    (two workers run in pairs, not refused)."""
    given = config.group_size
    return given if given is not None else min(GROUP_SIZE, config.workers)


def group_generator(config: RunOptions) -> GroupGeneratorCore:
    """The Group Generator's core for `config` (seeded by the run's seed)."""
    return GroupGeneratorCore(
        config.workers, group_size(config), random.Random(f"prague/{config.seed}"),
        policy=config.gg_policy, buffer=config.group_buffer_mode if config.group_buffer else "off",
        divisions=config.group_division,
    )


def check(config: RunOptions) -> None:
    if config.compress != "none" and config.preduce not in ("auto", "mesh"):
        raise ConfigError(f"--compress {config.compress} applies to --preduce mesh or auto (the "
                          f"P-Reduce that sends encoded models), not {config.preduce}")
    if not 1 <= group_size(config) <= config.workers:
        raise ConfigError(f"--group-size must be in 1..{config.workers} (the number of "
                          f"workers) (got {config.group_size})")
    if config.group_lag and (not config.overlap or config.schedule == "static"):
        raise ConfigError("--group-lag applies to P-Reduces beside the compute (--overlap, "
                          "with the Group Generator): drop --no-overlap or --schedule static")
    if config.schedule == "static":
        per_node = config.workers_per_node
        if per_node is not None and per_node < 1:
            raise ConfigError(f"--workers-per-node must be >= 1 (got {per_node})")
        if per_node is not None and config.workers % per_node:
            raise ConfigError(f"--workers-per-node {per_node} does not divide --workers "
                              f"{config.workers} into whole nodes")
        validate_period(config.workers, static_schedule(config.workers, per_node))
        return
    most = config.workers // group_size(config)
    if not 1 <= config.group_division <= most:
        raise ConfigError(f"--group-division must be in 1..{most}, so that each of its "
                          f"divisions of the {config.workers} workers holds a group of "
                          f"{group_size(config)} (got {config.group_division})")
    if config.group_buffer and config.gg_policy != "random":
        raise ConfigError("--group-buffer applies to --gg-policy random (ready groups never "
                          "conflict): add --gg-policy random")
    try:
        group_generator(config)
    except ValueError as error:
        raise ConfigError(f"prague: {error}") from None


def tolerate_loss(config: RunOptions) -> frozenset[int]:
    """`--on-failure continue`: the Group Generator stops putting a lost worker in groups, and
    a group it was in finishes without it; rank 0, which hosts the Group Generator, cannot be
    lost. A static schedule has every worker in fixed groups: it cannot go on."""
    if config.schedule == "static":
        raise ConfigError("--on-failure continue: --schedule static has every worker in fixed "
                          "groups; use the Group Generator (--schedule random)")
    if config.backend == "nccl":
        raise ConfigError("--on-failure continue: Prague's P-Reduce would run on NCCL, whose "
                          "groups cannot go on without a lost member; use --backend gloo")
    return frozenset({0})
