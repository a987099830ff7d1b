"""Communication graphs and mixing weights for decentralized training (D-PSGD, AD-PSGD, Hop).

Conventions:

* Ranks are the nodes 0..world-1 of a `networkx.DiGraph` without self loops. An edge ``i -> j``
  means *i sends its model to j*: j's in-peers are the ranks it averages with, i's out-peers the
  ranks it must send to.
* Weights live on the receiving side: edge ``j -> i`` carries ``weight``, the share rank i gives
  to j's model, and node i carries ``self_weight``. In the mixing matrix ``W[i, j]`` is that
  share and ``W[i, i]`` the self weight, so one gossip step is ``x <- W @ x`` and every row of W
  sums to 1. Gossip keeps the sum of the models (and so converges to their exact mean) only when
  the columns sum to 1 too, i.e. when W is doubly stochastic.
* `directed` describes the edges, not the builder: a graph where every edge has its reverse is
  undirected (so ``directed_ring(2)`` is undirected).
* A dynamic topology (one-peer-exponential) cycles through `phases`; iteration t uses phase
  ``t % period``. Its `graph` holds the union of the phases' edges with period-averaged weights.
* A `Topology` checks itself when built, so an invalid one never exists; problems raise
  `TopologyError` with a one-line message naming the ranks involved.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import numpy as np

from hetsync.errors import ConfigError
from hetsync.user_files import read_user_text

__all__ = [
    "TOPOLOGIES", "WEIGHTS", "Topology", "TopologyError", "bipartite_exponential", "build",
    "complete", "directed_ring", "exponential", "from_edges_file", "one_peer_exponential",
    "passive_ranks", "ring", "torus",
]

TOPOLOGIES = (
    "ring", "directed-ring", "torus[:ROWSxCOLS]", "exponential", "one-peer-exponential",
    "complete", "bipartite-exponential", "edges:FILE",
)
WEIGHTS = ("uniform", "metropolis")
_TOL = 1e-9


class TopologyError(ConfigError):
    """A topology, its spec or its weights are invalid (a ValueError); the message is one line."""


@dataclass(frozen=True)
class Topology:
    """A validated communication graph with its mixing weights; see the module docstring."""

    name: str
    world: int
    graph: nx.DiGraph = field(repr=False)
    phases: tuple[nx.DiGraph, ...] = field(default=(), repr=False)
    passive: frozenset[int] = frozenset()
    directed: bool = field(init=False)
    dynamic: bool = field(init=False)

    def __post_init__(self) -> None:
        _check_world(self.world)
        where = f"topology {self.name!r}: "
        for graph in (self.graph, *self.phases):
            _check_graph(graph, self.world, where)
        union = {edge for phase in self.phases for edge in phase.edges}
        if self.phases and union != set(self.graph.edges):
            raise TopologyError(f"{where}graph is not the union of the phases' edges")
        if not self.passive <= set(range(self.world)):
            raise TopologyError(f"{where}passive ranks {sorted(self.passive)} exceed the world")
        directed = any(_one_way_edge(g) for g in (self.graph, *self.phases))
        object.__setattr__(self, "directed", directed)
        object.__setattr__(self, "dynamic", bool(self.phases))
        _check_connected(self.graph, where, directed)
        for graph in (self.graph, *self.phases):
            nx.freeze(graph)

    @property
    def period(self) -> int:
        """After how many iterations the peers repeat (1 for a static topology)."""
        return len(self.phases) or 1

    def graph_at(self, iteration: int = 0) -> nx.DiGraph:
        """The graph (with weights) that iteration `iteration` communicates over."""
        return self.phases[iteration % len(self.phases)] if self.phases else self.graph

    def in_peers(self, rank: int, iteration: int = 0) -> list[int]:
        """Ranks whose models `rank` receives and mixes in at `iteration`."""
        return sorted(self.graph_at(iteration).predecessors(self._rank(rank)))

    def out_peers(self, rank: int, iteration: int = 0) -> list[int]:
        """Ranks `rank` sends its model to at `iteration`."""
        return sorted(self.graph_at(iteration).successors(self._rank(rank)))

    def recv_weights(self, rank: int, iteration: int = 0) -> tuple[float, dict[int, float]]:
        """(self weight, {in-peer: weight}) that `rank` averages with at `iteration`."""
        graph = self.graph_at(iteration)
        own = graph.nodes[self._rank(rank)]["self_weight"]
        return own, {j: graph.edges[j, rank]["weight"] for j in sorted(graph.predecessors(rank))}

    def mixing_matrix(self, iteration: int = 0) -> np.ndarray:
        """W with W[i, j] the weight rank i gives rank j's model; rows sum to 1."""
        return _matrix(self.graph_at(iteration), self.world)

    def is_doubly_stochastic(self, iteration: int = 0, tol: float = 1e-9) -> bool:
        """Whether gossip at `iteration` keeps the sum (columns of W also sum to 1)."""
        return bool(np.allclose(self.mixing_matrix(iteration).sum(axis=0), 1.0, rtol=0, atol=tol))

    def require_undirected(self) -> None:
        """Raise unless every edge of every phase has its reverse (pairwise exchanges need it)."""
        for graph in (*self.phases, self.graph):
            edge = _one_way_edge(graph)
            if edge:
                raise TopologyError(
                    f"topology {self.name!r} is directed (edge {edge[0]}->{edge[1]} has no "
                    f"reverse), but an undirected topology is required"
                )

    def require_doubly_stochastic(self) -> None:
        """Raise unless every phase's W keeps the sum of the models (exact averaging needs it)."""
        for t in range(self.period):
            columns = self.mixing_matrix(t).sum(axis=0)
            rank = int(np.argmax(np.abs(columns - 1.0)))
            if abs(columns[rank] - 1.0) > _TOL:
                at = f" at iteration {t}" if self.dynamic else ""
                hint = "; metropolis weights would fix it" if not self.directed else ""
                raise TopologyError(
                    f"topology {self.name!r} is not doubly stochastic{at}: rank {rank}'s model "
                    f"gets total weight {columns[rank]:.6g}, not 1{hint}"
                )

    def _rank(self, rank: int) -> int:
        if rank not in range(self.world):
            raise TopologyError(f"rank {rank} is outside 0..{self.world - 1}")
        return rank


