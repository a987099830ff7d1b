"""The parameter server's headers round-trip exactly beside a low-precision payload: a
version past a dtype's exact integers (bf16: 256, float32: 2^24) arrives whole."""

from __future__ import annotations

import pytest
import torch

from hetsync.protocols.ps.wire import PushHeader, ReplyHeader, frame
from hetsync.transport.links import Link

LINK = Link.default()
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _received(fr, message):
    buffer = LINK.empty(fr)
    buffer.copy_(message)  # what a receive into a fresh buffer holds
    return buffer


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("header", [PushHeader(version=2**24 + 1, vote=True),
                                    PushHeader(version=2**53 + 1, vote=False),
                                    PushHeader(version=0, vote=False, bye=True),
                                    ReplyHeader(version=2**24 + 1, staleness=2**31 + 3, stop=True),
                                    ReplyHeader(version=257, staleness=0, stop=False)])
def test_a_header_and_its_payload_survive(dtype, header):
    payload = torch.randn(7).to(dtype)
    fr = frame(payload.numel(), dtype)
    message = _received(fr, LINK.pack(fr, header.encode(), [payload]))
    assert type(header).decode(fr, message) == header
    assert torch.equal(fr.payload(message), payload)


def test_a_push_is_no_goodbye():
    fr = frame(0, torch.float32)
    assert not PushHeader.decode(fr, LINK.pack(fr, PushHeader(3, True).encode())).bye
