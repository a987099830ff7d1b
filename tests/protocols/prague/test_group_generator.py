from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.prague.group_generator import (
    BUFFERS,
    POLICIES,
    AssignGroup,
    GeneratorState,
    Group,
    GroupFinished,
    GroupGeneratorCore,
    GroupRequested,
    GroupStats,
    WaitTimedOut,
    WorkerLost,
)
from hetsync.protocols.prague.worker import (
    GroupAssigned,
    MergeModels,
    PragueWorkerCore,
    PReduceFinished,
    ReportFinished,
    RequestGroup,
    RunPReduce,
    StartStep,
    StepFinished,
    StopTraining,
)

GG = "gg"


@dataclass
class Run:
    """What a simulated run did, for the invariant checks."""

    gg: GroupGeneratorCore
    left_at: dict[int, float] = field(default_factory=dict)
    runs: dict[int, list[int]] = field(default_factory=dict)  # rank -> group ids, in run order
    groups: dict[int, Group] = field(default_factory=dict)
    answers: dict[tuple[int, int], Group] = field(default_factory=dict)  # (rank, iteration)
    steps: dict[int, int] = field(default_factory=dict)
    models: list[float] = field(default_factory=list)  # each worker's model at the end
    expected_sum: float = 0.0  # the initial sum plus every local update
    merged_before: dict[tuple[int, int], int] = field(default_factory=dict)
    requested: dict[int, list[int]] = field(default_factory=dict)
    """rank -> the iterations it asked a group for, in order (all of them without a lag)."""
    """(rank, group id) -> the merges the rank had made when it ran the group (overlap)."""


