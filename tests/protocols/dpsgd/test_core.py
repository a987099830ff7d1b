"""One D-PSGD worker's decisions (exchange, average, stop agreement), without processes."""

from __future__ import annotations

import math
import random

import pytest

from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.dpsgd.core import (
    Average,
    ComputeFinished,
    DPSGDCore,
    Exchange,
    IterationStarted,
    ModelReceived,
    Neighbourhood,
)
from hetsync.topology import one_peer_exponential, ring


def _core(rank=0, world=4, hops=2, max_iterations=None, topology=None):
    topology = topology or ring(world)
    return DPSGDCore(rank, Neighbourhood.of_topology(topology, rank), hops, max_iterations)


def test_an_iteration_sends_x_k_and_averages_once_every_in_neighbour_sent_its_own():
    core = _core()
    assert core.handle(IterationStarted(iteration=1)) == [
        Exchange(iteration=1, send_to=(1, 3), receive_from=(1, 3), stop_at=math.inf)]
    assert core.handle(ModelReceived(src=3, iteration=1, stop_at=math.inf)) == []
    assert core.handle(ComputeFinished(iteration=1, wants_stop=False)) == []
    assert core.waiting_for == (1,)
    [average] = core.handle(ModelReceived(src=1, iteration=1, stop_at=math.inf))
    self_weight, weights = ring(4).recv_weights(0, 1)
    assert average == Average(iteration=1, self_weight=self_weight, weights=weights, stop=False)


def test_a_message_of_the_next_iteration_waits_for_it():
    core = _core()
    core.handle(IterationStarted(iteration=1))
    core.handle(ComputeFinished(iteration=1, wants_stop=False))
    core.handle(ModelReceived(src=1, iteration=1, stop_at=math.inf))
    assert core.handle(ModelReceived(src=1, iteration=2, stop_at=9)) == []  # neighbour ahead
    assert core.handle(ModelReceived(src=3, iteration=1, stop_at=math.inf))[0].iteration == 1
    assert core.agreement.stop_at == math.inf  # x_2's stop_at is merged when 2 completes
    core.handle(IterationStarted(iteration=2))
    assert core.waiting_for == (3,)
    core.handle(ComputeFinished(iteration=2, wants_stop=False))
    core.handle(ModelReceived(src=3, iteration=2, stop_at=math.inf))
    assert core.agreement.stop_at == 9


def test_time_varying_peers_follow_the_topology_phase_of_each_iteration():
    topology = one_peer_exponential(8)
    core = _core(rank=3, topology=topology)
    for k in range(1, 7):
        [exchange] = core.handle(IterationStarted(iteration=k))
        assert exchange.send_to == tuple(topology.out_peers(3, k))
        assert exchange.receive_from == tuple(topology.in_peers(3, k))
        core.handle(ComputeFinished(iteration=k, wants_stop=False))
        for j in exchange.receive_from:
            decisions = core.handle(ModelReceived(src=j, iteration=k, stop_at=math.inf))
        assert decisions[0].weights == topology.recv_weights(3, k)[1]


@pytest.mark.parametrize("max_iterations", [None, 12])
def test_every_worker_stops_after_the_same_iteration(max_iterations):
    """Lockstep simulation with random delivery order; rank 2 votes at iteration 5."""
    world, rng = 6, random.Random(1)
    cores = [_core(rank, world, hops=3, max_iterations=max_iterations) for rank in range(world)]
    stopped, k = {}, 0
    while len(stopped) < world:
        k += 1
        messages = []
        for core in cores:
            [exchange] = core.handle(IterationStarted(iteration=k))
            messages += [(j, core.rank, exchange.stop_at) for j in exchange.send_to]
            assert core.handle(ComputeFinished(iteration=k, wants_stop=core.rank == 2 and k >= 5)
                               ) == []
        rng.shuffle(messages)
        for dst, src, stop_at in messages:
            for average in cores[dst].handle(ModelReceived(src=src, iteration=k, stop_at=stop_at)):
                if average.stop:
                    stopped[dst] = k
    assert set(stopped.values()) == {min(5 + 1 + 3, max_iterations or math.inf)}


def test_refused(assert_refused):
    msg = ModelReceived(src=1, iteration=1, stop_at=math.inf)
    started = IterationStarted(iteration=1)
    assert_refused(_core(), [started, msg, msg], RemoteProtocolError, "arrived twice", then=started)
    assert_refused(_core(), [ModelReceived(src=2, iteration=1, stop_at=math.inf)],
                   RemoteProtocolError, "not an in-neighbour", then=started)
    assert_refused(_core(world=2), [started, ComputeFinished(iteration=1, wants_stop=False),
                                    msg, msg], RemoteProtocolError, "iteration is over",
                   then=started)
    assert_refused(_core(), [ComputeFinished(iteration=1, wants_stop=False)],
                   LocalProtocolError, "state IDLE", then=started)
    assert_refused(_core(), [started, started], LocalProtocolError, "state COMPUTING",
                   then=msg)
    core = _core(world=1, max_iterations=1)
    core.handle(started)
    assert core.handle(ComputeFinished(iteration=1, wants_stop=False))[0].stop
    with pytest.raises(LocalProtocolError, match="DONE"):
        core.handle(IterationStarted(iteration=2))
    with pytest.raises(ValueError, match="in-neighbours"):
        DPSGDCore(0, [Neighbourhood(in_peers=(1,), out_peers=(1,), self_weight=1.0,
                                    weights={})], hops=1)
