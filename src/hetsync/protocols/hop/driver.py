"""Hop (Luo et al., ASPLOS'19) over torch.distributed: the transport of hetsync.protocols.hop.core.

Theory of operation. The decisions (may this worker start iteration k, which updates does it
average, when does it skip) are made by `HopCore`; this module only moves messages and
tensors, through its channel (`self.channel`: the fault, loss, bytes, the emulated network,
and the wire format of `--compress`, in which updates travel and are decoded to be averaged).
Each worker receives on a thread per neighbour and kind (`PeerStreams`: a neighbour's
death fails only its own): tagged models from its in-neighbours, tokens from its
out-neighbours. These threads turn each message into a core event on an inbox queue as it
arrives and never block a sender: a model is buffered as soon as it arrives, and the core
frees it (`Drop`) when no iteration can use it.
The training thread owns the core:

    begin_iteration:       ReadyToStart -> [SkipTo], StartIteration, SendUpdate  (or Wait)
    before_optimizer_step: ComputeFinished(k) -> Aggregate, ReturnTokens          (or Wait)

On `Wait` it blocks on the inbox; a wait longer than `--hang-timeout` raises an error that
names the ranks and tags it waited for. Each row says what its iteration waited for, and for
how long: `wait_update_from_<j>_s`, `wait_token_from_<j>_s`, and `wait_send_to_<j>_s` for a
send to j not yet taken in when the next update was due. The model sent in iteration k is
x_k, the one the gradient is computed on, as in D-PSGD: with no backup, staleness or
skipping, Hop computes exactly D-PSGD's iterates.

Stopping. Workers stop independently (no agreement is needed: nobody waits for a worker that
left). A stopping worker sends an end marker on each of its channels, after its last update
or token; its neighbours turn that into `NeighbourLeft`. It then waits until every neighbour
has ended its channels too.

Lost neighbours (`--on-failure continue`, hetsync.transport.lost_workers). A neighbour the
launcher declares lost becomes `NeighbourLost`: nothing more is awaited from it, and nothing
is sent to it. A send to it that fails before the launcher has said so waits for its word;
its channels count as ended.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from hetsync.config import RunConfig
from hetsync.network.patterns import point_to_point
from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.hop.core import (
    Aggregate,
    ComputeFinished,
    Decision,
    Drop,
    Event,
    HopCore,
    NeighbourLeft,
    NeighbourLost,
    ReadyToStart,
    ReturnTokens,
    SendUpdate,
    SkipTo,
    StartIteration,
    State,
    Stopping,
    TokensReceived,
    UpdateReceived,
    Wait,
    dispatch,
)
from hetsync.protocols.hop.wire import TOKEN_FRAME, TokenHeader, UpdateHeader, update_frame
from hetsync.protocols.registry import register_protocol
from hetsync.topology import build
from hetsync.transport.flat import model_tensors
from hetsync.transport.mixing import mix_into
from hetsync.transport.peer_streams import Item, PeerStreams
from hetsync.transport.runtime import Runtime

_UPDATE_TAG, _TOKEN_TAG = 41, 42
#: Model-sized buffers a worker packs its updates into, in turn. A buffer is busy until every
#: receiver has taken its update in, which a straggler whose CPU quota froze its threads does
#: only once it runs again (up to 75 ms later at a quarter core). So a worker waits for an
#: update's sends only as it packs into that buffer again, an update later, not for the one
#: it has just sent (why two: docs/notes/real-compute-log.md, "Hop's update buffers").
_UPDATE_BUFFERS = 2
_HEADERS: dict[int, type[UpdateHeader] | type[TokenHeader]] = {
    _UPDATE_TAG: UpdateHeader, _TOKEN_TAG: TokenHeader}
_Item = tuple[Event | BaseException, torch.Tensor | None]


@register_protocol("hop")
class Hop(Protocol):
    """Queue-based decentralized training with backup workers, staleness and skipping."""

    closures = Closures.LOCAL  # a closure: the step from the aggregated model

    @classmethod
    def ends_alone(cls, config: RunConfig) -> bool:
        return True  # a worker that ends sends its end marker; its neighbours go on

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        config, rank = runtime.config, runtime.rank
        topology = build(config.topology, runtime.world_size, config.weights)
        self.core = HopCore.of_run(topology, rank, config.hop_config(topology))
        in_peers, out_peers = self.core.in_peers, self.core.out_peers
        self.tensors = model_tensors(model)
        self.link = runtime.links.host  # receives on threads: gloo, on host memory
        self.channel = self.open_channel(self.link)
        self.timeout = runtime.wait_timeout
        self.inbox: queue.Queue[_Item] = queue.Queue()
        self.updates: dict[tuple[int, int], torch.Tensor] = {}
        self._sends: list[tuple[dist.Work, int, int]] = []  # (work, peer, `_packs` then)
        # Model-sized buffers, reused step after step (a new one is fresh pages to fault in):
        self._spare: list[torch.Tensor] = []  # receive buffers of updates the core dropped
        self._update_out: torch.Tensor | None = None  # this worker's update, once sent
        self._update_buffers: list[torch.Tensor] = []  # packed in turn: `_update_buffer`
        self._packs = 0  # updates packed so far
        self._update_tag = 0  # the tag `_update_out` holds
        self._average_out: torch.Tensor | None = None
        self._running = False
        self._stopped = False
        self._step = Step(0)  # the step whose decisions `_execute` carries out
        self._frames = {_UPDATE_TAG: update_frame(self.tensors), _TOKEN_TAG: TOKEN_FRAME}
        self._fan_out = {j: len(topology.out_peers(j)) for j in in_peers}  # share its egress
        self._channels = threading.Condition()
        """Guards `_open` (the neighbours whose channels have not ended, by tag), `_lost`
        and `_failed`."""
        self._open = {_UPDATE_TAG: set(in_peers), _TOKEN_TAG: set(out_peers)}
        self._lost: set[int] = set()
        self._failed: BaseException | None = None  # a receiver thread's error: ends `close`
        for tag, new, kind in ((_UPDATE_TAG, self._spare_update, "updates"),
                               (_TOKEN_TAG, partial(self.channel.empty, TOKEN_FRAME), "tokens")):
            PeerStreams(self.link, self._open[tag], tag, new, partial(self._is_end, tag),
                        reuse=False, name=f"hop-{kind}", deliver=partial(self._receive, tag))
        if runtime.lost is not None:
            runtime.lost.subscribe(self._on_lost)

    # --- the training thread ----------------------------------------------------------------
    def begin_iteration(self, step: Step) -> None:
        """Start the iteration (tokens, skip, send). The first starts when needed, so that a
        model loaded after building the optimizer is the one sent."""
        if step.iteration > 1 and not self._stopped:
            self._start(step)

    def _start(self, step: Step) -> None:
        self._drain(step)
        self._run(ReadyToStart(), step)
        self._running = True

    def before_optimizer_step(self, step: Step) -> None:
        if not self._running:
            self._start(step)
        step.begin_sync()
        self._drain(step)
        self._run(ComputeFinished(iteration=self.core.iteration), step)
        self._running = False
        step.stop = self._stopped = step.wants_stop

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: the gradient lands on the averaged model."""

    def _drain(self, step: Step) -> None:
        """Feed every message that has already arrived (their decisions are only `Drop`s)."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            self._execute(self.core.handle(self._unpack(item)), step)

    def _run(self, event: Event, step: Step) -> None:
        """Feed `event`, then incoming messages for as long as the core says `Wait`."""
        decisions = self.core.handle(event)
        while (wait := self._execute(decisions, step)) is not None:
            with self.channel.waiting_on_arrivals(step):
                began = time.perf_counter()
                try:
                    item = self.inbox.get(timeout=self.timeout)
                except queue.Empty:
                    raise TimeoutError(self._describe(wait)) from None
                waited = time.perf_counter() - began
            for key in _wait_keys(wait):
                step.count_seconds(key, waited)
            decisions = self.core.handle(self._unpack(item))

    def _unpack(self, item: _Item) -> Event:
        event, buffer = item
        if isinstance(event, BaseException):
            raise RuntimeError(f"hop receiver thread failed: {event!r}") from event
        if isinstance(event, UpdateReceived) and buffer is not None:
            self.updates[event.src, event.tag] = buffer
        return event

    def _execute(self, decisions: list[Decision], step: Step) -> Wait | None:
        """Carry out `decisions` for `step` up to a `Wait`, which is returned."""
        self._step = step
        for decision in decisions:
            if (wait := dispatch(decision, self)) is not None:
                return wait
        return None

    # --- the core's decisions (`HopDecisionHandler`), for the step `_execute` runs -----------
    def on_wait(self, decision: Wait) -> Wait:
        return decision

    def on_skip_to(self, decision: SkipTo) -> None:
        self._step.extra["started_at"] = time.time()
        self._step.extra["skipped"] = decision.skipped
        self._average(decision.inputs, decision.self_weight, decision.weights)

    def on_start_iteration(self, decision: StartIteration) -> None:
        self._step.extra.setdefault("started_at", time.time())
        self._step.extra["tag"] = decision.iteration

    def on_send_update(self, decision: SendUpdate) -> None:
        again = decision.tag == self._update_tag  # a deferred update: the message as first sent
        frame = self._frames[_UPDATE_TAG]
        emulated = self.channel.network.emulated
        if emulated:  # the emulated network charges each send from its start
            with self.channel.waiting_on_arrivals(self._step):
                self._wait_sends(self._step)
        header = UpdateHeader(decision.tag, self.channel.stamp()).encode()
        if again:
            if emulated:  # charged from when it goes
                self.channel.frame(frame).write_header(self._update_out, header)
        else:
            self._update_out = self.channel.pack(frame, header, self.tensors,
                                                 out=self._update_buffer(), feedback="model")
            if len(self._update_buffers) < _UPDATE_BUFFERS:
                self._update_buffers.append(self._update_out)
            self._packs += 1
            self._update_tag = decision.tag
        assert self._update_out is not None
        self._send(self._update_out, decision.to, _UPDATE_TAG, self._step)

    def on_aggregate(self, decision: Aggregate) -> None:
        self._average(decision.inputs, decision.self_weight, decision.weights)
        extra = self._step.extra
        extra["done_at"] = time.time()
        extra["used"] = len(decision.inputs)
        extra["staleness"] = decision.staleness

    def on_return_tokens(self, decision: ReturnTokens) -> None:
        self._send(self._tokens(decision.count), decision.to, _TOKEN_TAG, self._step)

    def on_drop(self, decision: Drop) -> None:
        for tag in decision.tags:
            self._spare.append(self.updates.pop((decision.src, tag)))

    def _send(self, message: torch.Tensor, to: tuple[int, ...], tag: int, step: Step) -> None:
        live = [j for j in to if j not in self._lost]  # a send to one just lost can fail at once
        works = self.channel.isend(step, message, live, tag)
        self._sends.extend((work, j, self._packs) for work, j in works)

    def _tokens(self, count: int | None) -> torch.Tensor:
        """A token message returning `count` tokens (None: the end marker)."""
        return self.channel.pack(TOKEN_FRAME, TokenHeader(count).encode())

    def _update_buffer(self) -> torch.Tensor | None:
        """Where to pack the next update (None: a new buffer, until there are
        `_UPDATE_BUFFERS`): the buffer packed `_UPDATE_BUFFERS` updates ago, once the sends
        made while its update was the newest are done. Gloo tells that a send is done only
        to a wait (`Work.is_completed()` stays False until then), so those sends, tokens
        among them, are waited for then: by that time a receiver that is merely slow has
        taken them in, and this worker waits only for one frozen that long."""
        if len(self._update_buffers) < _UPDATE_BUFFERS:
            return None
        oldest = self._packs - _UPDATE_BUFFERS  # the update that buffer holds
        if any(packs <= oldest + 1 for _, _, packs in self._sends):
            with self.channel.waiting_on_arrivals(self._step):
                self._wait_sends(self._step, up_to=oldest + 1)
        return self._update_buffers[oldest % _UPDATE_BUFFERS]

    def _wait_sends(self, step: Step | None = None, up_to: int | None = None) -> None:
        """Wait for the sends in flight (`up_to`: only those made while at most that many
        updates had been packed); `step`'s row counts each wait over a millisecond
        (`wait_send_to_<j>_s`: a receiver that has not taken an update in yet)."""
        pending = []
        for work, to, packs in self._sends:  # to a lost peer: given up, NeighbourLost follows
            if up_to is not None and packs > up_to:
                pending.append((work, to, packs))
                continue
            began = time.perf_counter()
            self.channel.wait(None, [work], peer=to)
            waited = time.perf_counter() - began
            if step is not None and waited > 1e-3:
                step.count_seconds(f"wait_send_to_{to}_s", waited)
        self._sends = pending

    def _on_lost(self, rank: int) -> None:
        """The launcher declared `rank` lost (a watcher thread calls this)."""
        with self._channels:
            self._lost.add(rank)
            self._channels.notify_all()
        if rank in self.core.in_peers or rank in self.core.out_peers:
            self.inbox.put((NeighbourLost(rank=rank), None))

    def _average(
        self, inputs: Mapping[int, int], self_weight: float, weights: Mapping[int, float]
    ) -> None:
        if not inputs:  # a skip with nothing new to merge
            return
        frame = self._frames[_UPDATE_TAG]
        self._average_out = mix_into(
            self.link, self.tensors, self_weight,
            [(self.channel.payload(frame, self.updates[j, tag]), weights[j])
             for j, tag in inputs.items()],
            out=self._average_out)

    def _describe(self, wait: Wait) -> str:
        awaited = [f"an update tagged >= {tag} from rank {j}" for j, tag in wait.updates.items()]
        awaited += [f"a token from rank {j}" for j in wait.tokens]
        return (f"hop: rank {self.core.rank} waited {self.timeout:g} s in iteration "
                f"{wait.iteration} for {' and '.join(awaited)}")

    # --- the receiver threads ----------------------------------------------------------------
    def _ended(self) -> bool:
        """Whether every neighbour has ended its channels or was lost (`_channels` held)."""
        return not any(senders - self._lost for senders in self._open.values())

    def _spare_update(self) -> torch.Tensor:
        """A buffer to receive an update into: one whose update the core dropped, else a new
        one (receiver threads take them, the training thread gives them back)."""
        try:
            return self._spare.pop()
        except IndexError:
            return self.channel.empty(self._frames[_UPDATE_TAG])

    def _is_end(self, tag: int, message: torch.Tensor) -> bool:
        """Whether `message` is its sender's end marker on channel `tag`."""
        return _HEADERS[tag].decode(self._frames[tag], message).end

    def _receive(self, tag: int, item: Item) -> None:
        """Turn a message on channel `tag` into an event for the training thread (on the
        thread of the neighbour it came from, as it arrives)."""
        if isinstance(item, BaseException):  # re-raised on the training thread
            self.inbox.put((item, None))
            with self._channels:  # a channel that failed never ends: `close` must not wait
                self._failed = self._failed or item
                self._channels.notify_all()
            return
        src, buffer = item
        if buffer is None:  # its end marker, or its loss, has said so already
            return
        header = _HEADERS[tag].decode(self._frames[tag], buffer)
        if header.end:
            with self._channels:
                self._open[tag].discard(src)
                self._channels.notify_all()
            self.inbox.put((NeighbourLeft(rank=src), None))
            return
        if self.channel.network.emulated:
            self._charge_network(src, tag, buffer)
        if isinstance(header, UpdateHeader):
            assert header.tag is not None
            self.inbox.put((UpdateReceived(src=src, tag=header.tag), buffer))
        else:
            assert header.count is not None
            self.inbox.put((TokensReceived(src=src, count=header.count), None))

    def _charge_network(self, src: int, tag: int, buffer: torch.Tensor) -> None:
        """Hold a received message until its emulated arrival: an update shares its sender's
        egress with the copies to its other out-peers, and this worker's ingress with the
        updates of its other in-peers."""
        if tag == _UPDATE_TAG:
            frame = self._frames[_UPDATE_TAG]
            self.channel.arrive(src, self.channel.frame(frame).payload_bytes,
                                self._fan_out[src], UpdateHeader.decode(frame, buffer).sent_at)
        else:
            self.channel.occupy_control(point_to_point(src, self.runtime.rank,
                                                       buffer.numel() * buffer.element_size()))

    def close(self) -> None:
        """Send the deferred update, end this worker's channels, then wait until every
        neighbour has ended its own; a receive thread's error ends the wait, raised."""
        if self.core.state is not State.ERROR:  # else the error that broke it is raised
            self._execute(self.core.handle(Stopping()), self._step)
        self._wait_sends()
        end = self.channel.pack(self._frames[_UPDATE_TAG],
                                UpdateHeader(None, self.channel.stamp()).encode(), self.tensors)
        token_end = self._tokens(None)
        for peers, message, tag in ((self.core.out_peers, end, _UPDATE_TAG),
                                    (self.core.in_peers, token_end, _TOKEN_TAG)):
            for j in peers:
                if j not in self._lost:
                    self.channel.lost(j, partial(self.link.send, message, j, tag=tag))
        with self._channels:  # as long as they train: the launcher watches them
            self._channels.wait_for(lambda: self._ended() or self._failed is not None)
            failed = self._failed
        if failed is not None:
            raise RuntimeError(f"hop receiver thread failed: {failed!r}") from failed
        while not self.inbox.empty():
            self._unpack(self.inbox.get_nowait())  # raises what a receiver thread hit


def _wait_keys(wait: Wait) -> list[str]:
    """The row's keys for what a `Wait` waits for (every one it lists shares its time: the
    iteration goes on only once none is missing)."""
    return ([f"wait_update_from_{j}_s" for j in wait.updates]
            + [f"wait_token_from_{j}_s" for j in wait.tokens])