def simulate(world, group_size, *, steps=4, speeds=None, seed=0, timeouts=False, preduce=0.05,
             latency=0.01, max_events=200_000, overlap=False, lr=0.0, group_lag=0,
             **options) -> Run:
    """N workers (PragueWorkerCore) and one GroupGeneratorCore joined by an in-memory network:
    random step durations (mean `speeds[r]`), FIFO channels with random latency, P-Reduces that
    start when the last member joins. Each worker holds a one-number model, moved by a random
    local update of size `lr` per step, and (with `overlap`) the copy its P-Reduces average
    and the model it handed over, merged as `MergeModels` says. Fails on a deadlock (nothing
    left to happen while some worker has not left) or a livelock (`max_events`)."""
    rng = random.Random(seed)
    speeds = speeds or [1.0] * world
    run = Run(GroupGeneratorCore(world, group_size, random.Random(seed + 1), **options))
    run.runs = {r: [] for r in range(world)}
    workers = [PragueWorkerCore(r, world, overlap=overlap,  # as `of_run` makes them
                                report_with_request=run.gg.policy == "ready",
                                group_lag=group_lag if overlap else 0)
               for r in range(world)]
    run.requested = {r: [] for r in range(world)}
    model = [rng.uniform(-1, 1) for _ in range(world)]
    run.expected_sum = sum(model)
    averaged = list(model) if overlap else model  # what the P-Reduces average
    handed = list(model)
    merges = dict.fromkeys(range(world), 0)
    heap: list = []
    order = itertools.count()
    channel_free: dict[tuple, float] = {}
    joined: dict[int, set[int]] = {}
    requested: dict[int, GroupRequested] = {}
    left: set[int] = set()

    def deliver(at, dst, event):
        heapq.heappush(heap, (at, next(order), dst, event))

    def send(now, src, dst, event):  # FIFO per (src, dst)
        at = max(now + rng.uniform(0, latency), channel_free.get((src, dst), 0.0))
        channel_free[src, dst] = at
        deliver(at, dst, event)

    def step(now, rank, iteration):
        duration = speeds[rank] * rng.uniform(0.5, 1.5)
        deliver(now + duration, rank, StepFinished(iteration=iteration, last=iteration == steps))

    for rank in range(world):
        step(0.0, rank, 1)
    if timeouts:
        deliver(rng.uniform(0, 2), GG, WaitTimedOut())
    for _ in range(max_events):
        if not heap and len(left) == world:
            return run
        if not heap:
            states = {r: (w.state.name, w.queued, w.running) for r, w in enumerate(workers)}
            raise AssertionError(f"deadlock: left {sorted(left)}, workers {states}, "
                                 f"waiting {run.gg.waiting}")
        now, _, dst, event = heapq.heappop(heap)
        if dst == GG:
            if isinstance(event, WaitTimedOut) and len(left) < world:
                deliver(now + rng.uniform(0, 2), GG, event)
            for decision in run.gg.handle(event):
                _check_assignment(run, decision, requested)
                send(now, GG, decision.rank, GroupAssigned(
                    group=decision.group, answers_request=decision.answers_request))
            continue
        if isinstance(event, StepFinished):
            update = rng.uniform(-lr, lr)
            model[dst] += update
            run.expected_sum += update
        for decision in workers[dst].handle(event):
            if isinstance(decision, ReportFinished):
                send(now, dst, GG, GroupFinished(group_id=decision.group_id, rank=dst))
            elif isinstance(decision, RequestGroup):
                if decision.finished is not None:  # the same message, told first
                    send(now, dst, GG, GroupFinished(group_id=decision.finished, rank=dst))
                request = GroupRequested(rank=dst, iteration=decision.iteration,
                                         last=decision.last)
                requested[dst] = request
                run.requested[dst].append(decision.iteration)
                send(now, dst, GG, request)
            elif isinstance(decision, RunPReduce):
                group = decision.group
                run.runs[dst].append(group.id)
                run.merged_before[dst, group.id] = merges[dst]
                joined.setdefault(group.id, set()).add(dst)
                if joined[group.id] == set(group.members):
                    mean = sum(averaged[m] for m in group.members) / len(group.members)
                    for member in group.members:
                        averaged[member] = mean
                        deliver(now + preduce, member, PReduceFinished(group_id=group.id))
            elif isinstance(decision, MergeModels):
                assert overlap  # comes before any RunPReduce of the same list
                model[dst] = averaged[dst] + (model[dst] - handed[dst])
                averaged[dst] = handed[dst] = model[dst]
                merges[dst] += 1
            elif isinstance(decision, StartStep):
                step(now, dst, decision.iteration)
            else:
                assert isinstance(decision, StopTraining)
                left.add(dst)
                run.steps[dst] = workers[dst].iteration
                run.left_at[dst] = now
                run.models = model
    raise AssertionError(f"livelock: {max_events} events and only {sorted(left)} left")


def _check_assignment(run: Run, decision: AssignGroup, requested: dict) -> None:
    """One global order: a rank's new groups come in increasing id; sizes are respected."""
    group = decision.group
    assert len(group.members) <= run.gg.group_size
    if group.id not in run.groups:
        assert group.id > max(run.groups, default=-1)
        run.groups[group.id] = group
    assert run.groups[group.id] == group
    assert [g.id for g in run.gg.unfinished(decision.rank)] == sorted(
        g.id for g in run.gg.unfinished(decision.rank))
    if decision.answers_request:
        request = requested.pop(decision.rank)
        assert (request.rank, request.iteration) not in run.answers
        run.answers[request.rank, request.iteration] = group