def cut_by_loss(topology: Topology) -> tuple[int, str] | None:
    """A rank whose loss would split the others (gossip among the rest could no longer mix
    every model), with what it cuts; None if the graph survives the loss of any one rank."""
    for rank in range(topology.world):
        rest = topology.graph.copy()
        rest.remove_node(rank)
        if len(rest) < 2:
            continue
        try:
            _check_connected(nx.relabel_nodes(rest, {r: i for i, r in enumerate(sorted(rest))}),
                             "", topology.directed)
        except TopologyError as error:
            return rank, str(error).split(":", 1)[0]
    return None


def passive_ranks(topology: Topology) -> frozenset[int]:
    """Ranks that only answer exchanges (AD-PSGD's passive side); empty unless bipartite."""
    return topology.passive


def ring(world: int, weights: str = "uniform") -> Topology:
    """Undirected ring i <-> i±1."""
    return _make("ring", world, _circulant(world, (1, -1)), weights)


def directed_ring(world: int, weights: str = "uniform") -> Topology:
    """Directed ring i -> i+1."""
    return _make("directed-ring", world, _circulant(world, (1,)), weights)


def torus(world: int, rows: int | None = None, weights: str = "uniform") -> Topology:
    """2-D torus of rows x cols = world; rows default to the squarest shape."""
    _check_world(world)
    if rows is None:
        rows = max(d for d in range(1, math.isqrt(world) + 1) if world % d == 0)
    if rows < 1 or world % rows:
        raise TopologyError(f"torus rows={rows} does not divide world {world}")
    cols = world // rows

    def rank(r: int, c: int) -> int:
        return (r % rows) * cols + c % cols

    steps = ((1, 0), (-1, 0), (0, 1), (0, -1))
    edges = [(rank(r, c), rank(r + dr, c + dc)) for r in range(rows) for c in range(cols)
             for dr, dc in steps]
    return _make(f"torus:{rows}x{cols}", world, [(a, b) for a, b in edges if a != b], weights)


def exponential(world: int, weights: str = "uniform") -> Topology:
    """Directed i -> i + 2^k (2^k < world), SGP/BlueFog's ExponentialTwoGraph."""
    return _make("exponential", world, _circulant(world, _powers_of_two(world)), weights)


