"""One AD-PSGD worker's decisions (roles, partners, the model lock), without processes."""

from __future__ import annotations

import random
from collections import deque

import pytest

from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.adpsgd.core import (
    ADPSGDCore,
    ADPSGDState,
    ByeReceived,
    ComputeFinished,
    Finish,
    Holder,
    IterationStarted,
    Leave,
    LoadAverage,
    PeerLost,
    ReplyLost,
    ReplyReceived,
    RequestReceived,
    SendBye,
    SendRequest,
    Serve,
    Served,
    ServerDone,
    StepFinished,
    StepGranted,
    roles,
)


def _core(rank, neighbours, naive=False, seed=0, max_gap=0):
    return ADPSGDCore(rank, neighbours, naive, random.Random(f"adpsgd/{seed}/{rank}"),
                      max_gap=max_gap)


def test_roles_split_odd_active_from_even_passive_unless_naive():
    assert roles(1, [0, 2, 2], naive=False) == (True, False, (0, 2), ())
    assert roles(2, [1, 3], naive=False) == (False, True, (), (1, 3))
    assert roles(2, [1, 3], naive=True) == (True, True, (1, 3), (1, 3))


def test_partner_choice_is_the_injected_rngs_one_choice_per_iteration():
    core, expected = _core(3, [0, 2, 4, 6], seed=5), random.Random("adpsgd/5/3")
    for k in range(1, 30):
        [request] = core.handle(IterationStarted(iteration=k))
        assert request == SendRequest(partner=expected.choice((0, 2, 4, 6)), iteration=k)
        core.handle(ComputeFinished(iteration=k))
        core.handle(ReplyReceived(src=request.partner))
        core.handle(StepFinished(iteration=k, wants_stop=False))


def test_active_loads_the_reply_once_both_it_and_the_gradient_are_in():
    core = _core(1, [0])
    assert core.handle(IterationStarted(iteration=1)) == [SendRequest(partner=0, iteration=1)]
    assert core.handle(ComputeFinished(iteration=1)) == []
    assert core.handle(ReplyReceived(src=0)) == [LoadAverage(partner=0), StepGranted(iteration=1)]
    assert core.handle(StepFinished(iteration=1, wants_stop=False)) == [
        Finish(iteration=1, stop=False)]
    core.handle(IterationStarted(iteration=2))
    assert core.handle(ReplyReceived(src=0)) == []  # early reply: loaded after the gradient
    assert core.handle(ComputeFinished(iteration=2)) == [LoadAverage(partner=0),
                                                         StepGranted(iteration=2)]
    assert core.holder is Holder.FREE  # an active-only worker never takes a lock


def test_passive_serves_one_request_at_a_time_in_arrival_order_and_not_during_its_step():
    core = _core(2, [1, 3, 5])
    assert core.handle(RequestReceived(src=3)) == [Serve(client=3)]
    assert core.handle(RequestReceived(src=1)) == []
    assert core.queued == (1,) and core.serving == 3
    core.handle(IterationStarted(iteration=1))
    assert core.handle(ComputeFinished(iteration=1)) == []  # the step waits for the lock
    assert core.handle(Served(src=3)) == [StepGranted(iteration=1)]  # the trainer first
    assert core.handle(RequestReceived(src=5)) == []
    assert core.handle(StepFinished(iteration=1, wants_stop=True)) == [
        Finish(iteration=1, stop=True), Serve(client=1)]
    assert core.handle(Served(src=1)) == [Serve(client=5)]
    core.handle(Served(src=5))
    assert core.handle(Leave()) == []  # passive-only: no partners to say goodbye to
    for src in (1, 3):
        assert core.handle(ByeReceived(src=src)) == []
    assert core.handle(ByeReceived(src=5)) == [ServerDone()]


def test_the_model_is_at_rest_except_while_a_served_average_is_written():
    """What a snapshot or checkpoint waits for: only a serve writes the model off the
    training thread (its own step and a naive worker's request in flight do not)."""
    passive, naive = _core(2, [1, 3]), _core(0, [1], naive=True)
    assert passive.model_at_rest
    passive.handle(RequestReceived(src=1))
    assert not passive.model_at_rest
    passive.handle(IterationStarted(iteration=1))
    passive.handle(ComputeFinished(iteration=1))
    passive.handle(RequestReceived(src=3))
    passive.handle(Served(src=1))  # the trainer's step first, then the queued serve
    assert passive.holder is Holder.STEP and passive.model_at_rest
    passive.handle(StepFinished(iteration=1, wants_stop=False))
    assert passive.serving == 3 and not passive.model_at_rest
    passive.handle(Served(src=3))
    assert passive.model_at_rest
    naive.handle(IterationStarted(iteration=1))
    assert naive.holder is Holder.REQUEST and naive.model_at_rest


