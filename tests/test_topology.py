from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from hetsync.errors import ConfigError
from hetsync.topology import (
    Topology,
    TopologyError,
    bipartite_exponential,
    build,
    complete,
    directed_ring,
    exponential,
    from_edges_file,
    one_peer_exponential,
    passive_ranks,
    ring,
    torus,
)

WORLDS = range(1, 18)
EVEN_WORLDS = range(2, 18, 2)
STATIC = [ring, directed_ring, torus, exponential, complete]


def builders_and_worlds():
    for builder in [*STATIC, one_peer_exponential]:
        for world in WORLDS:
            yield pytest.param(builder, world, id=f"{builder.__name__}-{world}")
    for world in EVEN_WORLDS:
        yield pytest.param(bipartite_exponential, world, id=f"bipartite_exponential-{world}")


def edges_file(tmp_path, text: str, name: str = "edges.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def undirected_lines(pairs) -> str:
    return "".join(f"{a} {b}\n{b} {a}\n" for a, b in pairs)


def out_degrees(topology: Topology) -> set[int]:
    return {topology.graph.out_degree(r) for r in range(topology.world)}


@pytest.mark.parametrize(("builder", "world"), list(builders_and_worlds()))
def test_every_builder_gives_a_valid_connected_graph(builder, world):
    topology = builder(world)
    graph = topology.graph
    assert topology.world == world
    assert sorted(graph.nodes) == list(range(world))
    assert nx.number_of_selfloops(graph) == 0
    assert nx.is_strongly_connected(graph)
    if not topology.directed:
        assert nx.is_connected(graph.to_undirected())
        assert all(graph.has_edge(v, u) for u, v in graph.edges)
    for t in range(topology.period):
        w = topology.mixing_matrix(t)
        assert np.allclose(w.sum(axis=1), 1.0, atol=1e-12)
        assert (w >= 0).all()
        for rank in range(world):
            own, shares = topology.recv_weights(rank, t)
            assert list(shares) == topology.in_peers(rank, t)
            assert w[rank, rank] == own and all(w[rank, j] == s for j, s in shares.items())
            for peer in topology.out_peers(rank, t):
                assert rank in topology.in_peers(peer, t)


def test_single_rank_has_no_edges_and_keeps_its_model():
    for builder in [*STATIC, one_peer_exponential]:
        topology = builder(1)
        assert topology.graph.number_of_edges() == 0
        assert topology.recv_weights(0) == (1.0, {})


@pytest.mark.parametrize("world", range(3, 18))
def test_ring_degree_two(world):
    topology = ring(world)
    assert all(topology.in_peers(r) == sorted({(r - 1) % world, (r + 1) % world})
               for r in range(world))
    assert out_degrees(topology) == {2}
    assert not topology.directed and not topology.dynamic


def test_small_rings():
    assert sorted(ring(2).graph.edges) == [(0, 1), (1, 0)]
    assert ring(2).recv_weights(0) == (0.5, {1: 0.5})
    assert directed_ring(4).out_peers(3) == [0] and directed_ring(4).in_peers(3) == [2]
    assert directed_ring(4).directed
    assert not directed_ring(2).directed  # 0->1 and 1->0: every edge has its reverse


def test_torus_shapes():
    four = torus(16)
    assert four.name == "torus:4x4" and out_degrees(four) == {4}
    assert four.in_peers(5) == [1, 4, 6, 9]
    assert torus(12).name == "torus:3x4"
    assert torus(7).name == "torus:1x7" and out_degrees(torus(7)) == {2}
    two = torus(8, rows=2)  # up and down are the same rank: one edge, not two
    assert two.name == "torus:2x4" and out_degrees(two) == {3}
    assert build("torus:2x3", 6).name == "torus:2x3"
    with pytest.raises(TopologyError, match="torus 3x3 has 9 ranks, but world is 8"):
        build("torus:3x3", 8)
    with pytest.raises(TopologyError, match="rows=3 does not divide world 8"):
        torus(8, rows=3)
    with pytest.raises(TopologyError, match="bad torus shape"):
        build("torus:4by4", 16)


@pytest.mark.parametrize("world", range(2, 18))
def test_exponential_degrees(world):
    topology = exponential(world)
    degree = math.floor(math.log2(world - 1)) + 1
    assert out_degrees(topology) == {degree}
    assert topology.out_peers(0) == sorted({2**k % world for k in range(degree)})
    assert topology.is_doubly_stochastic()


@pytest.mark.parametrize("world", WORLDS)
def test_complete_degree(world):
    assert out_degrees(complete(world)) == {world - 1}
    assert complete(world).is_doubly_stochastic()


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("builder", [ring, torus, complete, exponential])
def test_uniform_weights_on_regular_graphs_are_doubly_stochastic(builder, world):
    topology = builder(world)
    assert topology.is_doubly_stochastic()
    topology.require_doubly_stochastic()


@pytest.mark.parametrize("world", range(2, 18))
def test_one_peer_exponential_rotates_one_peer(world):
    topology = one_peer_exponential(world)
    m = math.floor(math.log2(world - 1)) + 1
    assert topology.dynamic and topology.period == m
    for t in range(3 * m):
        offset = 2 ** (t % m)
        assert topology.is_doubly_stochastic(t)
        for rank in range(world):
            assert topology.out_peers(rank, t) == [(rank + offset) % world]
            assert topology.in_peers(rank, t) == [(rank - offset) % world]
            assert topology.recv_weights(rank, t) == (0.5, {(rank - offset) % world: 0.5})
            assert topology.out_peers(rank, t) == topology.out_peers(rank, t + m)
    if world >= 3:  # peers rotate: a period visits m distinct peers
        assert len({topology.out_peers(0, t)[0] for t in range(m)}) == m
    union = {(r, (r + 2**k) % world) for r in range(world) for k in range(m)}
    assert set(topology.graph.edges) == union
    topology.require_doubly_stochastic()


def test_static_topologies_are_not_dynamic():
    assert not any(builder(8).dynamic for builder in STATIC)
    assert ring(8).period == 1


@pytest.mark.parametrize("world", EVEN_WORLDS)
def test_bipartite_exponential_joins_even_and_odd(world):
    topology = bipartite_exponential(world)
    assert all((u + v) % 2 == 1 for u, v in topology.graph.edges)
    assert topology.passive == frozenset(range(0, world, 2)) == passive_ranks(topology)
    assert not topology.directed
    assert topology.is_doubly_stochastic()


def test_bipartite_exponential_peers_of_sixteen():
    assert bipartite_exponential(16).in_peers(0) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert bipartite_exponential(12).in_peers(4) == [1, 3, 5, 7, 9, 11]


@pytest.mark.parametrize("world", [1, 3, 5, 9, 17])
def test_bipartite_exponential_rejects_an_odd_world(world):
    with pytest.raises(TopologyError, match=f"even world >= 2, got {world}: .*same parity"):
        bipartite_exponential(world)


def test_other_topologies_have_no_passive_ranks():
    assert all(passive_ranks(builder(8)) == frozenset() for builder in STATIC)


@pytest.mark.parametrize("pairs", [[(0, 1), (0, 2), (0, 3), (0, 4)],  # star
                                   [(0, 1), (1, 2), (2, 3), (3, 4)]],  # path
                         ids=["star", "path"])
def test_metropolis_fixes_irregular_graphs(tmp_path, pairs):
    path = edges_file(tmp_path, undirected_lines(pairs))
    metropolis = from_edges_file(path, 5, weights="metropolis")
    w = metropolis.mixing_matrix()
    assert metropolis.is_doubly_stochastic() and np.allclose(w, w.T)
    metropolis.require_doubly_stochastic()
    uniform = build(f"edges:{path}", 5)
    assert np.allclose(uniform.mixing_matrix().sum(axis=1), 1.0)
    assert not uniform.is_doubly_stochastic()
    with pytest.raises(TopologyError, match="not doubly stochastic: rank .* metropolis"):
        uniform.require_doubly_stochastic()


def test_metropolis_weights_of_a_star(tmp_path):
    path = edges_file(tmp_path, undirected_lines([(0, 1), (0, 2), (0, 3)]))
    star = build(f"edges:{path}", 4, weights="metropolis")
    assert star.recv_weights(0) == (0.25, {1: 0.25, 2: 0.25, 3: 0.25})
    assert star.recv_weights(2) == (0.75, {0: 0.25})


@pytest.mark.parametrize("builder", [ring, torus, exponential, one_peer_exponential, complete])
@pytest.mark.parametrize("world", [2, 5, 8, 12, 17])
def test_gossip_keeps_the_sum_and_reaches_the_mean(builder, world):
    topology = builder(world)
    x = np.random.default_rng(world).normal(size=(world, 3))
    total, mean = x.sum(axis=0), x.mean(axis=0)
    matrices = [topology.mixing_matrix(t) for t in range(topology.period)]
    for t in range(3000):
        x = matrices[t % topology.period] @ x
        assert np.allclose(x.sum(axis=0), total, rtol=0, atol=1e-9)
    assert np.allclose(x, mean, rtol=0, atol=1e-9)


def test_one_peer_exponential_averages_exactly_in_one_period_for_powers_of_two():
    topology = one_peer_exponential(16)
    x = np.random.default_rng(0).normal(size=16)
    for t in range(topology.period):
        x = topology.mixing_matrix(t) @ x
    assert np.allclose(x, x.mean(), rtol=0, atol=1e-12)


def test_edges_file_formats(tmp_path):
    path = edges_file(tmp_path, "# a ring of 3\n0,1\n1 2  # trailing comment\n\n2\t0\n")
    topology = from_edges_file(path, 3)
    assert topology.directed and topology.name == f"edges:{path}"
    assert topology.out_peers(2) == [0]
    both = from_edges_file(edges_file(tmp_path, undirected_lines([(0, 1), (1, 2)]), "u.txt"), 3)
    assert not both.directed


def test_edges_file_weights_are_used_only_when_every_row_has_one(tmp_path):
    weighted = edges_file(tmp_path, "0 1 0.25\n1 0 0.5\n", "weighted.csv")
    topology = from_edges_file(weighted, 2)
    assert topology.recv_weights(1) == (0.75, {0: 0.25})
    assert topology.recv_weights(0) == (0.5, {1: 0.5})
    partial = edges_file(tmp_path, "0 1 0.25\n1 0\n", "partial.csv")
    assert from_edges_file(partial, 2).recv_weights(1) == (0.5, {0: 0.5})
    with pytest.raises(TopologyError, match="sets its own weights"):
        from_edges_file(weighted, 2, weights="metropolis")
    heavy = edges_file(tmp_path, "0 2 0.75\n1 2 0.5\n2 0 1\n2 1 1\n", "heavy.csv")
    with pytest.raises(TopologyError, match="weights of rank 2 sum to 1.25, not 1"):
        from_edges_file(heavy, 3)


@pytest.mark.parametrize(
    ("text", "world", "fragment"),
    [
        ("0 1\n1 0\n2 3\n3 2\n", 4, "disconnected: rank 2 cannot be reached from rank 0"),
        ("0 1\n1 2\n", 3, "not strongly connected: rank 0 cannot be reached from rank 1"),
        ("0 1\n1 0\n", 3, "disconnected: rank 2 cannot be reached from rank 0"),
        ("0 1\n3 3\n", 4, "line 2: self loop on rank 3"),
        ("0 1\n2 9\n", 8, "line 2: edge 2->9: rank 9 is outside 0..7"),
        ("0 -1\n", 8, "edge 0->-1: rank -1 is outside 0..7"),
        ("0 1 2 3\n", 4, "line 1: expected 'src dst \\[weight\\]'"),
        ("zero one\n", 4, "expected 'src dst"),
        ("", 2, "disconnected: rank 1 cannot be reached"),
    ],
)
def test_bad_edges_files(tmp_path, text, world, fragment):
    with pytest.raises(TopologyError, match=fragment):
        from_edges_file(edges_file(tmp_path, text), world)


def test_missing_edges_file(tmp_path):
    with pytest.raises(TopologyError, match="edges file .* not found"):
        build(f"edges:{tmp_path / 'nope.csv'}", 4)


def test_a_hand_built_topology_is_checked_too():
    graph = nx.DiGraph([(0, 1), (1, 0), (3, 3), (2, 3), (3, 2), (1, 2), (2, 1)])
    with pytest.raises(TopologyError, match="topology 'mine': self loop on rank 3"):
        Topology("mine", 4, graph)
    unweighted = nx.DiGraph([(0, 1), (1, 0)])
    with pytest.raises(TopologyError, match="rank 0 lacks a self_weight"):
        Topology("mine", 2, unweighted)
    with pytest.raises(TopologyError, match="rank 2 is missing"):
        Topology("mine", 3, ring(2).graph.copy())


def test_topologies_are_immutable():
    topology = ring(4)
    with pytest.raises(nx.NetworkXError):
        topology.graph.add_edge(0, 2)
    with pytest.raises(AttributeError):
        topology.world = 5  # type: ignore[misc]


def test_require_undirected():
    ring(5).require_undirected()
    bipartite_exponential(6).require_undirected()
    for topology in (directed_ring(4), exponential(5), one_peer_exponential(3)):
        with pytest.raises(TopologyError, match="is directed \\(edge .* has no reverse\\)"):
            topology.require_undirected()


def test_metropolis_on_directed_graph_is_refused():
    with pytest.raises(TopologyError, match="metropolis weights need an undirected graph"):
        directed_ring(4, weights="metropolis")
    with pytest.raises(TopologyError, match="edge 0->1 without its reverse"):
        build("one-peer-exponential", 4, weights="metropolis")
    assert np.allclose(ring(6, weights="metropolis").mixing_matrix(), ring(6).mixing_matrix())


def test_build_names_every_topology():
    assert [build(spec, 8).name for spec in (
        "ring", "directed-ring", "torus", "exponential", "one-peer-exponential", "complete",
        "bipartite-exponential",
    )] == ["ring", "directed-ring", "torus:2x4", "exponential", "one-peer-exponential",
           "complete", "bipartite-exponential"]


@pytest.mark.parametrize("spec", ["star", "ring:3", "edges:", "Ring"])
def test_unknown_topology_lists_the_known_ones(spec):
    with pytest.raises(TopologyError, match="unknown topology .*known: ring, directed-ring"):
        build(spec, 8)


def test_bad_weights_and_world():
    with pytest.raises(TopologyError, match="unknown weights 'max'; known: uniform, metropolis"):
        build("ring", 4, weights="max")
    with pytest.raises(TopologyError, match="world must be >= 1, got 0"):
        build("ring", 0)
    with pytest.raises(TopologyError, match="rank 4 is outside 0..3"):
        ring(4).in_peers(4)


def test_topology_error_is_a_config_error_and_a_value_error():
    assert issubclass(TopologyError, ConfigError) and issubclass(TopologyError, ValueError)