def one_peer_exponential(world: int, weights: str = "uniform") -> Topology:
    """Dynamic: at iteration t, i -> i + 2^(t mod m); one peer per step, m = #{2^k < world}."""
    _check_world(world)
    name = "one-peer-exponential"
    offsets = _powers_of_two(world) or [0]  # world 1: one phase without edges
    phases = tuple(_weigh(_graph(world, _circulant(world, (o,))), weights, name) for o in offsets)
    average = np.mean([_matrix(phase, world) for phase in phases], axis=0)
    union = _graph(world, [(int(j), int(i), {"weight": float(average[i, j])})
                           for i, j in np.argwhere(average) if i != j])
    nx.set_node_attributes(union, {i: float(average[i, i]) for i in range(world)}, "self_weight")
    return Topology(name, world, union, phases=phases)


def complete(world: int, weights: str = "uniform") -> Topology:
    """Every rank exchanges with every other."""
    return _make("complete", world, _circulant(world, range(1, world)), weights)


def bipartite_exponential(world: int, weights: str = "uniform") -> Topology:
    """AD-PSGD's graph (SGP's DynamicBipartiteExponentialGraph): even ranks passive, odd active.

    Peers are r ± 1 and r ± (1 + 2^i), i = 1..floor(log2(world-1)); the offsets are odd, so in
    an even world every edge joins a passive and an active rank.
    """
    if world % 2 or world < 2:
        why = ": with an odd world the wrap-around joins two ranks of the same parity"
        raise TopologyError(
            f"bipartite-exponential needs an even world >= 2, got {world}{why if world % 2 else ''}"
        )
    odd = [1] + [1 + 2**i for i in range(1, (world - 1).bit_length())]
    edges = _circulant(world, [sign * o for o in odd for sign in (1, -1)])
    return _make("bipartite-exponential", world, edges, weights, frozenset(range(0, world, 2)))


def from_edges_file(path: str | Path, world: int, weights: str = "uniform") -> Topology:
    """Read "src dst [weight]" lines (comma or whitespace separated, '#' comments).

    A weight column is used only when every row has one: then the file fixes the receive weights
    (the weight of src -> dst is dst's share of src's model) and self weights fill rows to 1.
    """
    _check_world(world)
    path = Path(path)
    text = read_user_text(path, "edges file", TopologyError)
    rows: list[tuple[int, int, float | None]] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = [f for f in re.split(r"[,\s]+", line.split("#", 1)[0]) if f]
        where = f"{path} line {number}: "
        if not fields:
            continue
        try:
            if len(fields) not in (2, 3):
                raise ValueError
            src, dst = int(fields[0]), int(fields[1])
            weight = float(fields[2]) if len(fields) == 3 else None
        except ValueError:
            got = line.strip()
            raise TopologyError(f"{where}expected 'src dst [weight]', got {got!r}") from None
        _check_edge(src, dst, world, where)
        rows.append((src, dst, weight))
    name = f"edges:{path}"
    if not rows or any(weight is None for *_, weight in rows):
        return _make(name, world, [(src, dst) for src, dst, _ in rows], weights)
    if weights != "uniform":
        raise TopologyError(f"{path} sets its own weights, so weights={weights!r} cannot apply; "
                            "drop the third column to use it")
    graph = _graph(world, [(src, dst, {"weight": weight}) for src, dst, weight in rows])
    for i in graph:
        inbound = sum(w for *_, w in graph.in_edges(i, data="weight"))
        graph.nodes[i]["self_weight"] = max(0.0, 1.0 - inbound)  # overweight rows fail the check
    return Topology(name, world, graph)


_SIMPLE: dict[str, Callable[[int, str], Topology]] = {
    "ring": ring, "directed-ring": directed_ring, "exponential": exponential,
    "one-peer-exponential": one_peer_exponential, "complete": complete,
    "bipartite-exponential": bipartite_exponential,
}


def build(spec: str, world: int, weights: str = "uniform") -> Topology:
    """Build the topology a `--topology` value names, e.g. ``torus:4x4`` or ``edges:g.csv``."""
    name, sep, arg = spec.strip().partition(":")
    if name == "edges" and arg:
        return from_edges_file(arg, world, weights)
    if name == "torus" and sep:
        shape = re.fullmatch(r"(\d+)x(\d+)", arg)
        if not shape:
            raise TopologyError(f"bad torus shape {arg!r}: expected ROWSxCOLS, e.g. torus:4x4")
        rows, cols = int(shape[1]), int(shape[2])
        if rows * cols != world:
            raise TopologyError(f"torus {arg} has {rows * cols} ranks, but world is {world}")
        return torus(world, rows, weights)
    if name == "torus":
        return torus(world, weights=weights)
    if name in _SIMPLE and not sep:
        return _SIMPLE[name](world, weights)
    raise TopologyError(f"unknown topology {spec!r}; known: {', '.join(TOPOLOGIES)}")


