"""P-Reduce, Prague's partial all-reduce: each member of a group of ranks gets the average of
the members' flat buffers; non-members take no part, and disjoint groups run at the same time.

Four implementations, chosen by name (`make_preducer`); experiments/preduce_options.py measures
them. Each also says which messages it sends (`messages`), so that an emulated network
(hetsync.network) charges it as it really sends:

- ``mesh``: every member sends its buffer to every other member, then sums (one round).
- ``ring``: reduce-scatter then all-gather around the members (2(k-1) rounds of n/k values).
- ``leader``: the members send to the first member, which sends the sum back (two rounds).
- ``subgroup``: a gloo process group of the members only, cached like the prototype's
  communicators, and gloo's C++ all-reduce on it.

- ``auto`` (the default): on an emulated network, for each group size, the one of ``mesh``,
  ``ring`` and ``leader`` whose messages the cost model says finish first (at paper-scale
  payloads ``ring``: 2(k-1)/k of the buffer out per member against mesh's k-1); on a free
  network ``mesh`` for buffers under 4 MiB and ``ring`` from there (`free_network_kind`).
  Every member computes the same choice from the same spec and sizes.

Compressed (`--compress`, a channel whose codec is lossy, hetsync.transport.channel): only
``mesh`` (and ``auto`` is it; a ring's partial sums and a leader's mean would be encoded
again at every hop). Each member sends its model encoded (error feedback: the encoding's
error is added to its next one) and averages the k decoded models, its own decoded as well,
in the model's dtype, so that the members still end bit-identical. Its messages are the
wire's size.

Measured with 8 workers on 2 cores on the small models (svm, cnn, a 0.7 MB ResNet): ``mesh``
is fastest for 2 members and ties with ``leader`` for 3-4; ``leader`` wins at 8 (mesh's
k(k-1) transfers and k-fold sums); a cached ``subgroup`` is 1.4-5x slower (its first use
3-8x) and ``ring`` 2-18x (each round is a scheduler wake-up). Large buffers turn it round:
with 4 workers on 2 cores, groups of 3 and 4, ``mesh`` and ``ring`` tie at 4 MiB, ``ring`` is
1.6-2.2x faster at 16 MiB and 1.8-2.3x with a 45 MB model, where ``mesh`` moves k-1 buffers
each way and passes over the sum k+2 times (`python experiments/preduce_options.py
--workers 4 --group-sizes 3 4 --models 1MB 4MB 16MB mlp-wide`). ``leader`` is as fast as
``ring`` there but loads its first member with 2(k-1) buffers.

Every kind sends through a link (hetsync.transport.links): the p2p kinds on its process group
(the runtime's direct link: the default group, on the GPU under NCCL), whose device the flat
buffer must be on; ``subgroup`` through links of its own, gloo on host memory. Messages are
told apart by peer (disjoint groups share no peer; a worker's groups run in an order all
members agree on) and a tag derived from the group, so that two workers that disagree on the
group time out instead of mixing buffers. Every member sums in the same order, so the members
end with bit-identical buffers. A pair's mean is one pass (`hetsync.transport.links.pair_mean`,
the one every pair's average in hetsync takes), not a sum and a division.

Why ``subgroup`` does not call `dist.new_group(ranks, use_local_synchronization=True)`: torch
2.13 names that group sha1(ranks, number of groups this process holds), so two members with
different histories (the normal case for dynamic groups) wait for different store keys until
the timeout. The group is built instead from a name that all members compute alike: its member
set and how many times this process created that member set (each creation involves every
member, so the count is the same on all of them); re-using a name reads the old group's stale
rendezvous keys and fails with "Connection reset by peer". A per-process LRU cache cannot be used:
a group evicted by one member but kept by another would make the next P-Reduce hang. As in the
prototype, a new group is kept only if no member's cache is full (the members agree with one
tiny all-reduce); otherwise it serves once and is shut down in a thread (gloo's shutdown takes
20-30 ms). Groups are gloo only, and old rendezvous keys stay in the store (a few bytes each).
"""

from __future__ import annotations

import datetime
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import torch
import torch.distributed as dist