def test_naive_workers_that_pick_each_other_wait_forever_and_it_shows():
    a, b = _core(0, [1], naive=True), _core(1, [0], naive=True)
    [to_b] = a.handle(IterationStarted(iteration=1))
    [to_a] = b.handle(IterationStarted(iteration=1))
    assert (to_b.partner, to_a.partner) == (1, 0)
    assert a.handle(RequestReceived(src=1)) == [] and b.handle(RequestReceived(src=0)) == []
    a.handle(ComputeFinished(iteration=1))
    b.handle(ComputeFinished(iteration=1))
    for core, other in ((a, 1), (b, 0)):  # each waits for the other, which cannot serve it
        assert core.awaiting_reply_from == other and core.queued == (other,)
        assert core.holder is Holder.REQUEST
        assert core.state is ADPSGDState.FINISHING


def test_naive_request_waits_for_the_serve_in_progress():
    core = _core(0, [1, 2], naive=True, seed=1)
    assert core.handle(RequestReceived(src=1)) == [Serve(client=1)]
    assert core.handle(IterationStarted(iteration=1)) == []
    partner = core.deferred
    assert core.handle(Served(src=1)) == [SendRequest(partner=partner, iteration=1)]
    assert core.handle(RequestReceived(src=2 if partner == 1 else 1)) == []  # lock held
    core.handle(ComputeFinished(iteration=1))
    assert core.handle(ReplyReceived(src=partner)) == [LoadAverage(partner=partner),
                                                       StepGranted(iteration=1)]


def test_leaving_with_a_request_in_flight_loads_its_reply_then_says_goodbye():
    core = _core(1, [0, 2])
    [request] = core.handle(IterationStarted(iteration=1))
    assert core.handle(Leave()) == []
    assert core.handle(ReplyReceived(src=request.partner)) == [
        LoadAverage(partner=request.partner), SendBye(to=(0, 2))]
    assert core.state is ADPSGDState.DONE


def test_refused(assert_refused):
    started = IterationStarted(iteration=1)
    assert_refused(_core(1, [0]), [ReplyReceived(src=0)], RemoteProtocolError,
                   "awaiting a reply from None", then=started)
    assert_refused(_core(2, [1]), [RequestReceived(src=3)], RemoteProtocolError,
                   "not a client", then=started)
    assert_refused(_core(2, [1]), [RequestReceived(src=1), RequestReceived(src=1)],
                   RemoteProtocolError, "unanswered", then=started)
    assert_refused(_core(2, [1]), [ByeReceived(src=1), RequestReceived(src=1)],
                   RemoteProtocolError, "said goodbye", then=started)
    assert_refused(_core(2, [1]), [Served(src=1)], LocalProtocolError, "lock FREE",
                   then=started)
    assert_refused(_core(1, [0]), [ComputeFinished(iteration=1)], LocalProtocolError,
                   "state IDLE", then=started)
    assert_refused(_core(1, [0]), [started, ComputeFinished(iteration=1), Leave()],
                   LocalProtocolError, "state FINISHING", then=started)


@pytest.mark.parametrize("max_gap", [0, 1, 3])
@pytest.mark.parametrize("seed", range(3))
def test_bipartite_random_run_conserves_the_sum_and_never_deadlocks(seed, max_gap):
    """Event simulation, lr 0: models are numbers; messages arrive in random order. With a
    bounded lead, no passive worker steps further ahead of a live client than `max_gap`."""
    world, rng = 8, random.Random(seed)
    neighbours = {r: [(r - 1) % world, (r + 1) % world] for r in range(world)}
    cores = [_core(r, neighbours[r], seed=seed, max_gap=max_gap) for r in range(world)]
    said_bye: set[int] = set()
    x = [float(r) for r in range(world)]
    sent: dict[int, float] = {}  # the model each active worker sent with its request
    replies: dict[int, float] = {}
    inbox: deque = deque()  # (rank, event) not yet delivered
    todo = {r: 40 for r in range(world)}  # iterations left

    def run(rank, decisions):
        for d in decisions:
            if isinstance(d, SendRequest):
                sent[rank] = x[rank]
                inbox.append((d.partner, RequestReceived(src=rank, iteration=d.iteration)))
            elif isinstance(d, Serve):
                x[rank] = (x[rank] + sent[d.client]) / 2
                replies[d.client] = x[rank]
                run(rank, cores[rank].handle(Served(src=d.client)))
                inbox.append((d.client, ReplyReceived(src=rank)))
            elif isinstance(d, LoadAverage):
                x[rank] = replies.pop(rank)
            elif isinstance(d, StepGranted):
                if max_gap and cores[rank].passive:
                    behind = [c for c in cores[rank].clients if c not in said_bye
                              and cores[rank].client_iteration[c] < d.iteration - max_gap]
                    assert not behind, (rank, d.iteration, behind)
                run(rank, cores[rank].handle(StepFinished(iteration=d.iteration,
                                                          wants_stop=False)))
                todo[rank] -= 1
                if todo[rank]:
                    inbox.append((rank, "next"))
                else:
                    run(rank, cores[rank].handle(Leave()))
            elif isinstance(d, SendBye):
                inbox.extend((j, ByeReceived(src=rank)) for j in d.to)
        if cores[rank].state is ADPSGDState.DONE:
            said_bye.add(rank)

    for r in range(world):
        inbox.append((r, "next"))
    while inbox:
        rank, event = inbox[rng.randrange(len(inbox))]
        inbox.remove((rank, event))
        if event == "next":
            k = cores[rank].iteration + 1
            run(rank, cores[rank].handle(IterationStarted(iteration=k)))
            run(rank, cores[rank].handle(ComputeFinished(iteration=k)))
        else:
            run(rank, cores[rank].handle(event))
    assert all(c.state is ADPSGDState.DONE for c in cores) and not any(todo.values())
    assert sum(x) == pytest.approx(sum(range(world)))
    assert all(c.remaining_clients == 0 for c in cores)


