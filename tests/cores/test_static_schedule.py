from __future__ import annotations

import itertools

import networkx as nx
import pytest

from hetsync.cores.static_schedule import (
    node_aware,
    power_of_two_blocks,
    split_evenly,
    static_group,
    static_schedule,
    validate_period,
)

WORLDS = range(2, 65)
PER_NODE = (1, 2, 3, 4, 8)


def _assert_partitions_and_connected(world, period):
    """Checked here without `validate_period`, which is tested against it below."""
    union = nx.Graph()
    union.add_nodes_from(range(world))
    for partition in period:
        ranks = sorted(r for group in partition for r in group)
        assert ranks == list(range(world)), partition
        assert all(list(g) == sorted(g) for g in partition)
        for group in partition:
            union.add_edges_from(itertools.combinations(group, 2))
    assert nx.is_connected(union)


@pytest.mark.parametrize("world", WORLDS)
def test_power_of_two_blocks_partition_every_step_and_connect_the_period(world):
    period = power_of_two_blocks(world)
    _assert_partitions_and_connected(world, period)
    validate_period(world, period)
    assert len(period) == 1 << (world - 1).bit_length()
    assert period[0] == (tuple(range(world)),)
    for p, partition in enumerate(period):
        bound = p & -p or len(period)
        sizes = [len(g) for g in partition]
        assert max(sizes) <= bound and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("world", [2, 4, 8, 16, 32])
def test_power_of_two_blocks_equal_the_prototype_on_powers_of_two(world):
    period = power_of_two_blocks(world)
    for step in range(1, 3 * world):
        lowbit = step & -step
        for rank in range(world):
            prototype = tuple(i for i in range(world) if i // lowbit == rank // lowbit)
            assert static_group(period, step, rank) == prototype


def test_power_of_two_blocks_balance_non_powers_of_two():
    assert power_of_two_blocks(6) == [
        ((0, 1, 2, 3, 4, 5),),
        ((0,), (1,), (2,), (3,), (4,), (5,)),
        ((0, 1), (2, 3), (4, 5)),
        ((0,), (1,), (2,), (3,), (4,), (5,)),
        ((0, 1, 2), (3, 4, 5)),
        ((0,), (1,), (2,), (3,), (4,), (5,)),
        ((0, 1), (2, 3), (4, 5)),
        ((0,), (1,), (2,), (3,), (4,), (5,)),
    ]


@pytest.mark.parametrize(("world", "per_node"), list(itertools.product(WORLDS, PER_NODE)))
def test_node_aware_partitions_every_step_and_connects_the_period(world, per_node):
    period = node_aware(world, per_node)
    _assert_partitions_and_connected(world, period)
    validate_period(world, period)
    nodes = [set(range(s, min(s + per_node, world))) for s in range(0, world, per_node)]
    for representative, partition in enumerate(period[::2]):
        inter = next(g for g in partition if g[0] % per_node == representative)
        assert len(inter) == sum(representative < len(n) for n in nodes)
        assert all(len(g) <= 2 or g == inter for g in partition)
    for partition in period[1::2]:
        assert [set(g) for g in partition] == nodes


def test_node_aware_with_four_per_node_rotates_every_local_rank():
    assert node_aware(8, 4) == [
        ((0, 4), (1, 2), (3,), (5, 6), (7,)),
        ((0, 1, 2, 3), (4, 5, 6, 7)),
        ((0,), (1, 5), (2, 3), (4,), (6, 7)),
        ((0, 1, 2, 3), (4, 5, 6, 7)),
        ((0, 3), (1,), (2, 6), (4, 7), (5,)),
        ((0, 1, 2, 3), (4, 5, 6, 7)),
        ((0, 1), (2,), (3, 7), (4, 5), (6,)),
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    ]


def test_a_short_last_node_joins_the_inter_node_groups_of_the_ranks_it_has():
    period = node_aware(10, 4)
    assert static_group(period, 0, 8) == (0, 4, 8)
    assert static_group(period, 4, 8) == (8, 9)  # no local rank 2 on the last node: a pair
    assert static_group(period, 5, 9) == (8, 9)


@pytest.mark.parametrize(("world", "per_node", "expected"), [
    (16, 4, node_aware(16, 4)), (16, 1, power_of_two_blocks(16)),
    (4, 8, power_of_two_blocks(4)), (6, None, power_of_two_blocks(6)),
])
def test_static_schedule_is_node_aware_only_for_several_multi_worker_nodes(
    world, per_node, expected
):
    assert static_schedule(world, per_node) == expected


@pytest.mark.parametrize(
    ("world", "period", "match"),
    [
        (4, [], "the period has no steps"),
        (4, [((0, 1), (1, 2, 3))], "step 0: rank 1 is in two groups"),
        (4, [((0, 1, 2, 3),), ((0, 1), (3,))], "step 1: rank 2 is in no group"),
        (4, [((0, 1, 2, 5),)], r"step 0: rank 5 is outside 0\.\.3"),
        (4, [((), (0, 1, 2, 3))], "step 0: an empty group"),
        (4, [((0, 1), (2, 3)), ((0,), (1,), (2, 3))],
         r"never connects ranks \[0, 1\] with ranks \[2, 3\]"),
    ],
)
def test_validate_period_names_the_problem(world, period, match):
    with pytest.raises(ValueError, match=match):
        validate_period(world, period)


def test_bad_arguments_and_helpers():
    with pytest.raises(ValueError, match="world"):
        power_of_two_blocks(0)
    with pytest.raises(ValueError, match="per_node"):
        node_aware(4, 0)
    with pytest.raises(ValueError, match="rank 7 is in no group"):
        static_group(power_of_two_blocks(4), 1, 7)
    assert split_evenly(range(7), 3) == [(0, 1), (2, 3), (4, 5, 6)]
    assert power_of_two_blocks(1) == [((0,),)]