from hetsync.errors import ConfigError
from hetsync.network.model import Message
from hetsync.network.patterns import leader_reduce, mesh_reduce, ring_allreduce, scatter_gather
from hetsync.protocols.prague.options import PREDUCE_KINDS
from hetsync.transport.channel import Channel
from hetsync.transport.codec import Residual
from hetsync.transport.header import Frame
from hetsync.transport.links import Link
from hetsync.transport.mixing import pair_mean

__all__ = ["RING_FROM_BYTES", "Costs", "PReducer", "free_network_kind", "make_preducer"]


class Costs(Protocol):
    """What ``auto`` prices its choice with: the network model's time for messages (the
    emulator's, or the simulator's)."""

    def duration(self, messages: Sequence[Message]) -> float: ...

Group = tuple[int, ...]
_TAG_BASE = 1 << 20  # above the fixed tags of the other protocols
#: On a free network, buffers from this size go round a ring rather than through a mesh.
RING_FROM_BYTES = 4 * 2**20
_CREATED: Counter[Group] = Counter()  # subgroups made per member set, over all PReducers


class PReducer:
    """Averages a flat buffer over a group of ranks; a 1-member group is a local no-op."""

    def __init__(self, rank: int, world: int, link: Link) -> None:
        self.rank = rank
        self.world = world
        self.link = link
        self._scratch: torch.Tensor | None = None

    def _parts(self, rows: int, flat: torch.Tensor) -> torch.Tensor:
        """`rows` buffers like `flat`, to receive into: kept from call to call (a new one
        per average of a 45 MB model costs tens of ms of page faults, see Link.flat)."""
        need, scratch = rows * flat.numel(), self._scratch
        if scratch is None or scratch.numel() < need or scratch.dtype != flat.dtype \
                or scratch.device != flat.device:
            self._scratch = scratch = flat.new_empty(need)
        return scratch[:need].view(rows, flat.numel())

    def average(self, flat: torch.Tensor, group: Group,
                source: torch.Tensor | None = None) -> None:
        """Replace `flat` (1-D, contiguous, same size on all members) by the members' mean
        of `source` (a buffer like `flat`, only read; default: `flat` itself). Out of place,
        the buffer averaged needs no copy of its own first (Prague's overlapped copy).

        Every member calls it with the same sorted `group`, which contains this rank; the
        groups of one worker must run in an order all their members agree on."""
        self._check(group)
        source = flat if source is None else source
        if len(group) > 1:
            self._mean(flat, group, source)
        elif source is not flat:
            flat.copy_(source)

    def _check(self, group: Group) -> None:
        if self.rank not in group or list(group) != sorted(set(group)) or group[-1] >= self.world:
            raise ValueError(
                f"rank {self.rank}: group {group} must be sorted distinct ranks below "
                f"{self.world} that include this rank"
            )

    def average_surviving(self, flat: torch.Tensor, group: Group,
                          confirm: Callable[[int, BaseException], None],
                          source: torch.Tensor | None = None) -> Group:
        """`average`, where members may have been lost: a member whose transfer fails is
        passed to `confirm` (which raises unless it was lost) and left out. Returns the
        members averaged. Only ``mesh`` can: in the other kinds a member waits for a third
        one, which would wait on the lost one."""
        raise NotImplementedError(f"{type(self).__name__} cannot leave a lost member out")

    def close(self) -> None:
        """Free the process groups this P-Reducer holds (nothing for the p2p kinds)."""

    def messages(self, group: Group, nbytes: float) -> list[Message]:
        """What averaging a buffer of `nbytes` over `group` sends, for the network model."""
        return ring_allreduce(group, nbytes)

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        """`flat` <- the members' mean of `source` (which may be `flat`): their sum,
        divided, the same on every member."""
        self._sum(flat, group, source)
        flat.div_(len(group))

    def _sum(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        raise NotImplementedError


def _tag(group: Group) -> int:
    return _TAG_BASE + zlib.crc32(",".join(map(str, group)).encode()) % _TAG_BASE


class _Mesh(PReducer):
    """One round, (k-1) buffers out and in per member: the fewest scheduler wake-ups; on a
    lossy `channel`, encoded (see the module doc)."""

    def __init__(self, rank: int, world: int, link: Link, channel: Channel | None = None) -> None:
        super().__init__(rank, world, link)
        self._channel = channel if channel is not None and not channel.codec.lossless else None
        self._message: torch.Tensor | None = None  # this member's encoded model, reused

    def messages(self, group: Group, nbytes: float) -> list[Message]:
        return mesh_reduce(group, nbytes)

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        """A pair's mean is one pass (`pair_mean`, in the group's order on both members, so
        they agree bit for bit); more members' a sum, divided."""
        if len(group) != 2:
            super()._mean(flat, group, source)
            return
        terms = self._terms(flat, group, source)
        pair_mean(terms[0], terms[1], flat)  # (`flat` may be a term: read as written)

    def _sum(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        terms = self._terms(flat, group, source)
        me = group.index(self.rank)
        if terms[me] is flat and me > 1:  # overwritten by the first add before it is read
            terms[me] = self._parts(len(group), flat)[me].copy_(flat)
        torch.add(terms[0], terms[1], out=flat)
        for term in terms[2:]:
            flat.add_(term)

    def _terms(self, flat: torch.Tensor, group: Group, source: torch.Tensor
               ) -> list[torch.Tensor]:
        """Every member's buffer, in the group's order, once exchanged: `source` for this
        member, received buffers (`_parts`, this member's row unused) for the others (encoded:
        all of them decoded, this member's too)."""
        out, parts, read = self._outgoing(group, source)
        peers = [(peer, part) for peer, part in zip(group, parts, strict=True)
                 if peer != self.rank]
        self.link.exchange([(out, peer) for peer, _ in peers],
                           [(part, peer) for peer, part in peers], _tag(group))
        return [read(out if peer == self.rank else part)
                for peer, part in zip(group, parts, strict=True)]

    def _outgoing(self, group: Group, source: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """What this member sends (`source`, or its encoded message), a buffer per member to
        receive into (this member's row unused), and how a message reads as a model."""
        if self._channel is None:
            return source, self._parts(len(group), source), lambda buffer: buffer
        channel, frame = self._channel, Frame(0, source.numel(), source.dtype)
        nbytes = channel.frame(frame).nbytes
        rows = self._parts(len(group), self._aligned(nbytes))  # rows start 8-byte aligned,
        message = self._aligned(nbytes)[:nbytes]  # as a decoder's views need
        channel.pack(frame, (), [source], out=message, feedback="model")
        return message, rows[:, :nbytes], partial(channel.payload, frame)

    def _aligned(self, nbytes: int) -> torch.Tensor:
        """This member's message buffer (reused), its size rounded up to 8 bytes."""
        size = -(-nbytes // 8) * 8
        if self._message is None or self._message.numel() != size:
            self._message = self.link.zeros(size, torch.uint8)
        return self._message

    def average_surviving(self, flat: torch.Tensor, group: Group,
                          confirm: Callable[[int, BaseException], None],
                          source: torch.Tensor | None = None) -> Group:
        """Averages over the members whose buffer arrived (see the base class): a member
        lost after sending counts, so two survivors may disagree on it."""
        self._check(group)
        source = flat if source is None else source
        if len(group) == 1:
            if source is not flat:
                flat.copy_(source)
            return group
        out, parts, read = self._outgoing(group, source)
        tag = _tag(group)
        heard = {self.rank: read(out)}
        posted: list[tuple[int, torch.Tensor, list[dist.Work]]] = []
        for peer, part in zip(group, parts, strict=True):
            if peer == self.rank:
                continue
            try:
                posted.append((peer, part, [self.link.irecv(part, peer, tag=tag),
                                            self.link.isend(out, peer, tag=tag)]))
            except RuntimeError as error:
                confirm(peer, error)
        for peer, part, works in posted:
            try:
                self.link.wait(works[0], peer)
                heard[peer] = read(part)
                self.link.wait(works[1], peer)
            except RuntimeError as error:
                confirm(peer, error)
        members = tuple(sorted(heard))
        if len(members) == 2:  # as `_mean` takes a pair's: bit for bit when nobody is lost
            pair_mean(heard[members[0]], heard[members[1]], flat)
            return members
        total = heard[members[0]].clone()
        for peer in members[1:]:
            total.add_(heard[peer])
        flat.copy_(total.div_(len(members)))
        return members


class _Scatter(PReducer):
    """Encoded, for more than two members: each member sends every other member that one's
    k-th of its model, encoded; each owner averages the k decoded shares of its k-th and
    sends the mean, encoded, to all; every member decodes every mean, its own too, so all
    agree bit for bit. 2(k-1)/k of the encoded model out per member, as a ring sends, in two
    rounds (a compressed mesh sends k-1 whole models: more than an uncompressed ring from 3
    members on). Error feedback on this member's model and on the means it owns."""

    def __init__(self, rank: int, world: int, link: Link, channel: Channel) -> None:
        super().__init__(rank, world, link)
        self._codec = channel.codec
        self._own = Residual()
        self._means: dict[tuple[int, int], Residual] = {}
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def messages(self, group: Group, nbytes: float) -> list[Message]:
        return scatter_gather(group, nbytes)

    def _wire(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The send and receive buffers (reused): k shares' messages each."""
        if self._buffers is None or self._buffers[0].numel() != size:
            self._buffers = (self.link.zeros(size, torch.uint8),
                             self.link.zeros(size, torch.uint8))
        return self._buffers

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        codec, k, me, tag = self._codec, len(group), group.index(self.rank), _tag(group)
        n = source.numel()
        m = -(-n // k)  # a share's values
        wire = -(-codec.nbytes(m) // 8) * 8  # a share's message, 8-byte aligned
        values = torch.zeros(m * k, dtype=torch.float32, device=self.link.device)
        values[:n].copy_(source)
        self._own.add_into(values)
        send, received = self._wire(k * wire)
        shares = [slice(j * m, (j + 1) * m) for j in range(k)]
        blocks = [slice(j * wire, (j + 1) * wire) for j in range(k)]
        sent = torch.empty_like(values)
        for j in range(k):
            codec.encode(values[shares[j]], out=send[blocks[j]])
            codec.decode(send[blocks[j]], sent[shares[j]])
        self._own.keep(values, sent)
        peers = [(j, peer) for j, peer in enumerate(group) if peer != self.rank]
        self.link.exchange([(send[blocks[j]], peer) for j, peer in peers],
                           [(received[blocks[j]], peer) for j, peer in peers], tag)
        mean = sent[shares[me]].clone()
        share = torch.empty(m, dtype=torch.float32, device=self.link.device)
        for j, _ in peers:
            mean.add_(codec.decode(received[blocks[j]], share))
        mean.div_(k)
        mine = send[blocks[me]]  # this member's block, not sent in the first round
        codec.encode_fed_back(mean, self._means.setdefault((k, me), Residual()), out=mine)
        self.link.exchange([(mine, peer) for _, peer in peers],
                           [(received[blocks[j]], peer) for j, peer in peers], tag)
        for j in range(k):
            codec.decode(mine if j == me else received[blocks[j]], values[shares[j]])
        flat.copy_(values[:n])


class _Encoded(PReducer):
    """``auto`` on a compressed wire: a pair's mesh (one encoded model each way), the
    scatter-gather from three members on (`_Scatter`: a mesh's bytes grow with k-1)."""

    def __init__(self, rank: int, world: int, link: Link, channel: Channel) -> None:
        super().__init__(rank, world, link)
        self._mesh = _Mesh(rank, world, link, channel)
        self._scatter = _Scatter(rank, world, link, channel)

    def _kind(self, group: Group) -> PReducer:
        return self._mesh if len(group) <= 2 else self._scatter

    def messages(self, group: Group, nbytes: float) -> list[Message]:
        return self._kind(group).messages(group, nbytes)

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        self._kind(group)._mean(flat, group, source)


class _Ring(PReducer):
    """Bandwidth-optimal: 2(k-1)/k of the buffer out per member, but 2(k-1) rounds."""

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        """Each member divides only the chunk it owns once reduced, then all-gathers: a pass
        over 1/k of the buffer instead of all of it, the same values (a sum, divided; for a
        pair, the chunk's mean in one pass, `pair_mean`). Every
        chunk of `flat` but this member's own is first written by the reduce-scatter's sum
        (of `source`'s chunk and the one received), its own by the all-gather: `source` is
        read, never copied."""
        k, me, tag = len(group), group.index(self.rank), _tag(group)
        nxt, prv = group[(me + 1) % k], group[(me - 1) % k]
        chunks, sources = flat.tensor_split(k), source.tensor_split(k)
        buf = self._parts(1, chunks[0])[0]
        for s in range(k - 1):  # reduce-scatter: member me ends owning chunk me+1
            i = (me - s - 1) % k
            sent = sources[me] if s == 0 else chunks[(me - s) % k]  # the sum of step s - 1
            received = buf[: chunks[i].numel()]
            self.link.exchange([(sent, nxt)], [(received, prv)], tag)
            if k == 2:  # a pair's mean in one pass (`pair_mean`), by the chunk's one owner
                pair_mean(sources[i], received, chunks[i])
            else:
                torch.add(sources[i], received, out=chunks[i])
        if k > 2:
            chunks[(me + 1) % k].div_(k)
        for s in range(k - 1):  # all-gather the reduced chunks
            self.link.exchange([(chunks[(me + 1 - s) % k], nxt)], [(chunks[(me - s) % k], prv)],
                               tag)


class _Leader(PReducer):
    """Two rounds; the leader (first member) moves 2(k-1) buffers."""

    def messages(self, group: Group, nbytes: float) -> list[Message]:
        return leader_reduce(group, nbytes)

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        """The leader sums and divides; the others receive the mean (no pass of their own)."""
        tag = _tag(group)
        if self.rank != group[0]:  # posted as the leader's are (NCCL matches a batched
            self.link.exchange([(source, group[0])], [], tag)  # send only with a batched recv)
            self.link.exchange([], [(flat, group[0])], tag)
            return
        parts = self._parts(len(group) - 1, flat)
        self.link.exchange([], list(zip(parts, group[1:], strict=True)), tag)
        if len(group) == 2:  # a pair's mean in one pass (`pair_mean`)
            pair_mean(source, parts[0], flat)
        else:
            torch.add(source, parts[0], out=flat)
            for part in parts[1:]:
                flat.add_(part)
            flat.div_(len(group))
        self.link.exchange([(flat, peer) for peer in group[1:]], [], tag)


def free_network_kind(nbytes: float) -> str:
    """``auto``'s choice on a free network (no `--network`), by the buffer's size: the mesh's
    one round for small buffers, the ring's fewer bytes and passes for large ones."""
    return "ring" if nbytes >= RING_FROM_BYTES else "mesh"


class _Auto(PReducer):
    """Per group size, the p2p kind the network model says is fastest (see the module doc)."""

    def __init__(self, rank: int, world: int, link: Link, costs: Costs | None,
                 channel: Channel | None) -> None:
        super().__init__(rank, world, link)
        self._costs = costs  # None: a free network
        self._channel = channel  # the declared size of a buffer (`--payload`)
        self._kinds = {"mesh": _Mesh(rank, world, link, channel),
                       "ring": _Ring(rank, world, link), "leader": _Leader(rank, world, link)}
        self._chosen: dict[tuple[int, float], PReducer] = {}

    def choose(self, k: int, nbytes: float) -> PReducer:
        """The kind for `k` members averaging a buffer of `nbytes` as declared (`--payload`)."""
        costs = self._costs
        if costs is None:
            return self._kinds[free_network_kind(nbytes)]
        key = (k, nbytes)
        if key not in self._chosen:
            members = tuple(range(k))
            self._chosen[key] = min(self._kinds.values(), key=lambda kind: costs.duration(
                kind.messages(members, nbytes)))
        return self._chosen[key]

    def messages(self, group: Group, nbytes: float) -> list[Message]:
        return self.choose(len(group), nbytes).messages(group, nbytes)

    def _mean(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        real = flat.numel() * flat.element_size()
        declared = self._channel.declared(real) if self._channel is not None else real
        self.choose(len(group), declared)._mean(flat, group, source)


class _Subgroup(PReducer):
    """A cached gloo group per member set; first use costs the group's creation. Its links
    are on host memory: a buffer on the GPU is staged through it."""

    def __init__(
        self, rank: int, world: int, link: Link, store: dist.Store,
        timeout: datetime.timedelta, cache_size: int,
    ) -> None:
        super().__init__(rank, world, link)
        self._store = store
        self._timeout = timeout
        self._cache_size = cache_size
        self._cache: dict[Group, Link] = {}

    def _sum(self, flat: torch.Tensor, group: Group, source: torch.Tensor) -> None:
        if source is not flat:
            flat.copy_(source)  # gloo's all-reduce is in place
        sub = self._cache.get(group)
        if sub is None:
            sub = self._create(group)
        wire = sub.on_wire(flat)
        sub.all_reduce(wire)
        if wire is not flat:
            sub.unpack_into(wire, [flat])
        if group not in self._cache:
            threading.Thread(target=_shutdown(sub), name="preduce-shutdown").start()

    def _create(self, group: Group) -> Link:
        name = f"preduce/{'-'.join(map(str, group))}/{_CREATED[group]}/"
        _CREATED[group] += 1
        pg = dist.ProcessGroupGloo(
            dist.PrefixStore(name, self._store), group.index(self.rank), len(group), self._timeout
        )
        sub = Link(f"P-Reduce subgroup {name}", pg, torch.device("cpu"),
                   pinned=self.link.pinned or self.link.device.type == "cuda")
        full = torch.tensor([float(len(self._cache) >= self._cache_size)])
        sub.all_reduce(full)
        if full.item() == 0:
            self._cache[group] = sub
        return sub

    def close(self) -> None:
        for sub in self._cache.values():
            _shutdown(sub)()
        self._cache.clear()


def _shutdown(sub: Link) -> Callable[[], None]:
    """Shut a subgroup link's gloo group down (20-30 ms: often in a thread)."""
    group = sub.group
    assert isinstance(group, dist.ProcessGroupGloo)
    return group.shutdown


def make_preducer(
    kind: str,
    rank: int,
    world: int,
    *,
    store: dist.Store | None = None,
    timeout: datetime.timedelta = datetime.timedelta(seconds=60),
    cache_size: int = 60,
    network: Costs | None = None,
    link: Link | None = None,
    channel: Channel | None = None,
) -> PReducer:
    """The P-Reducer called `kind` (one of `PREDUCE_KINDS`, Prague's `--preduce`) for this rank.

    ``subgroup`` needs `store`, shared by all ranks (e.g. `Runtime.store`) for the groups'
    rendezvous; `timeout` bounds its waits and `cache_size` caps its cached groups (the
    prototype used 60; each costs ~6 sockets and 3 threads). The p2p kinds send through
    `link` (default: the default process group on host memory, gloo's) and its group's
    timeout. ``auto`` chooses by `network`'s cost model (None: a free network). `channel`, the
    driver's for `link`, declares a buffer's size (`--payload`) and, where its codec is lossy,
    encodes a mesh's messages (the other kinds then refuse to run)."""
    link = link if link is not None else Link.default()
    codec = channel.codec.kind if channel is not None else "none"
    lossy = codec != "none"
    if lossy and kind not in ("auto", "mesh"):
        raise ConfigError(f"P-Reduce {kind!r} sends models as they are: --compress {codec} "
                          f"needs --preduce mesh or auto")
    if kind == "auto":
        if lossy:
            assert channel is not None
            return _Encoded(rank, world, link, channel)
        return _Auto(rank, world, link, network, channel)
    if kind == "subgroup":
        if store is None:
            raise ConfigError("P-Reduce 'subgroup' needs a store shared by all ranks")
        return _Subgroup(rank, world, link, store, timeout, cache_size)
    if kind == "mesh":
        return _Mesh(rank, world, link, channel)
    kinds: dict[str, type[PReducer]] = {"ring": _Ring, "leader": _Leader}
    if kind not in kinds:
        raise ConfigError(f"unknown P-Reduce kind {kind!r} (known: {', '.join(PREDUCE_KINDS)})")
    return kinds[kind](rank, world, link)