def _make(name: str, world: int, edges: Iterable[tuple[int, int]], weights: str,
          passive: frozenset[int] = frozenset()) -> Topology:
    return Topology(name, world, _weigh(_graph(world, edges), weights, name), passive=passive)


def _graph(world: int, edges: Iterable[tuple]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(range(world))
    graph.add_edges_from(edges)
    return graph


def _circulant(world: int, offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Edges i -> i + offset (mod world), skipping the self loops small worlds produce."""
    offsets = list(offsets)
    return [(i, (i + o) % world) for i in range(world) for o in offsets if (i + o) % world != i]


def _powers_of_two(world: int) -> list[int]:
    return [2**k for k in range(world.bit_length()) if 2**k < world]


def _weigh(graph: nx.DiGraph, weights: str, name: str) -> nx.DiGraph:
    """Set every builder's receive weights the same way, so each row of W sums to 1."""
    if weights not in WEIGHTS:
        raise TopologyError(f"unknown weights {weights!r}; known: {', '.join(WEIGHTS)}")
    if weights == "metropolis" and (edge := _one_way_edge(graph)):
        raise TopologyError(f"metropolis weights need an undirected graph, but topology {name!r} "
                            f"has edge {edge[0]}->{edge[1]} without its reverse")
    for i in graph:
        degree = graph.in_degree(i)
        for j in graph.predecessors(i):
            other = graph.in_degree(j) if weights == "metropolis" else degree
            graph.edges[j, i]["weight"] = 1.0 / (1 + max(degree, other))
        graph.nodes[i]["self_weight"] = 1.0 - sum(w for *_, w in graph.in_edges(i, data="weight"))
    return graph


def _matrix(graph: nx.DiGraph, world: int) -> np.ndarray:
    w = np.zeros((world, world))
    for i, own in graph.nodes(data="self_weight"):
        w[i, i] = own
    for j, i, share in graph.edges(data="weight"):
        w[i, j] = share
    return w


def _one_way_edge(graph: nx.DiGraph) -> tuple[int, int] | None:
    return next(((u, v) for u, v in graph.edges if not graph.has_edge(v, u)), None)


def _check_world(world: int) -> None:
    if world < 1:
        raise TopologyError(f"world must be >= 1, got {world}")


def _check_edge(src: int, dst: int, world: int, where: str = "") -> None:
    for rank in (src, dst):
        if rank not in range(world):
            raise TopologyError(f"{where}edge {src}->{dst}: rank {rank} is outside 0..{world - 1}")
    if src == dst:
        raise TopologyError(f"{where}self loop on rank {src}")


def _check_graph(graph: nx.DiGraph, world: int, where: str) -> None:
    """Ranks are exactly 0..world-1, no self loops, and each rank's weights form a row of W."""
    for src, dst in graph.edges:
        _check_edge(src, dst, world, where)
    odd = set(graph) ^ set(range(world))
    if odd:
        rank = min(odd, key=str)
        state = "missing" if rank in range(world) else f"outside 0..{world - 1}"
        raise TopologyError(f"{where}rank {rank} is {state}")
    for i in range(world):
        own = graph.nodes[i].get("self_weight")
        shares = [w for *_, w in graph.in_edges(i, data="weight")]
        if own is None or None in shares:
            raise TopologyError(f"{where}rank {i} lacks a self_weight or an in-edge weight")
        if own < 0 or any(w <= 0 for w in shares):
            raise TopologyError(f"{where}rank {i} has a negative or zero mixing weight")
        if abs(own + sum(shares) - 1.0) > _TOL:
            raise TopologyError(f"{where}weights of rank {i} sum to {own + sum(shares):.6g}, not 1")


def _check_connected(graph: nx.DiGraph, where: str, directed: bool) -> None:
    """Name a rank gossip can never reach: its model would never be averaged with the rest."""
    reached = nx.descendants(graph, 0) | {0}
    lost = [rank for rank in graph if rank not in reached]
    state = "not strongly connected" if directed else "disconnected"
    if lost:
        raise TopologyError(f"{where}{state}: rank {min(lost)} cannot be reached from rank 0")
    reaching = nx.ancestors(graph, 0) | {0}
    stuck = [rank for rank in graph if rank not in reaching]
    if stuck:
        raise TopologyError(f"{where}{state}: rank 0 cannot be reached from rank {min(stuck)}")
