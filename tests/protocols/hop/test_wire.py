"""Hop's headers round-trip exactly: a tag past bf16's integers (257 arrived as 256 when it
rode in the model's dtype, review 3), the send time bit for bit, and the end markers."""

from __future__ import annotations

import pytest
import torch

from hetsync.protocols.hop.wire import TOKEN_FRAME, TokenHeader, UpdateHeader, update_frame
from hetsync.transport.links import Link

LINK = Link.default()


def _received(fr, message):
    buffer = LINK.empty(fr)
    buffer.copy_(message)  # what a receive into a fresh buffer holds
    return buffer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("header", [UpdateHeader(tag=257, sent_at=0.0),
                                    UpdateHeader(tag=2**24 + 1, sent_at=12345.678901234567),
                                    UpdateHeader(tag=0, sent_at=1.5),
                                    UpdateHeader(tag=None, sent_at=3.25)])
def test_an_update_and_its_model_survive(dtype, header):
    model = [torch.randn(3, 2).to(dtype)]
    fr = update_frame(model)
    message = _received(fr, LINK.pack(fr, header.encode(), model))
    assert UpdateHeader.decode(fr, message) == header
    assert UpdateHeader.decode(fr, message).end == (header.tag is None)
    assert torch.equal(fr.payload(message), model[0].reshape(-1))


@pytest.mark.parametrize("count", [0, 1, 2**24 + 1, None])
def test_a_token_count_survives(count):
    message = _received(TOKEN_FRAME, LINK.pack(TOKEN_FRAME, TokenHeader(count).encode()))
    assert TokenHeader.decode(TOKEN_FRAME, message) == TokenHeader(count)
    assert TokenHeader.decode(TOKEN_FRAME, message).end == (count is None)
