"""AD-PSGD's header (an average or a goodbye) round-trips beside a low-precision model."""

from __future__ import annotations

import pytest
import torch

from hetsync.protocols.adpsgd.wire import Header, frame
from hetsync.transport.links import Link


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("header", [Header(), Header(bye=True), Header(iteration=2**40 + 257)])
def test_a_header_and_its_model_survive(dtype, header):
    model = [torch.randn(3, 2).to(dtype), torch.full((2**8 + 1,), 2**24 + 1.0).to(dtype)]
    fr = frame(model)
    link = Link.default()
    received = link.empty(fr)
    received.copy_(link.pack(fr, header.encode(), model))
    assert Header.decode(fr, received) == header
    assert torch.equal(fr.payload(received), torch.cat([t.reshape(-1) for t in model]))
