"""The messages each communication of hetsync really sends, for the cost model.

A collective is charged as the messages of its algorithm, never as a formula of its own, so
that every protocol pays by the same rule (`NetworkModel`). `nbytes` is the size of the buffer
being reduced or sent, as declared (`--payload`) rather than as the workload's model weighs.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetsync.network.model import Message

__all__ = [
    "fan_out", "leader_reduce", "mesh_reduce", "point_to_point", "push_pull", "ring_allreduce",
    "scatter_gather",
]


def point_to_point(src: int, dst: int, nbytes: float) -> list[Message]:
    return [Message(src, dst, nbytes)]


def push_pull(worker: int, partner: int, nbytes: float, reply_bytes: float | None = None) -> list[
        Message]:
    """A request of `nbytes` and the reply it waits for (AD-PSGD's average, a ps push/pull)."""
    reply = nbytes if reply_bytes is None else reply_bytes
    return [Message(worker, partner, nbytes), Message(partner, worker, reply, after=(0,))]


def fan_out(src: int, dsts: Sequence[int], nbytes: float) -> list[Message]:
    """One buffer to each of `dsts` (Hop's updates, D-PSGD's model to its out-peers)."""
    return [Message(src, d, nbytes) for d in dsts]


def ring_allreduce(ranks: Sequence[int], nbytes: float) -> list[Message]:
    """Reduce-scatter then all-gather around `ranks`: 2(k-1) steps of nbytes/k per member, each
    member's step s+1 waiting for what it received in step s."""
    k = len(ranks)
    if k < 2:
        return []
    chunk = nbytes / k
    messages: list[Message] = []
    received: dict[int, int] = {}  # member position -> index of its last received message
    for _ in range(2 * (k - 1)):
        step: dict[int, int] = {}
        for p, src in enumerate(ranks):
            after = (received[p],) if p in received else ()
            step[(p + 1) % k] = len(messages)
            messages.append(Message(src, ranks[(p + 1) % k], chunk, after))
        received = step
    return messages


def mesh_reduce(ranks: Sequence[int], nbytes: float) -> list[Message]:
    """Every member sends its whole buffer to every other member, in one round; listed as k-1
    shifts (each member to the one r places on), the order in which the k(k-1) transfers
    share the NICs without idling any."""
    k = len(ranks)
    return [Message(ranks[p], ranks[(p + r) % k], nbytes) for r in range(1, k) for p in range(k)]


def leader_reduce(ranks: Sequence[int], nbytes: float) -> list[Message]:
    """The members send to the first, which sends the sum back once it has them all."""
    leader, rest = ranks[0], list(ranks[1:])
    gathers = [Message(r, leader, nbytes) for r in rest]
    after = tuple(range(len(gathers)))
    return gathers + [Message(leader, r, nbytes, after) for r in rest]


def scatter_gather(ranks: Sequence[int], nbytes: float) -> list[Message]:
    """A reduce-scatter then an all-gather in two rounds of direct messages: every member
    sends each other member that one's k-th of its buffer, then, once it has every share of
    its own k-th, that k-th reduced to every other member (2(k-1)/k of the buffer out per
    member, as a ring, in 2 rounds rather than 2(k-1))."""
    k = len(ranks)
    if k < 2:
        return []
    share = nbytes / k
    first = mesh_reduce(ranks, share)
    into = {r: tuple(i for i, m in enumerate(first) if m.dst == r) for r in ranks}
    return first + [Message(m.src, m.dst, share, into[m.src]) for m in mesh_reduce(ranks, share)]