def check_invariants(run: Run, world: int, steps: int, overlap: bool = False,
                     group_lag: int = 0) -> None:
    gg = run.gg
    assert math.isclose(sum(run.models), run.expected_sum, abs_tol=1e-9), "the sum is conserved"
    for rank, asked in run.requested.items():  # a lag passes at most `group_lag` steps
        gaps = [b - a for a, b in zip([0, *asked], asked, strict=False)]
        assert asked[-1] == steps and max(gaps) <= group_lag + 1, (rank, asked)
        assert group_lag or asked == list(range(1, steps + 1))
    if overlap:  # a request's model is averaged in its answer's group, after the merge before it
        for (rank, k), group in run.answers.items():
            assert run.merged_before[rank, group.id] == run.requested[rank].index(k) + 1
    assert run.steps == {r: steps for r in range(world)}, "every worker completed every step"
    assert set(run.answers) == {(r, k) for r, asked in run.requested.items() for k in asked}
    for (rank, _), group in run.answers.items():
        assert rank in group
    for rank, ids in run.runs.items():
        assert ids == sorted(set(ids)), f"rank {rank} ran groups out of the global order {ids}"
        asked = len(run.requested[rank])
        assert len(ids) >= asked, f"rank {rank} averaged {len(ids)} times for {asked} requests"
    for gid, group in run.groups.items():
        ran = [r for r in range(world) if gid in run.runs[r]]
        assert ran == list(group.members), f"group {group} was run by {ran}"
    # Every rank runs its groups in increasing id (above): so the members two groups share
    # meet them in one order, the global one.
    stats = gg.stats
    assert stats.requests == sum(len(asked) for asked in run.requested.values())
    assert stats.groups == len(run.groups)
    assert not gg.live and not gg.waiting
    assert all(not gg.unfinished(r) for r in range(world))
    assert gg.state is GeneratorState.RUNNING


@settings(max_examples=250, deadline=None)
@given(
    world=st.integers(1, 12),
    group_size=st.integers(1, 12),
    policy=st.sampled_from(POLICIES),
    buffer=st.sampled_from(BUFFERS),
    divisions=st.integers(1, 3),
    redivide_every=st.none() | st.integers(1, 6),
    speeds=st.lists(st.sampled_from([0.2, 1.0, 4.0]), min_size=12, max_size=12),
    steps=st.integers(1, 6),
    timeouts=st.booleans(),
    overlap=st.booleans(),
    group_lag=st.sampled_from([0, 0, 1, 3]),
    lr=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_any_speeds_and_options_every_request_is_answered_in_one_order_without_deadlock(
    world, group_size, policy, buffer, divisions, redivide_every, speeds, steps, timeouts,
    overlap, group_lag, lr, seed
):
    group_size = min(group_size, world)
    divisions = min(divisions, world // group_size)
    buffer = buffer if policy == "random" else "off"
    run = simulate(world, group_size, steps=steps, speeds=speeds[:world], seed=seed,
                   timeouts=timeouts, policy=policy, buffer=buffer, divisions=divisions,
                   redivide_every=redivide_every, overlap=overlap, lr=lr,
                   group_lag=group_lag)
    check_invariants(run, world, steps, overlap, group_lag if overlap else 0)
    if policy == "ready":
        assert run.gg.stats.conflicts == 0
    if buffer == "off":
        assert run.gg.stats.reused == 0


@pytest.mark.parametrize(("overlap", "lag"), [(False, 0), (True, 0), (True, 3)],
                         ids=["between steps", "overlap", "overlap, lag 3"])
@pytest.mark.parametrize("options", [{"policy": "ready"}, {"buffer": "queue"}, {}],
                         ids=["ready", "paper", "random"])
def test_eight_workers_thousands_of_groups_random_delays(options, overlap, lag):
    """8 workers, one 4x slower, 800 steps each: 2000+ groups in one order, no deadlock, the
    sum of the models conserved with lr 0, each request averaged in its answer's group."""
    speeds = [1.0] * 7 + [4.0]
    run = simulate(8, 3, steps=800, speeds=speeds, seed=11, timeouts=True, overlap=overlap,
                   max_events=2_000_000, group_lag=lag, **options)
    assert len(run.groups) >= 2000
    check_invariants(run, 8, 800, overlap, lag)
    assert bool(lag) == any(len(asked) < 800 for asked in run.requested.values()), "lagged"
    spread = max(run.models) - min(run.models)
    assert spread < 1e-6, "with lr 0 the models reach consensus"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), world=st.integers(4, 9), policy=st.sampled_from(
    ["random", "ready"]))
