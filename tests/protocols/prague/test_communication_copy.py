"""Prague's overlapped merge: in place on a model laid out in one buffer, through a copy
otherwise, the same values bit for bit."""

from __future__ import annotations

import pytest
import torch

from hetsync.protocols.prague.driver.overlapped import CommunicationCopy
from hetsync.transport.contiguous import lay_out, span
from hetsync.transport.links import Link


def _model(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in ((3, 5), (7,), (2, 2))]


def _merges(tensors: list[torch.Tensor], steps: int = 3) -> list[list[torch.Tensor]]:
    """Merge, train (a local update), average the copy (a stand-in P-Reduce), merge ...;
    the model after each merge, and the copy then."""
    copy, link = CommunicationCopy(), Link.default()
    generator = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        copy.merge(link, tensors)
        assert copy.comm is not None
        seen.append([t.clone() for t in tensors] + [copy.comm.clone()])
        for t in tensors:  # the optimizer's step
            t.add_(torch.randn(t.shape, generator=generator).to(t.dtype), alpha=0.1)
        copy.comm.mul_(0.5).add_(torch.randn(copy.comm.shape, generator=generator)
                                 .to(copy.comm.dtype), alpha=0.5)  # its group's mean
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_laid_out_model_merges_in_place_to_the_copys_values_bit_for_bit(dtype):
    pieces, laid_out = _model(dtype), _model(dtype)
    lay_out(laid_out)
    assert span(laid_out) is not None and span(pieces) is None
    for apart, together in zip(_merges(pieces), _merges(laid_out), strict=True):
        for a, b in zip(apart, together, strict=True):
            assert torch.equal(a, b)


def test_with_no_update_and_no_average_a_merge_changes_nothing():
    tensors = _model(torch.float32)
    lay_out(tensors)
    before = [t.clone() for t in tensors]
    copy, link = CommunicationCopy(), Link.default()
    for _ in range(3):
        copy.merge(link, tensors)
        assert all(torch.equal(a, b) for a, b in zip(tensors, before, strict=True))
