"""D-PSGD's header (stop_at, time posted) survives bit for bit beside a low-precision model:
as an extra element in bf16 a stop at iteration 2^24 + 1 (or 257) would round."""

from __future__ import annotations

import math

import pytest
import torch

from hetsync.protocols.dpsgd.wire import ModelHeader, frame
from hetsync.transport.links import Link


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("header", [ModelHeader(stop_at=math.inf, posted=0.0),
                                    ModelHeader(stop_at=2**24 + 1, posted=12345.678901234567),
                                    ModelHeader(stop_at=257, posted=1e-300)])
def test_a_header_and_its_model_survive(dtype, header):
    model = [torch.randn(5).to(dtype)]
    fr = frame(model)
    link = Link.default()
    received = link.empty(fr)
    received.copy_(link.pack(fr, header.encode(), model))
    assert ModelHeader.decode(fr, received) == header
    assert torch.equal(fr.payload(received), model[0])