# --- a lost peer (--on-failure continue) -------------------------------------------------
def test_active_worker_chooses_a_lost_partner_no_more():
    core = _core(1, [0, 2])
    core.handle(PeerLost(rank=0))
    for k in range(1, 20):
        assert core.handle(IterationStarted(iteration=k)) == [SendRequest(partner=2, iteration=k)]
        core.handle(ComputeFinished(iteration=k))
        core.handle(ReplyReceived(src=2))
        core.handle(StepFinished(iteration=k, wants_stop=False))


def test_a_request_to_a_partner_lost_before_replying_ends_without_an_average():
    core = _core(1, [0])
    core.handle(IterationStarted(iteration=1))
    core.handle(ComputeFinished(iteration=1))
    assert core.handle(ReplyLost(src=0)) == [StepGranted(iteration=1)]  # no LoadAverage
    core.handle(PeerLost(rank=0))
    core.handle(StepFinished(iteration=1, wants_stop=False))
    assert core.handle(IterationStarted(iteration=2)) == []  # no partner left: trains alone


def test_passive_server_is_done_once_its_clients_left_or_were_lost():
    core = _core(2, [1, 3])
    assert core.handle(RequestReceived(src=3)) == [Serve(client=3)]
    assert core.handle(PeerLost(rank=3)) == []  # its request, already in, is served
    assert core.handle(Served(src=3)) == []
    assert core.handle(PeerLost(rank=1)) == [ServerDone()]
    assert core.handle(PeerLost(rank=1)) == []  # told twice: once counts


def test_a_request_or_goodbye_from_a_client_already_lost_is_dropped_not_refused():
    """The driver hands over whatever arrives; a message a client sent before it was declared
    lost may come after `PeerLost` (review 3, snippet 2): it has no decision, and the worker
    goes on serving its other clients."""
    core = _core(0, [1, 3])
    assert core.handle(PeerLost(rank=1)) == []
    assert core.handle(RequestReceived(src=1)) == []
    assert core.queued == () and core.holder is Holder.FREE
    assert core.handle(ByeReceived(src=1)) == []
    assert core.handle(RequestReceived(src=3)) == [Serve(client=3)]
    assert core.handle(Served(src=3)) == []
    assert core.handle(ByeReceived(src=3)) == [ServerDone()]


# --- a bounded lead (--adpsgd-max-gap) ---------------------------------------------------
def test_a_passive_step_waits_for_its_clients_within_the_gap_and_serves_meanwhile():
    core = _core(2, [1, 3], max_gap=1)
    assert core.handle(RequestReceived(src=1, iteration=1)) == [Serve(client=1)]
    assert core.handle(Served(src=1)) == []
    core.handle(IterationStarted(iteration=1))
    assert core.handle(ComputeFinished(iteration=1)) == [StepGranted(iteration=1)]  # 1 - 0
    core.handle(StepFinished(iteration=1, wants_stop=False))
    core.handle(IterationStarted(iteration=2))
    assert core.handle(ComputeFinished(iteration=2)) == []  # client 3 still at 0
    assert core.held_for == (3,) and core.holder is Holder.FREE
    assert core.handle(RequestReceived(src=1, iteration=2)) == [Serve(client=1)]  # meanwhile
    assert core.handle(Served(src=1)) == []
    assert core.handle(RequestReceived(src=3, iteration=1)) == [StepGranted(iteration=2)]
    assert core.handle(StepFinished(iteration=2, wants_stop=False)) == [
        Finish(iteration=2, stop=False), Serve(client=3)]


def test_a_client_that_leaves_no_longer_holds_the_step():
    core = _core(2, [1, 3], max_gap=1)
    core.handle(RequestReceived(src=1, iteration=5))
    core.handle(Served(src=1))
    core.handle(IterationStarted(iteration=3))
    assert core.handle(ComputeFinished(iteration=3)) == [] and core.held_for == (3,)
    assert core.handle(ByeReceived(src=3)) == [StepGranted(iteration=3)]


def test_a_bounded_lead_is_refused_in_naive_mode_and_a_request_going_back_is_remote():
    with pytest.raises(ValueError, match="bipartite"):
        _core(2, [1, 3], naive=True, max_gap=2)
    core = _core(2, [1, 3], max_gap=2)
    core.handle(RequestReceived(src=1, iteration=5))
    core.handle(Served(src=1))
    with pytest.raises(RemoteProtocolError, match="iteration 4 after its 5"):
        core.handle(RequestReceived(src=1, iteration=4))
