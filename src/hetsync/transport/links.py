"""The wire: for each kind of traffic, its process group, the device its buffers travel on, and
how they are packed. The only calls into torch.distributed's communication in hetsync are here
(tests/transport/test_layout.py checks), so that every buffer passes its link's device check
before it travels: a CUDA tensor can never reach gloo unnoticed, nor a host one NCCL.

A worker has two links (`Links`, built once by `hetsync.transport.runtime.join`):

- ``direct``: the default process group, for collectives and sends to known peers (all-reduce,
  DDP's hook, D-PSGD, P-Reduce, the model broadcast and average). Its buffers live on the
  compute device under NCCL (they stay on the GPU), in host memory under gloo.
- ``host``: a gloo group on host memory (the default group on gloo runs), for the protocols
  whose receivers take messages from several peers as they come (Hop, AD-PSGD, the parameter
  server, Prague's Group Generator: `hetsync.transport.peer_streams`): those receive on
  threads, and NCCL's point-to-point calls belong on the thread of their stream.

Packing (`flat`, `pack`) and unpacking (`unpack_into`) copy between the model's tensors, on
whatever device the model is, and the wire (averaging into the model: `transport/mixing.py`).
Where the wire is the host and a tensor is on a GPU, the host buffers are pinned and the copies
non-blocking, with one synchronisation for all of a buffer's tensors (before it is sent, or
before the receive buffer may be reused); on a machine without CUDA nothing is pinned and the
copies are plain ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hetsync.transport.contiguous import pieces, span
from hetsync.transport.header import Frame
from hetsync.transport.lost_workers import LostWorkers
from hetsync.transport.membership import Membership

__all__ = ["Link", "Links", "WireDeviceError", "bind_thread"]

_CPU = torch.device("cpu")
Transfers = Iterable[tuple[torch.Tensor, int]]
"""(buffer, peer) pairs: what to send to whom, or receive from whom."""


class WireDeviceError(ValueError):
    """A buffer handed to a link is not on the link's wire device (a bug in hetsync: drivers
    pack through the link, which puts buffers there). A ValueError, not a RuntimeError, so
    that no lost-worker handling mistakes it for a failed transfer."""


class Link:
    """One kind of traffic: its process group (None: the default one) and its wire `device`,
    where buffers travel. `lost`: the run's lost workers, where workers may be lost (a
    receiver asks it whether a failed receive's peer was lost)."""

    def __init__(self, name: str, group: dist.ProcessGroup | None, device: torch.device,
                 lost: LostWorkers | None = None, *, pinned: bool = False) -> None:
        self.name = name
        self.group = group
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if pinned and device.type != "cpu":
            raise ValueError(f"link {name!r}: only host buffers are pinned, not {device}'s")
        self.device = device
        self.lost = lost
        self.members: tuple[int, ...] | None = None
        """The run ranks of `group` in its rank order, where it is a generation's own group
        (`regroup`); None: the run's ranks are its ranks."""
        self.membership: Membership | None = None
        """`--on-failure rejoin`: the run's generations, whose newest this link's collectives
        give way to (`Membership.wait`)."""
        self.pinned = pinned
        """Host buffers are pinned (page-locked), for a model on a GPU: its copies to and from
        them are then asynchronous. Never for a model on the CPU, also on a machine with a
        GPU: there the first pinned buffer would start CUDA in every worker, and each one be
        page-locked and rounded up to a power of two (45 MB to 64) by torch's pinned cache."""

    @classmethod
    def default(cls) -> Link:
        """The default process group on host memory: a gloo run's only link."""
        return cls("default", None, _CPU)

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self._backend()}, {self.device})"

    # --- buffers on the wire device ---------------------------------------------------------
    def zeros(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed 1-D buffer on the wire."""
        return self._empty(numel, dtype).zero_()

    def empty(self, frame: Frame) -> torch.Tensor:
        """A buffer to receive one `frame` message into."""
        return self._empty(frame.nbytes, torch.uint8)

    def flat(self, tensors: Sequence[torch.Tensor], *extra: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """A 1-D buffer on the wire (new, or `out`, one made by this link for the same
        tensors): the tensors' values (detached, in the first one's dtype), then the `extra`
        scalars in that dtype. The extras round as the dtype does (bf16 holds integers exactly
        only up to 256): fit for a stop vote summed over at most 256 workers; a header goes in
        a `Frame` instead (`pack`). Reusing `out` step after step saves a model-sized
        allocation each time: above glibc's 32 MB mmap threshold every new buffer is fresh
        pages, faulted in on first write (a 45 MB one costs tens of ms more than a reused
        one)."""
        numel = sum(t.numel() for t in tensors)
        if out is None or out.numel() != numel + len(extra) or out.dtype != tensors[0].dtype:
            out = self._empty(numel + len(extra), tensors[0].dtype)  # (the model changed)
        _fill(out[:numel], tensors)
        if extra:
            out[numel:].copy_(torch.tensor(extra, dtype=out.dtype))
        return out

    def write(self, out: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        """Write the tensors' values (detached, in `out`'s dtype) into `out`, a 1-D buffer on
        the wire exactly their size (a slice of a larger one, as `flat` fills)."""
        _fill(self.check(out, "write"), tensors)

    def pack(self, frame: Frame, header: Sequence[int],
             tensors: Sequence[torch.Tensor] = (), out: torch.Tensor | None = None) -> torch.Tensor:
        """A `frame` message on the wire (new, or `out`, a buffer of that frame no transfer
        is using): `header` (exactly `frame.words` integers), then the tensors' values,
        detached, in one copy."""
        message = self.empty(frame) if out is None else out
        frame.write_header(message, header)
        if frame.numel:
            _fill(frame.payload(message), tensors)
        return message

    def on_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` itself if it is on the wire, else a copy there (`unpack_into` it back)."""
        if tensor.device == self.device:
            return tensor
        return self.flat([tensor])

    def unpack_into(self, flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        """Copy consecutive slices of `flat` back into `tensors` (in place), each on its own
        device; returns once they are all there, so `flat` may be received into again."""
        if not tensors:
            return
        if (whole := span(tensors)) is not None:  # a laid-out model: one copy
            _copy(whole, flat[: whole.numel()])
            return
        if all(t.device == flat.device and t.dtype == flat.dtype and t.is_contiguous()
               for t in tensors):  # one call for all (experiments/link_ops_timing.py)
            torch._foreach_copy_([t.view(-1) for t in tensors], pieces(flat, tensors))
            return
        staged = False
        offset = 0
        for t in tensors:
            n = t.numel()
            cross = t.device != flat.device
            staged |= cross
            t.copy_(flat[offset : offset + n].view_as(t), non_blocking=cross)
            offset += n
        if staged:
            _synchronize([flat, *tensors])

    # --- operations -------------------------------------------------------------------------
    def regroup(self, group: dist.ProcessGroup, members: tuple[int, ...]) -> None:
        """Carry a new generation's `group`, whose ranks are the run's `members` in order
        (hetsync.transport.membership): every user of this link changes with it."""
        self.group, self.members = group, members

    def all_reduce(self, tensor: torch.Tensor, *, async_op: bool = False) -> dist.Work | None:
        """Sum `tensor` over the group, in place; with `async_op`, the Work (its
        `get_future()` is what a DDP communication hook returns). Where the run has
        generations, a wait that gives way to a newer one raises `Regrouped` (`tensor` is
        then partly reduced: the caller contributes it again)."""
        self.check(tensor, "all_reduce")
        if self.membership is not None and not async_op:
            self.membership.wait(dist.all_reduce(tensor, group=self.group, async_op=True))
            return None
        work = dist.all_reduce(tensor, group=self.group, async_op=async_op)
        if not async_op:
            self._settle()
        return work

    def all_to_all(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        """Block j of `tensor` to rank j, block i of `out` from rank i (equal blocks)."""
        dist.all_to_all_single(self.check(out, "all_to_all"), self.check(tensor, "all_to_all"),
                               group=self.group)
        self._settle()

    def all_gather(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        """Every rank's `tensor`, in rank order, into `out`."""
        dist.all_gather_single(self.check(out, "all_gather"),
                               self.check(tensor, "all_gather"), group=self.group)
        self._settle()

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.check(tensor, "broadcast")
        if self.members is not None:  # a generation's group: torch knows no run ranks of it
            work = self.group.broadcast(tensor, self.members.index(src))  # type: ignore[union-attr]
            if self.membership is not None:
                self.membership.wait(work)
            else:
                work.wait()
        else:
            dist.broadcast(tensor, src, group=self.group)
        self._settle()

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.check(tensor, "send")
        self.wait(dist.isend(tensor, dst, group=self.group, tag=tag), dst)

    def wait(self, work: dist.Work, peer: int) -> None:
        """Wait for `work`, a transfer with `peer`. Where workers may be lost, the wait
        fails (`PeerLost`) once `peer` is declared lost: gloo's send to a peer that died
        mid-message may never return (`LostWorkers.wait_for`)."""
        if self.lost is None:
            work.wait()
        else:
            self.lost.wait_for(work, peer)
        self._settle()

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self.check(tensor, "recv")
        dist.recv(tensor, src, group=self.group, tag=tag)
        self._settle()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
        self.check(tensor, "isend")
        return dist.isend(tensor, dst, group=self.group, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> dist.Work:
        self.check(tensor, "irecv")
        return dist.irecv(tensor, src, group=self.group, tag=tag)

    def post(self, sends: Transfers, receives: Transfers, tag: int) -> list[dist.Work]:
        """Post sends and receives together (`batch_isend_irecv`); their Works, to wait on."""
        ops = [dist.P2POp(dist.isend, self.check(t, "send"), peer, self.group, tag)
               for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, self.check(t, "recv"), peer, self.group, tag)
                for t, peer in receives]
        return dist.batch_isend_irecv(ops) if ops else []

    def exchange(self, sends: Transfers, receives: Transfers, tag: int) -> None:
        """`post`, then wait for all of it (gloo's p2p Works complete only in wait())."""
        for work in self.post(sends, receives, tag):
            work.wait()
        self._settle()

    def _settle(self) -> None:
        """On a GPU wire, wait until what the GPU was given so far has run. NCCL's waits only
        order the GPU's stream behind the transfer, so without this a wait would take no time
        on the host: its time (a row's sync wait) would land in the next compute step."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def world_size(self) -> int:
        """How many ranks the link's group has."""
        if self.members is not None:
            return len(self.members)
        return dist.get_world_size(self.group)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def check(self, tensor: torch.Tensor, op: str = "transfer") -> torch.Tensor:
        """`tensor` if it is on the wire device; otherwise a WireDeviceError that names the
        link, its backend and both devices."""
        if tensor.device != self.device:
            raise WireDeviceError(
                f"hetsync: the {self.name} link ({self._backend()}) carries buffers on "
                f"{self.device}, but {op} was given one on {tensor.device}: pack it with the "
                "link (flat, pack, empty, on_wire)")
        return tensor

    def _empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, device=self.device, pin_memory=self.pinned)

    def _backend(self) -> str:
        try:
            return str(dist.get_backend(self.group))
        except (RuntimeError, ValueError):  # no process group (yet), or a raw subgroup
            return "gloo" if self.device.type == "cpu" else "nccl"


@dataclass(frozen=True)
class Links:
    """A worker's links: `direct` (the default group on the compute device under NCCL, the
    host under gloo) and `host` (gloo on host memory: receives on threads). The default,
    for a run without `init()` (tests), is gloo's: both the default group on the host."""

    direct: Link = field(default_factory=Link.default)
    host: Link = field(default_factory=Link.default)

    @classmethod
    def of(cls, backend: str, device: torch.device, host_group: dist.ProcessGroup | None,
           lost: LostWorkers | None, membership: Membership | None = None,
           group: dist.ProcessGroup | None = None) -> Links:
        """The links of a run on `backend` whose compute device is `device`; `host_group`
        is the gloo group of all ranks under NCCL (None: the default group is gloo). Host
        buffers are pinned where the model is on a GPU, and only there. `membership`: the
        run's generations (gloo only), whose current `group` (None: the default) the links
        carry; a restarted worker's is the generation it joined."""
        staged = device.type == "cuda"  # its copies to host buffers: pinned ones
        wire = device if backend == "nccl" else _CPU
        links = cls(direct=Link("direct", group, wire, lost, pinned=staged and wire == _CPU),
                    host=Link("host", host_group, _CPU, lost, pinned=staged))
        if membership is not None:
            assert host_group is None, "generations are gloo groups: one link, two names"
            links = cls(direct=links.direct, host=links.direct)
            links.direct.membership = membership
            membership.links.append(links.direct)
            if group is not None:
                links.direct.members = membership.current.members
        return links


def bind_thread(device: torch.device) -> None:
    """Make `device` this thread's current GPU, where it is one: a new thread's is GPU 0, and
    NCCL's batched transfers (`batch_isend_irecv`) may hang on another. Called by `join` for
    the main thread, and first thing by a protocol's own threads that copy to or from the
    model, or transfer on NCCL."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def _fill(out: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Write the tensors' values (detached, flattened, in `out`'s dtype) into `out`, one copy
    each: on one device as one `cat`; across devices as non-blocking copies (asynchronous
    into pinned memory) and one synchronisation before the buffer may travel."""
    if not tensors:
        return
    if (whole := span(tensors)) is not None:  # a laid-out model: one copy
        _copy(out, whole.detach())
        return
    if all(t.device == out.device for t in tensors):
        torch.cat([t.detach().reshape(-1).to(out.dtype) for t in tensors], out=out)
        return
    offset = 0
    for t in tensors:
        n = t.numel()
        out[offset : offset + n].copy_(t.detach().reshape(-1), non_blocking=True)
        offset += n
    _synchronize([out, *tensors])


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src, done when this returns: across devices non-blocking (asynchronous with
    pinned host memory), then one synchronisation."""
    cross = dst.device != src.device
    dst.copy_(src, non_blocking=cross)
    if cross:
        _synchronize([dst, src])


def _synchronize(tensors: Iterable[torch.Tensor]) -> None:
    """Wait for the copies queued on the current streams of the GPUs holding `tensors`."""
    for device in {t.device for t in tensors if t.device.type == "cuda"}:
        torch.cuda.current_stream(device).synchronize()