def test_groups_form_within_one_division(seed, world, policy):
    rng = random.Random(seed)
    gg = GroupGeneratorCore(world, 2, random.Random(seed), policy=policy, divisions=2,
                            redivide_every=3)
    iteration = dict.fromkeys(range(world), 0)
    for _ in range(60):
        rank = rng.randrange(world)
        if rank in gg.waiting:
            continue
        iteration[rank] += 1
        decisions = gg.handle(GroupRequested(rank=rank, iteration=iteration[rank]))
        divisions = gg.divisions
        for decision in decisions:
            assert any(set(decision.group.members) <= set(d) for d in divisions)
        for group in {d.group for d in decisions}:
            for member in group.members:
                gg.handle(GroupFinished(group_id=group.id, rank=member))


def test_ready_policy_groups_fast_workers_together_without_conflicts():
    speeds = [5.0] + [1.0] * 7
    ready = simulate(8, 2, steps=12, speeds=speeds, seed=3, policy="ready")
    paper = simulate(8, 2, steps=12, speeds=speeds, seed=3, policy="random")
    fast_groups = [g for g in ready.groups.values() if 0 not in g]
    assert len(fast_groups) > 3 * (len(ready.groups) - len(fast_groups))
    assert ready.gg.stats.conflicts == 0 < paper.gg.stats.conflicts


@pytest.mark.parametrize("speeds", [[1.0] * 12, [4.0, 4.0] + [1.0] * 10], ids=["even", "slow"])
def test_group_buffer_cuts_conflicts_queue_most(speeds):
    def conflicts_per_group(buffer):
        stats = [simulate(12, 3, steps=10, speeds=speeds, seed=s, buffer=buffer).gg.stats
                 for s in range(3)]
        return sum(s.conflicts for s in stats) / sum(s.groups for s in stats)

    paper, batch, queue = (conflicts_per_group(b) for b in ("off", "batch", "queue"))
    assert queue < batch < paper and queue < paper / 4


def test_every_worker_averages_with_every_other_over_a_run():
    for options in ({"policy": "random"}, {"buffer": "queue", "divisions": 3}, {"buffer": "batch"},
                    {"policy": "ready", "divisions": 2}):
        run = simulate(9, 3, steps=20, seed=5, **options)
        union = nx.Graph()
        union.add_nodes_from(range(9))
        for group in run.groups.values():
            union.add_edges_from(itertools.combinations(group.members, 2))
        assert nx.is_connected(union), options


# Scripted: events in, exact decisions out.


def _assign(group: Group, requester: int) -> list[AssignGroup]:
    return [AssignGroup(rank=r, group=group, answers_request=r == requester)
            for r in group.members]


def test_random_policy_scripted_with_whole_world_groups():
    gg = GroupGeneratorCore(3, 3, random.Random(0))
    first, second = Group(id=0, members=(0, 1, 2)), Group(id=1, members=(0, 1, 2))
    assert gg.handle(GroupRequested(rank=1, iteration=1)) == _assign(first, 1)
    assert gg.handle(GroupRequested(rank=0, iteration=1)) == _assign(second, 0)
    assert gg.unfinished(2) == (first, second)
    assert gg.handle(GroupFinished(group_id=0, rank=2)) == []
    assert gg.stats == GroupStats(requests=2, groups=2, conflicts=1, conflicting_members=3)


def test_ready_policy_waits_for_a_full_group_or_the_timer():
    gg = GroupGeneratorCore(4, 2, random.Random(0), policy="ready")
    assert gg.handle(GroupRequested(rank=2, iteration=1)) == []
    assert gg.waiting == (2,)
    pair = Group(id=0, members=(0, 2))
    assert gg.handle(GroupRequested(rank=0, iteration=1)) == [
        AssignGroup(rank=0, group=pair, answers_request=True),
        AssignGroup(rank=2, group=pair, answers_request=True),
    ]
    assert gg.handle(GroupRequested(rank=3, iteration=1)) == []
    alone = Group(id=1, members=(3,))
    assert gg.handle(WaitTimedOut()) == [AssignGroup(rank=3, group=alone, answers_request=True)]
    assert gg.handle(WaitTimedOut()) == []
    assert gg.stats == GroupStats(requests=3, groups=2, undersized=1)


