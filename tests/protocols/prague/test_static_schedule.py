from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from hetsync.protocols.prague.static_schedule import (
    StaticStop,
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


def _run_static(world, per_node, max_iterations, wishes, speeds, seed):
    """Workers on the static schedule, interleaved at random (faster ones picked more often):
    after each step a worker takes its stop decisions as Prague's driver does (the store is a
    dict whose first proposal wins), then waits for its group of that step. Returns each
    rank's last step and the agreed step (None if none was proposed). `wishes[r]`: the step
    from which rank r's other stop conditions hold (None: never)."""
    period = static_schedule(world, per_node)
    rng = random.Random(seed)
    store: dict[str, int] = {}
    stops = [StaticStop(len(period) * world, max_iterations) for _ in range(world)]
    step = [1] * world
    waiting: dict[int, tuple[int, ...]] = {}  # rank -> its group at step[rank]
    last: dict[int, int] = {}
    while len(last) < world:
        for group in {g for r, g in waiting.items() if all(
                waiting.get(m) == g and step[m] == step[r] for m in g)}:
            for m in group:
                del waiting[m]
                if stops[m].stops_after(step[m]):
                    last[m] = step[m]
                else:
                    step[m] += 1
        computing = [r for r in range(world) if r not in waiting and r not in last]
        if not computing:
            assert len(last) == world, f"deadlock: {waiting} wait, {last} left"
            break
        r = rng.choices(computing, [speeds[c] for c in computing])[0]
        t, stop = step[r], stops[r]
        wants = (wishes[r] is not None and t >= wishes[r]) or t >= (max_iterations or t + 1)
        proposal = stop.proposal(t, wants)
        if proposal is not None:
            stop.learn(store.setdefault("stop", proposal), t)
        elif stop.needs_news(t) and "stop" in store:
            stop.learn(store["stop"], t)
        waiting[r] = static_group(period, t, r)
    return last, store.get("stop")


def _max_iterations(world, per_node):
    """K below the period, around a few periods (mostly not multiples), large, or None."""
    period = len(static_schedule(world, per_node))
    return st.one_of(st.none(), st.integers(1, max(1, period - 1)),
                     st.integers(1, 4 * period + 1), st.integers(200, 400))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), world=st.integers(1, 12), per_node=st.none() | st.integers(1, 4),
       speeds=st.lists(st.sampled_from([0.05, 1.0, 20.0]), min_size=12, max_size=12),
       seed=st.integers(0, 2**16))
@example(data=None, world=4, per_node=None, speeds=[1.0] * 12, seed=0)  # the reported run
def test_with_max_iterations_alone_every_worker_stops_after_exactly_that_step(
    data, world, per_node, speeds, seed
):
    max_iterations = 3 if data is None else data.draw(_max_iterations(world, per_node))
    assume(max_iterations is not None)
    last, agreed = _run_static(world, per_node, max_iterations, [None] * world, speeds, seed)
    assert last == dict.fromkeys(range(world), max_iterations)
    assert agreed is None  # a foreseen stop needs no proposal


@settings(max_examples=200, deadline=None)
@given(data=st.data(), world=st.integers(1, 12), per_node=st.none() | st.integers(1, 4),
       wishes=st.lists(st.none() | st.integers(1, 300), min_size=12, max_size=12),
       speeds=st.lists(st.sampled_from([0.05, 1.0, 20.0]), min_size=12, max_size=12),
       seed=st.integers(0, 2**16))
def test_other_stops_are_agreed_and_never_come_after_max_iterations(
    data, world, per_node, wishes, speeds, seed
):
    max_iterations = data.draw(_max_iterations(world, per_node))
    wishes = wishes[:world]
    assume(max_iterations is not None or any(w is not None for w in wishes))
    last, agreed = _run_static(world, per_node, max_iterations, wishes, speeds, seed)
    ends = [s for s in (max_iterations, agreed) if s is not None]
    assert set(last.values()) == {min(ends)}
    lead = len(static_schedule(world, per_node)) * world
    # The first worker to want a stop proposes one period ahead of its wish; that need not
    # be the smallest wish (a slower worker may reach its wish later).
    assert agreed is None or agreed - lead in {w for w in wishes if w is not None}


def test_static_stop_proposes_only_a_stop_that_comes_first_and_refuses_a_late_one():
    stop = StaticStop(lead=8, max_iterations=20)
    assert stop.proposal(12, wants_stop=False) is None
    assert stop.proposal(12, wants_stop=True) is None  # 20 comes before 12 + 8
    assert stop.proposal(11, wants_stop=True) == 19
    assert stop.stop_at == 20 and stop.needs_news(19) and not stop.needs_news(20)
    stop.learn(19, 11)
    assert stop.stop_at == 19 and not stop.needs_news(11) and stop.proposal(12, True) is None
    assert not stop.stops_after(18) and stop.stops_after(19)
    with pytest.raises(RuntimeError, match="learnt the stop step 5 only at step 6"):
        StaticStop(lead=8).learn(5, 6)
    with pytest.raises(ValueError, match="lead"):
        StaticStop(lead=0)
    assert StaticStop(lead=8).stop_at is None
