"""The protocol cores' reactions to a worker lost from the run (`--on-failure continue`):
nothing more is awaited from it, it is chosen and grouped no more, and no one deadlocks."""

from __future__ import annotations

import random

import pytest

from hetsync.protocols.adpsgd.core import (
    ADPSGDCore,
    ComputeFinished,
    IterationStarted,
    PeerLost,
    ReplyLost,
    ReplyReceived,
    RequestReceived,
    SendRequest,
    Serve,
    Served,
    ServerDone,
    Step,
    StepFinished,
)
from hetsync.protocols.hop.core import (
    Aggregate,
    HopConfig,
    HopCore,
    NeighbourLost,
    ReadyToStart,
    ReturnTokens,
    SendUpdate,
    StartIteration,
    TokensReceived,
    UpdateReceived,
    Wait,
)
from hetsync.protocols.hop.core import ComputeFinished as HopComputeFinished
from hetsync.protocols.prague.group_generator import (
    AssignGroup,
    GroupFinished,
    GroupGeneratorCore,
    GroupRequested,
    WorkerLost,
)
from hetsync.topology import build


def _hop(rank: int = 1, world: int = 3, **options: object) -> HopCore:
    topology = build("ring", world, "uniform")
    self_weight, weights = topology.recv_weights(rank)
    return HopCore(rank, topology.in_peers(rank), topology.out_peers(rank), self_weight,
                   weights, HopConfig(**options))


def test_hop_stops_waiting_for_a_lost_in_neighbour_and_renormalises():
    core = _hop(max_gap=2)
    core.handle(ReadyToStart())
    core.handle(UpdateReceived(src=0, tag=1))
    assert core.handle(HopComputeFinished(iteration=1)) == [Wait(iteration=1, updates={2: 1})]
    half = pytest.approx(0.5)
    assert core.handle(NeighbourLost(rank=2))[:2] == [
        Aggregate(iteration=1, inputs={0: 1}, self_weight=half, weights={0: half}),
        ReturnTokens(to=(0,), count=1)]
    assert core.handle(ReadyToStart())[-1] == SendUpdate(tag=2, to=(0,))  # no tokens from 2


def test_hop_does_not_wait_for_the_update_a_lost_neighbours_tokens_promise():
    """Unlike a neighbour that left (whose end marker may overtake its last update), a lost one
    may have died before sending it."""
    core = _hop(max_gap=2)
    core.handle(ReadyToStart())
    core.handle(UpdateReceived(src=0, tag=1))
    core.handle(HopComputeFinished(iteration=1))
    core.handle(TokensReceived(src=2))  # rank 2 completed iteration 1, then died
    assert isinstance(core.handle(NeighbourLost(rank=2))[0], Aggregate)


def test_hop_blocked_on_a_lost_out_neighbours_tokens_goes_on():
    core = _hop(max_gap=1)
    core.handle(ReadyToStart())
    core.handle(UpdateReceived(src=0, tag=1))
    core.handle(UpdateReceived(src=2, tag=1))
    core.handle(HopComputeFinished(iteration=1))
    core.handle(TokensReceived(src=0))
    assert core.handle(ReadyToStart())[-1] == Wait(iteration=2, tokens=(2,))
    assert core.handle(NeighbourLost(rank=2))[-2:] == [StartIteration(iteration=2),
                                                       SendUpdate(tag=2, to=(0,))]


def _adpsgd(rank: int, neighbours: list[int]) -> ADPSGDCore:
    return ADPSGDCore(rank, neighbours, False, random.Random(0))


def test_adpsgd_active_worker_chooses_a_lost_partner_no_more():
    core = _adpsgd(1, [0, 2])
    core.handle(PeerLost(rank=0))
    for k in range(1, 20):
        assert core.handle(IterationStarted(iteration=k)) == [SendRequest(partner=2, iteration=k)]
        core.handle(ComputeFinished(iteration=k))
        core.handle(ReplyReceived(src=2))
        core.handle(StepFinished(iteration=k, wants_stop=False))


def test_adpsgd_a_request_to_a_partner_lost_before_replying_ends_without_an_average():
    core = _adpsgd(1, [0])
    core.handle(IterationStarted(iteration=1))
    core.handle(ComputeFinished(iteration=1))
    assert core.handle(ReplyLost(src=0)) == [Step(iteration=1)]  # no LoadAverage
    core.handle(PeerLost(rank=0))
    core.handle(StepFinished(iteration=1, wants_stop=False))
    assert core.handle(IterationStarted(iteration=2)) == []  # no partner left: trains alone


def test_adpsgd_passive_server_is_done_once_its_clients_left_or_were_lost():
    core = _adpsgd(2, [1, 3])
    assert core.handle(RequestReceived(src=3)) == [Serve(client=3)]
    assert core.handle(PeerLost(rank=3)) == []  # its request, already in, is served
    assert core.handle(Served(src=3)) == []
    assert core.handle(PeerLost(rank=1)) == [ServerDone()]
    assert core.handle(PeerLost(rank=1)) == []  # told twice: once counts


def _gg(policy: str = "random", world: int = 4, group_size: int = 2) -> GroupGeneratorCore:
    return GroupGeneratorCore(world, group_size, random.Random(1), policy=policy)


@pytest.mark.parametrize("policy", ["random", "ready"])
def test_gg_puts_a_lost_worker_in_no_later_group(policy):
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


def test_gg_finishes_a_lost_workers_groups_for_it_and_groups_those_it_kept_waiting():
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