def test_ready_groups_shrink_to_the_workers_still_in():
    gg = GroupGeneratorCore(3, 3, random.Random(0), policy="ready")
    assert gg.handle(GroupRequested(rank=0, iteration=1)) == []
    assert gg.handle(GroupRequested(rank=1, iteration=1)) == []
    everyone = Group(id=0, members=(0, 1, 2))
    assert len(gg.handle(GroupRequested(rank=2, iteration=1, last=True))) == 3
    assert gg.live == {0, 1} and gg.unfinished(2) == (everyone,)
    gg.handle(GroupRequested(rank=0, iteration=2))
    pair = Group(id=1, members=(0, 1))
    assert gg.handle(GroupRequested(rank=1, iteration=2)) == [
        AssignGroup(rank=r, group=pair, answers_request=True) for r in (0, 1)
    ]


def test_group_buffer_answers_a_busy_requester_with_the_group_it_is_in():
    gg = GroupGeneratorCore(4, 2, random.Random(7), buffer="queue")
    first = gg.handle(GroupRequested(rank=0, iteration=1))
    group = first[0].group
    partner = next(r for r in group.members if r != 0)
    assert gg.handle(GroupRequested(rank=partner, iteration=1)) == [
        AssignGroup(rank=partner, group=group, answers_request=True)
    ]
    assert gg.stats == GroupStats(requests=2, groups=1, reused=1)


def test_group_buffer_hands_out_disjoint_groups_of_one_batch():
    gg = GroupGeneratorCore(8, 2, random.Random(1), buffer="batch")
    members = []
    for rank in range(8):
        if not gg.unfinished(rank):
            members.append(gg.handle(GroupRequested(rank=rank, iteration=1))[0].group.members)
    assert sorted(r for m in members for r in m) == list(range(8))
    assert gg.stats.conflicts == 0


# Errors.


def _busy_generator() -> GroupGeneratorCore:
    gg = GroupGeneratorCore(3, 3, random.Random(0), policy="ready")
    gg.handle(GroupRequested(rank=0, iteration=1))
    return gg


@pytest.mark.parametrize(
    ("events", "error", "match"),
    [
        ([GroupRequested(rank=5, iteration=1)], RemoteProtocolError, "no rank 5 in a world of 3"),
        ([GroupRequested(rank=0, iteration=2)], RemoteProtocolError, "already waits"),
        ([GroupRequested(rank=1, iteration=3), GroupRequested(rank=2, iteration=1),
          GroupRequested(rank=1, iteration=2)], RemoteProtocolError,
         "iteration 2 does not follow rank 1's iteration 3"),
        ([GroupFinished(group_id=4, rank=0)], RemoteProtocolError, "group 4 is not assigned"),
        ([GroupRequested(rank=1, iteration=1), GroupRequested(rank=2, iteration=1, last=True),
          GroupRequested(rank=2, iteration=2)], RemoteProtocolError, "rank 2 already left"),
        (["hello"], LocalProtocolError, "unknown event 'hello'"),
    ],
    ids=["unknown-rank", "second-request", "iteration-goes-back", "unknown-group",
         "request-after-leaving", "not-an-event"],
)
def test_broken_invariants_raise_and_leave_the_generator_in_error(
    events, error, match, assert_refused
):
    assert_refused(_busy_generator(), events, error, match, then=WaitTimedOut())


