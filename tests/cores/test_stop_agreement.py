from __future__ import annotations

import math
import random

import networkx as nx
import pytest

from hetsync.cores.stop_agreement import StopAgreement


def _simulate(graph: nx.Graph, deciders: dict[int, int], max_iterations: int | None = None):
    """Synchronous rounds: message k carries stop_at known when iteration k starts."""
    hops = nx.diameter(graph)
    cores = {n: StopAgreement(hops, max_iterations) for n in graph}
    stopped: dict[int, int] = {}
    k = 1
    while len(stopped) < len(cores):
        sent = {n: c.stop_at for n, c in cores.items() if n not in stopped}
        for n, core in cores.items():
            if n in stopped:
                continue
            if deciders.get(n) == k:
                core.vote(k)
            for peer in graph[n]:
                assert peer in sent, f"rank {n} waits at {k} for {peer}, which stopped"
                core.merge(sent[peer])
            if core.should_stop(k):
                stopped[n] = k
        k += 1
    return stopped


@pytest.mark.parametrize("seed", range(20))
def test_everyone_stops_after_the_same_iteration(seed):
    rng = random.Random(seed)
    graph = nx.connected_watts_strogatz_graph(rng.randint(3, 30), 2, 0.3, seed=seed)
    deciders = {rng.randrange(len(graph)): rng.randint(1, 20) for _ in range(rng.randint(1, 4))}
    stopped = _simulate(graph, deciders)
    assert len(set(stopped.values())) == 1
    first = min(deciders.values())
    assert set(stopped.values()) == {first + 1 + nx.diameter(graph)}


def test_max_iterations_is_the_stop_without_flooding():
    stopped = _simulate(nx.path_graph(5), {2: 10}, max_iterations=7)
    assert set(stopped.values()) == {7}


def test_fresh_core_never_stops():
    core = StopAgreement(hops=3)
    assert core.stop_at == math.inf and not core.should_stop(10**9)
    with pytest.raises(ValueError, match="hops"):
        StopAgreement(hops=-1)
