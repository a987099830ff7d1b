"""Prague's overlapped merge: x <- c + (x - s), then s = x; in place on a model laid out in one
buffer, through a copy otherwise, the same values bit for bit; P-Reduces average s out of
place first, then c in place."""

from __future__ import annotations

import pytest
import torch

from hetsync.protocols.prague.driver.overlapped import CommunicationCopy
from hetsync.transport.contiguous import lay_out, span
from hetsync.transport.links import Link


def _model(dtype: torch.dtype, laid_out: bool) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=generator).to(dtype)
               for shape in ((3, 5), (7,), (2, 2))]
    if laid_out:
        lay_out(tensors)
    assert (span(tensors) is not None) == laid_out
    return tensors


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _run(tensors: list[torch.Tensor], preduces: list[int]) -> list[torch.Tensor]:
    """Hand over, then per entry of `preduces`: a local update, that many stand-in
    P-Reduces (the mean with another member's buffer), a merge; the model after each merge,
    checked against x <- c + (x - s) computed apart (x itself after none)."""
    copy, link = CommunicationCopy(), Link.default()
    generator = torch.Generator().manual_seed(1)
    copy.merge(link, tensors)
    handed = _flat(tensors)
    seen = []
    for count in preduces:
        for t in tensors:  # the optimizer's step, beside the P-Reduces
            t.add_(torch.randn(t.shape, generator=generator).to(t.dtype), alpha=0.1)
        average = handed.clone()
        for _ in range(count):
            source, out = copy.preduce_buffers()
            other = torch.randn(source.shape, generator=generator).to(source.dtype)
            torch.add(source, other, out=out).div_(2)
            average = (average + other) / 2
            assert torch.equal(out, average)
        # where nothing was averaged, x stays as it is (x - s + s would only round)
        expected = (_flat(tensors) - handed) + average if count else _flat(tensors)
        copy.merge(link, tensors)
        assert torch.equal(_flat(tensors), expected)
        handed = _flat(tensors)
        seen.append(handed)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_laid_out_model_merges_in_place_to_the_copys_values_bit_for_bit(dtype):
    preduces = [1, 0, 2, 1, 0, 0, 3]
    apart = _run(_model(dtype, laid_out=False), preduces)
    together = _run(_model(dtype, laid_out=True), preduces)
    assert all(torch.equal(a, b) for a, b in zip(apart, together, strict=True))


@pytest.mark.parametrize("laid_out", [True, False])
def test_a_p_reduce_reads_the_model_handed_over_and_leaves_it_as_it_was(laid_out):
    tensors = _model(torch.float32, laid_out)
    copy = CommunicationCopy()
    copy.merge(Link.default(), tensors)
    handed = _flat(tensors)
    source, out = copy.preduce_buffers()
    assert torch.equal(source, handed) and out.data_ptr() != source.data_ptr()
    out.fill_(3.0)
    again, into = copy.preduce_buffers()  # the next one averages the average, in place
    assert again is out and into is out and torch.equal(source, handed)


def test_with_no_update_and_no_average_a_merge_changes_nothing():
    tensors = _model(torch.float32, laid_out=True)
    before = [t.clone() for t in tensors]
    copy, link = CommunicationCopy(), Link.default()
    for _ in range(3):
        copy.merge(link, tensors)
        assert all(torch.equal(a, b) for a, b in zip(tensors, before, strict=True))


@pytest.mark.parametrize("laid_out", [True, False])
def test_a_merge_with_nothing_averaged_keeps_the_updated_model_bit_for_bit(laid_out):
    """A group of one (or none) since the handover: the merge only hands the model over, so
    the local updates are kept exactly, not as (x - s) + s."""
    tensors = _model(torch.bfloat16, laid_out)
    copy, link = CommunicationCopy(), Link.default()
    copy.merge(link, tensors)
    for t in tensors:
        t.add_(torch.full_like(t, 1e-3))  # small against x: x - s + s would round it away
    after = [t.clone() for t in tensors]
    copy.merge(link, tensors)
    assert all(torch.equal(a, b) for a, b in zip(tensors, after, strict=True))
    source, _ = copy.preduce_buffers()
    assert torch.equal(source, _flat(after))
