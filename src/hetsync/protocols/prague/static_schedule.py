"""Prague's static group schedules for homogeneous clusters: one period of partitions, no I/O.

Theory of operation. When workers run at the same speed the Group Generator needs no runtime
randomness: step t of every worker uses partition `period[t % len(period)]`, a set of disjoint
groups covering all ranks, so groups of one step never conflict (every member of a group
reaches step t together) and no coordinator is needed. Models mix globally only if the union
of the period's groups connects all ranks; `validate_period` checks both properties.

Two schedules:
- `power_of_two_blocks(world)`, the prototype's (laekov/preduce, commit 2183c05): with P the
  smallest power of two >= world, step p in [0, P) has level j = trailing zeros of p (j =
  log2 P at p = 0) and groups of about 2^j consecutive ranks: one step in two is local only,
  one in four averages pairs, ..., one per period is a full all-reduce. On a power of two this
  is exactly the prototype's aligned blocks. Otherwise level j splits the ranks into
  ceil(world / 2^j) consecutive blocks of near-equal size (sizes differ by at most one, all
  <= 2^j), where the prototype's formula would truncate the last block and leave e.g. rank 8
  of 9 alone at every level but the last: balanced blocks give every rank partners at every
  level j >= 1 while keeping the period and the hierarchy.
- `node_aware(world, per_node)`, generalising the prototype's 4-GPU schedule (commit fb22e76)
  to any node size: step 2l has *representative* local rank l of every node average across
  nodes while the other local ranks of a node average in pairs, taken in local-rank order
  from l + 1 round (one alone if their number is odd, a different one each time); odd steps
  average within each node (fast links). The representative
  rotates over all local ranks (period 2 x per_node), so inter-node traffic leaves from every
  worker in turn; the prototype rotated over local ranks 0 and 1 only. A last node with fewer
  workers takes part in the inter-node groups of the local ranks it has.

Stopping (`StaticStop`). Workers step in lock-step, so all must stop after the same step, or
the first to go on would wait for a group whose members left. A stop every worker foresees,
`max_iterations` K, needs no agreement: all stop after step K. Any other stop (a time limit,
a target loss, a script's request) is known to one worker first; it proposes the step `lead`
ahead, the first proposal wins (the driver's store), and the others must read it before they
pass it. `lead` must exceed how far two workers can drift apart: a worker finishes step t only
with its group, and the period connects all ranks, so a period times the number of workers
bounds it. A proposal at or after K is not made: K comes first for everyone anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "Partition", "StaticStop", "node_aware", "power_of_two_blocks", "split_evenly", "static_group",
    "static_schedule", "validate_period",
]

Partition = tuple[tuple[int, ...], ...]
"""One step: disjoint groups (each sorted) that together cover every rank."""


def split_evenly(items: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """`items` cut into `parts` consecutive runs whose lengths differ by at most one."""
    n = len(items)
    return [tuple(items[b * n // parts : (b + 1) * n // parts]) for b in range(parts)]


def power_of_two_blocks(world: int) -> list[Partition]:
    """One period of the prototype's power-of-two block schedule (see the module doc)."""
    _check_world(world)
    levels = (world - 1).bit_length()
    by_level = [tuple(split_evenly(range(world), -(-world // (1 << level))))
                for level in range(levels + 1)]  # levels + 1 partitions, 2^levels steps
    return [by_level[(p & -p).bit_length() - 1 if p else levels] for p in range(1 << levels)]


def node_aware(world: int, per_node: int) -> list[Partition]:
    """One period of intra-node averaging alternating with rotating inter-node groups."""
    _check_world(world)
    if per_node < 1:
        raise ValueError(f"Arg `per_node` must be >= 1 (got {per_node})")
    nodes = [tuple(range(s, min(s + per_node, world))) for s in range(0, world, per_node)]
    period = []
    for representative in range(len(nodes[0])):
        inter = tuple(node[representative] for node in nodes if representative < len(node))
        groups = [inter]
        for node in nodes:  # pair the others from the representative on: fair turns alone
            turn = node[representative + 1 :] + node[:representative]
            others = [r for r in turn if r not in inter]
            groups += [tuple(sorted(others[i : i + 2])) for i in range(0, len(others), 2)]
        period.append(tuple(sorted(groups)))
        period.append(tuple(nodes))
    return period


def static_schedule(world: int, per_node: int | None = None) -> list[Partition]:
    """The schedule for a cluster: node-aware when it has several multi-worker nodes, else the
    power-of-two blocks (which already average neighbours in rank order first)."""
    if per_node is not None and 1 < per_node < world:
        return node_aware(world, per_node)
    return power_of_two_blocks(world)


def static_group(period: Sequence[Partition], step: int, rank: int) -> tuple[int, ...]:
    """The group `rank` averages with after local step `step` (the period repeats; with steps
    counted from 1, as hetsync does, the blocks schedule's full all-reduce is step P)."""
    partition = period[step % len(period)]
    group = next((g for g in partition if rank in g), None)
    if group is None:
        raise ValueError(f"rank {rank} is in no group of step {step % len(period)} of the period")
    return group


def validate_period(world: int, period: Sequence[Partition]) -> None:
    """Raise ValueError unless every step partitions range(world) and the period connects all
    ranks (otherwise models of disconnected parts would never mix)."""
    _check_world(world)
    if not period:
        raise ValueError("the period has no steps")
    root = list(range(world))

    def find(r: int) -> int:
        while root[r] != r:
            root[r] = root[root[r]]
            r = root[r]
        return r

    first: dict[int, tuple[int, Partition]] = {}  # a partition the period repeats: once
    for step, partition in enumerate(period):
        first.setdefault(id(partition), (step, partition))
    for step, partition in first.values():
        seen: set[int] = set()
        for group in partition:
            if not group:
                raise ValueError(f"step {step}: an empty group")
            for r in group:
                if not 0 <= r < world:
                    raise ValueError(f"step {step}: rank {r} is outside 0..{world - 1}")
                if r in seen:
                    raise ValueError(f"step {step}: rank {r} is in two groups")
                seen.add(r)
                root[find(r)] = find(group[0])
        if len(seen) < world:
            missing = min(set(range(world)) - seen)
            raise ValueError(f"step {step}: rank {missing} is in no group")
    components: dict[int, list[int]] = {}
    for r in range(world):
        components.setdefault(find(r), []).append(r)
    if len(components) > 1:
        first, second = sorted(components.values())[:2]
        raise ValueError(f"the period never connects ranks {first} with ranks {second}")


class StaticStop:
    """When one worker on a static schedule stops (see the module doc, "Stopping")."""

    def __init__(self, lead: int, max_iterations: int | None = None) -> None:
        if lead < 1:
            raise ValueError(f"Arg `lead` must be >= 1 (got {lead})")
        self.lead, self.max_iterations = lead, max_iterations
        self.agreed: int | None = None
        """The proposal that won, once this worker has read it."""

    @property
    def stop_at(self) -> int | None:
        """The step after which this worker stops, as far as it knows now."""
        return min((s for s in (self.max_iterations, self.agreed) if s is not None), default=None)

    def proposal(self, iteration: int, wants_stop: bool) -> int | None:
        """The step to propose after `iteration`, or None: no stop wished, a step already
        agreed, or `max_iterations` comes no later."""
        if not wants_stop or self.agreed is not None:
            return None
        step = iteration + self.lead
        return None if self.max_iterations is not None and step >= self.max_iterations else step

    def needs_news(self, iteration: int) -> bool:
        """Whether to look for an agreed step before averaging `iteration`: none read yet, and
        `max_iterations` not reached."""
        return self.agreed is None and (self.max_iterations is None
                                        or iteration < self.max_iterations)

    def learn(self, agreed: int, iteration: int) -> None:
        """The agreed step, read before averaging `iteration`; raise if it has passed (`lead`
        was too short: this worker can no longer stop with the others)."""
        if agreed < iteration:
            raise RuntimeError(f"learnt the stop step {agreed} only at step {iteration}")
        self.agreed = agreed

    def stops_after(self, iteration: int) -> bool:
        stop_at = self.stop_at
        return stop_at is not None and iteration >= stop_at


def _check_world(world: int) -> None:
    if world < 1:
        raise ValueError(f"Arg `world` must be >= 1 (got {world})")
