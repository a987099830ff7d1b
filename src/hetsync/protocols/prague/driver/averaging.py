"""What every Prague mode does with a group: P-Reduce this worker's model over its members
through the model's channel, which charges the emulated network from the P-Reduce's own
messages; the bytes this rank sent are counted by what the kind that ran sends."""

from __future__ import annotations

import time

import torch

from hetsync.protocols.base import Step
from hetsync.protocols.prague.preduce import make_preducer
from hetsync.transport.channel import Channel
from hetsync.transport.header import Frame
from hetsync.transport.runtime import Runtime

__all__ = ["GroupAverager", "add_time"]


def add_time(step: Step, key: str, began: float) -> None:
    """Accumulate the seconds since `began` in the row's `key` (a step may wait several times)."""
    step.count_seconds(key, time.perf_counter() - began)


def _key(members: tuple[int, ...]) -> str:
    """The P-Reduce's name for the emulator's estimate of its real time, by group size."""
    return f"preduce{len(members)}"


class GroupAverager:
    """P-Reduces of `tensors` (the model) over groups, on `channel` (its link: known peers, on
    the GPU under NCCL). With lost workers possible only ``mesh`` can average over the members
    whose buffers arrived, so it is the P-Reduce used then."""

    def __init__(self, runtime: Runtime, tensors: list[torch.Tensor], channel: Channel) -> None:
        self.runtime, self.rank = runtime, runtime.rank
        self.tensors, self.channel, self.link = tensors, channel, channel.link
        self._flat: torch.Tensor | None = None  # the model's buffer, reused (Link.flat: why)
        kind = runtime.config.preduce if runtime.lost is None else "mesh"
        network = channel.network
        self.preducer = make_preducer(kind, self.rank, runtime.world_size, store=runtime.store,
                                      timeout=runtime.group_timeout,
                                      network=network if network.emulated else None,
                                      link=self.link, channel=channel)

    def preduce(self, members: tuple[int, ...], step: Step) -> None:
        """Average the model over `members` on the training thread (a blocking wait)."""
        if len(members) == 1:
            return
        self._flat = flat = self.link.flat(self.tensors, out=self._flat)
        members = self.average(step, flat, members)
        with torch.no_grad():
            self.link.unpack_into(flat, self.tensors)
        self.channel.count(step, self.bytes_out(flat, members))

    def bytes_out(self, flat: torch.Tensor, members: tuple[int, ...]) -> int:
        """What this rank sent to average `flat` over `members` with the P-Reduce kind that ran
        (a mesh sends k-1 buffers, a ring 2(k-1)/k, a leader's member one), on the wire."""
        wire = wire_bytes(self.channel, flat)
        declared = self.channel.declared(wire)  # `auto` chooses by it
        sent = sum(m.nbytes for m in self.preducer.messages(members, declared)
                   if m.src == self.rank)
        return round(sent * wire / declared) if declared else 0

    def average(self, step: Step | None, flat: torch.Tensor, members: tuple[int, ...],
                source: torch.Tensor | None = None) -> tuple[int, ...]:
        """P-Reduce `flat` over `members` (out of place: the members' `source`, only read,
        averaged into `flat`); the members it averaged over (lost ones left out). With a
        `step`, on the training thread: its wait, its time in the row's `preduce_s`; None, on
        a communication thread, whose emulated wait is the run's background."""
        began = time.perf_counter()

        def run() -> tuple[int, ...]:
            if self.runtime.lost is None:
                self.preducer.average(flat, members, source)
                averaged = members
            else:
                averaged = self.preducer.average_surviving(flat, members,
                                                           self.runtime.lost.confirm, source)
            if step is not None:
                add_time(step, "preduce_s", began)
            return averaged

        return self.channel.collective_among(step, run, wire_bytes(self.channel, flat),
                                             self.preducer.messages, _key)

    def close(self) -> None:
        self.preducer.close()


def wire_bytes(channel: Channel, flat: torch.Tensor) -> int:
    """The bytes one member's message of `flat` takes on the wire (`--compress`)."""
    return channel.frame(Frame(0, flat.numel(), flat.dtype)).payload_bytes
