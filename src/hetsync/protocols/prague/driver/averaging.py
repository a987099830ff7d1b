"""What every Prague mode does with a group: P-Reduce this worker's model over its members,
charge the emulated network and count the bytes this rank sent."""

from __future__ import annotations

import time

import torch

from hetsync.network.emulator import NetworkEmulator
from hetsync.protocols.base import Step
from hetsync.protocols.prague.preduce import make_preducer
from hetsync.transport.links import Link
from hetsync.transport.runtime import Runtime

__all__ = ["GroupAverager", "add_time"]


def add_time(step: Step, key: str, began: float) -> None:
    """Accumulate the seconds since `began` in the row's `key` (a step may wait several times)."""
    step.count_seconds(key, time.perf_counter() - began)


class GroupAverager:
    """P-Reduces of `tensors` (the model) over groups, on `link` (known peers: on the GPU
    under NCCL). With lost workers possible only ``mesh`` can average over the members whose
    buffers arrived, so it is the P-Reduce used then."""

    def __init__(self, runtime: Runtime, tensors: list[torch.Tensor], link: Link,
                 network: NetworkEmulator | None) -> None:
        self.runtime, self.rank = runtime, runtime.rank
        self.tensors, self.link, self.network = tensors, link, network
        self._flat: torch.Tensor | None = None  # the model's buffer, reused (Link.flat: why)
        kind = runtime.config.preduce if runtime.lost is None else "mesh"
        self.preducer = make_preducer(kind, self.rank, runtime.world_size, store=runtime.store,
                                      timeout=runtime.group_timeout, network=network, link=link)

    def preduce(self, members: tuple[int, ...], step: Step) -> None:
        """Average the model over `members` on the training thread (a blocking wait)."""
        if len(members) == 1:
            return
        self._flat = flat = self.link.flat(self.tensors, out=self._flat)
        with step.blocking():
            began = time.perf_counter()
            members = self.average(flat, members)
            add_time(step, "preduce_s", began)
        if self.network is not None:
            nbytes = self.network.scaled(flat.numel() * flat.element_size())
            self.network.after_blocking(step, self.preducer.messages(members, nbytes),
                                        f"preduce{len(members)}", time.perf_counter() - began)
        with torch.no_grad():
            self.link.unpack_into(flat, self.tensors)
        step.bytes_sent += self.bytes_out(flat, members)

    def bytes_out(self, flat: torch.Tensor, members: tuple[int, ...]) -> int:
        """What this rank sent to average `flat` over `members` with the P-Reduce kind that ran
        (a mesh sends k-1 buffers, a ring 2(k-1)/k, a leader's member one)."""
        real = flat.numel() * flat.element_size()
        declared = self.network.scaled(real) if self.network is not None else real  # `auto`'s
        sent = sum(m.nbytes for m in self.preducer.messages(members, declared)
                   if m.src == self.rank)
        return round(sent * real / declared) if declared else 0

    def average(self, flat: torch.Tensor, members: tuple[int, ...],
                source: torch.Tensor | None = None) -> tuple[int, ...]:
        """P-Reduce `flat` over `members` (out of place: the members' `source`, only read,
        averaged into `flat`); the members it averaged over (lost ones left out)."""
        self.runtime.before_send()
        if self.runtime.lost is None:
            self.preducer.average(flat, members, source)
            return members
        return self.preducer.average_surviving(flat, members, self.runtime.lost.confirm,
                                               source)

    def close(self) -> None:
        self.preducer.close()