def test_finishing_out_of_order_or_as_a_non_member_is_a_remote_error():
    gg = GroupGeneratorCore(3, 2, random.Random(0), policy="ready")
    gg.handle(GroupRequested(rank=0, iteration=1))
    gg.handle(GroupRequested(rank=1, iteration=1))
    with pytest.raises(RemoteProtocolError, match="rank 2 is not a member of group 0"):
        gg.handle(GroupFinished(group_id=0, rank=2))
    gg = GroupGeneratorCore(3, 3, random.Random(0))
    gg.handle(GroupRequested(rank=0, iteration=1))
    gg.handle(GroupRequested(rank=1, iteration=1))
    with pytest.raises(RemoteProtocolError, match="finished group 1 before its earlier group 0"):
        gg.handle(GroupFinished(group_id=1, rank=2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world": 0, "group_size": 1}, "world >= 1"),
        ({"world": 4, "group_size": 5}, "group_size <= world"),
        ({"world": 4, "group_size": 2, "policy": "fifo"}, "policy.*'fifo'"),
        ({"world": 4, "group_size": 2, "buffer": "big"}, "buffer.*'big'"),
        ({"world": 4, "group_size": 2, "policy": "ready", "buffer": "queue"}, "'off' unless"),
        ({"world": 7, "group_size": 3, "divisions": 3}, r"divisions.*1\.\.2"),
        ({"world": 4, "group_size": 2, "redivide_every": 0}, "redivide_every"),
    ],
)
def test_bad_options_raise_value_errors_naming_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupGeneratorCore(rng=random.Random(0), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"id": 0, "members": (2, 1)}, "sorted and distinct"), ({"id": 0, "members": ()}, "invalid"),
     ({"id": -1, "members": (0,)}, "invalid")],
)
def test_groups_check_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Group(**kwargs)
    with pytest.raises(ValueError, match="not a member"):
        AssignGroup(rank=3, group=Group(id=0, members=(0, 1)), answers_request=False)


# --- a lost worker (--on-failure continue) -----------------------------------------------
def _gg(policy: str = "random", world: int = 4, group_size: int = 2) -> GroupGeneratorCore:
    return GroupGeneratorCore(world, group_size, random.Random(1), policy=policy)


@pytest.mark.parametrize("policy", ["random", "ready"])
def test_puts_a_lost_worker_in_no_later_group(policy):
    gg = _gg(policy)
    gg.handle(WorkerLost(rank=2))
    rng = random.Random(3)
    for k in range(1, 200):
        rank = rng.choice([0, 1, 3])
        if rank in gg.waiting:
            continue
        for assign in gg.handle(GroupRequested(rank=rank, iteration=k)):
            assert 2 not in assign.group.members
            gg.handle(GroupFinished(group_id=assign.group.id, rank=assign.rank))
    assert 2 not in gg.live


def test_finishes_a_lost_workers_groups_for_it_and_groups_those_it_kept_waiting():
    gg = _gg("ready", world=4, group_size=3)
    assert gg.handle(GroupRequested(rank=0, iteration=1)) == []
    assert gg.handle(GroupRequested(rank=1, iteration=1)) == []
    formed = gg.handle(WorkerLost(rank=3))  # rank 3 never came: 2 was still to come
    assert formed == []
    formed = gg.handle(GroupRequested(rank=2, iteration=1))
    assert {a.rank for a in formed} == {0, 1, 2}
    gg = _gg("random", world=3, group_size=3)
    [*assigned] = gg.handle(GroupRequested(rank=0, iteration=1))
    group = assigned[0].group
    assert group.members == (0, 1, 2)
    gg.handle(WorkerLost(rank=2))
    gg.handle(GroupFinished(group_id=group.id, rank=0))
    gg.handle(GroupFinished(group_id=group.id, rank=1))
    assert gg.unfinished(2) == ()
    again = gg.handle(GroupRequested(rank=1, iteration=2))
    assert all(isinstance(a, AssignGroup) and a.group.members == (0, 1) for a in again)


def test_what_a_lost_worker_sent_before_its_loss_is_dropped_by_the_core():
    # The engines hand every message to the core; the core drops those of a lost worker.
    gg = GroupGeneratorCore(4, 2, random.Random(0))
    gg.handle(WorkerLost(rank=3))
    assert gg.handle(GroupRequested(rank=3, iteration=1)) == []
    assert gg.handle(GroupFinished(group_id=0, rank=3)) == []
    assert gg.handle(WorkerLost(rank=3)) == []  # told twice
