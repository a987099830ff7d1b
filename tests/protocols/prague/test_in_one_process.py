"""Prague's driver in a world of one: what needs no peers (the GG's failures, byte counts)."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import hetsync
from hetsync.api import SyncOptimizer
from hetsync.cores.errors import RemoteProtocolError
from hetsync.network.emulator import FreeNetwork
from hetsync.protocols.prague.driver.averaging import GroupAverager
from hetsync.protocols.prague.driver.overlapped import OverlappedGroups
from hetsync.protocols.prague.driver.random_groups import answer_messages
from hetsync.protocols.prague.gg_wire import FromGG, Kind, ToGG
from hetsync.protocols.prague.group_generator import Group
from hetsync.protocols.prague.preduce import make_preducer
from hetsync.transport.channel import Channel


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    hetsync.init(protocol="prague", workers=1, group_size=1, hang_timeout=20.0, device="cpu")
    yield
    hetsync.shutdown()


def _step(model: nn.Module, opt: SyncOptimizer) -> None:
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()


@pytest.mark.parametrize("overlap", [True, False])
def test_a_group_generator_failure_is_raised_at_once_with_its_cause(overlap, monkeypatch):
    runtime = hetsync.transport.runtime.current_runtime()
    monkeypatch.setattr(runtime, "config", dataclasses.replace(runtime.config, overlap=overlap))
    model = nn.Linear(4, 2)
    opt = SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    mode = opt.protocol.mode
    assert isinstance(mode, OverlappedGroups) == overlap and mode.gg is not None
    mode.gg.put(0, ToGG(Kind.FINISHED, 99, 0.0))  # a group the GG never assigned: it raises
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="Group Generator") as raised:
        for _ in range(3):
            _step(model, opt)
    assert time.monotonic() - began < 10  # not after the wait's timeout (45 s here)
    cause = raised.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert isinstance(cause, RemoteProtocolError) and "group 99" in str(cause)
    assert cause.__traceback__ is not None  # the GG thread's, printed with the error
    with pytest.raises(RuntimeError, match="Group Generator failed"):
        opt.close()


@pytest.mark.parametrize(("kind", "rank", "buffers"),
                         [("mesh", 1, 2.0), ("ring", 1, 4 / 3), ("leader", 0, 2.0),
                          ("leader", 1, 1.0)])
def test_bytes_sent_are_what_the_preduce_kind_sends(kind, rank, buffers):
    """A group of 3: a mesh member sends 2 buffers, a ring member 2 x 2/3, a leader 2 and the
    others 1 (all were counted as a mesh's)."""
    runtime = hetsync.transport.runtime.current_runtime()
    channel = Channel(runtime.links.direct, runtime, FreeNetwork())
    averager = SimpleNamespace(rank=rank, channel=channel, preducer=make_preducer(kind, rank, 3))
    flat = torch.zeros(12)  # 48 bytes
    assert GroupAverager.bytes_out(averager, flat, (0, 1, 2)) == round(48 * buffers)
    assert GroupAverager.bytes_out(averager, flat, (rank,)) == 0


def test_a_wait_for_an_unanswered_request_says_whom_it_waits_for(monkeypatch):
    """The Group Generator never answers (its messages are dropped): the step after the
    request times out, naming the Group Generator on rank 0, not after the run's timeout."""
    model = nn.Linear(4, 2)
    opt = SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    mode = opt.protocol.mode
    assert isinstance(mode, OverlappedGroups) and mode.gg is not None
    put = mode.gg.put
    with monkeypatch.context() as patch:
        patch.setattr(mode, "timeout", 0.5)
        patch.setattr(mode.gg, "put", lambda rank, message: None)
        with pytest.raises(TimeoutError, match=r"waited 0.5 s after step 2 for its previous "
                                               r"group: the Group Generator's \(rank 0\) "
                                               r"answer awaited$"):
            for _ in range(3):
                _step(model, opt)
    assert mode.gg.put == put
    opt.close()


@pytest.mark.parametrize("answers", [True, False])
def test_group_generator_messages_are_charged_their_int64_bytes(answers):
    """A request is 4 int64 words and an answer 4 + world (review-4 item 8: they were charged
    as 12 bytes and 4-byte words)."""
    answer = FromGG(Group(id=7, members=(0, 2)), answers_request=answers).encode(world=4)
    sizes = [(m.src, m.dst, m.nbytes) for m in answer_messages(2, answer)]
    assert sizes == ([(2, 0, 32), (0, 2, 64)] if answers else [(0, 2, 64)])
    end = FromGG(None).encode(world=4)  # the end marker answers the goodbye
    assert [m.nbytes for m in answer_messages(2, end)] == [32, 64]
