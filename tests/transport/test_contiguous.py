"""A model's state in one buffer (hetsync.transport.contiguous): laid out once, the same
Parameter objects train as before, and the links find the buffer only while it is intact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetsync.transport.contiguous import lay_out, span
from hetsync.transport.flat import model_tensors


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 10))


def test_laid_out_tensors_keep_their_values_and_objects_and_are_one_span():
    model = _model()
    tensors = model_tensors(model)
    before = [t.clone() for t in tensors]
    params = list(model.parameters())
    assert span(tensors) is None
    assert lay_out(tensors)
    assert list(model.parameters()) == params  # the same Parameter objects
    assert all(torch.equal(a, b) for a, b in zip(model_tensors(model), before, strict=True))
    whole = span(model_tensors(model))
    assert whole is not None and whole.numel() == sum(t.numel() for t in tensors)
    assert torch.equal(whole, torch.cat([t.reshape(-1) for t in before]))
    assert lay_out(tensors)  # again: nothing to do


def test_a_laid_out_model_trains_and_loads_as_before():
    """Forward, backward, the optimizer's step and a state dict's load act on the views, so
    the span sees every change; BatchNorm's statistics move in it too."""
    model, twin = _model(), _model()
    assert lay_out(model_tensors(model))
    x = torch.randn(8, 3, 8, 8)
    for m in (model, twin):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            optimizer.zero_grad()
            m(x).square().mean().backward()
            optimizer.step()
    assert all(torch.equal(a, b) for a, b in
               zip(model_tensors(model), model_tensors(twin), strict=True))
    whole = span(model_tensors(model))
    assert whole is not None
    assert torch.equal(whole, torch.cat([t.reshape(-1) for t in model_tensors(twin)]))
    fresh = _model()
    model.load_state_dict(fresh.state_dict())
    assert span(model_tensors(model)) is not None  # copied into the views
    assert torch.equal(whole, torch.cat([t.reshape(-1) for t in model_tensors(fresh)]))


def test_a_model_moved_after_is_no_longer_one_span():
    """Also once its span was found (and remembered): every call checks again."""
    model = _model()
    assert lay_out(model_tensors(model))
    assert span(model_tensors(model)) is not None
    model.to(torch.float64)
    assert span(model_tensors(model)) is None
    model = _model()
    tensors = model_tensors(model)
    assert lay_out(tensors)
    assert span(tensors) is not None and span(tensors[2:]) is not None
    tensors[2].data = tensors[2].data.clone()  # one tensor moved
    assert span(tensors) is None and span(tensors[2:]) is None
    assert span(tensors[3:]) is not None  # the rest still are


@pytest.mark.parametrize("case", ["dtypes", "channels-last", "shared storage"])
def test_tensors_that_cannot_share_one_buffer_are_left_as_they_are(case):
    a, b = torch.randn(4, 3, 2, 2), torch.randn(5)
    if case == "dtypes":
        b = b.double()
    elif case == "channels-last":
        a = a.to(memory_format=torch.channels_last)
    else:
        b = a.view(-1)[:5]  # tied: laying out would untie them
    pointers = (a.data_ptr(), b.data_ptr())
    assert not lay_out([a, b])
    assert (a.data_ptr(), b.data_ptr()) == pointers
    assert span([a, b]) is None


def test_empty_tensors_and_no_tensors():
    tensors = [torch.empty(0), torch.randn(3), torch.empty(0), torch.randn(2), torch.empty(0)]
    values = torch.cat(tensors)
    assert lay_out(tensors)
    whole = span(tensors)
    assert whole is not None and torch.equal(whole, values)
    assert span([tensors[1], torch.empty(0), tensors[3]]) is not None  # empty: anywhere
    assert span([tensors[3], tensors[1]]) is None  # out of order
    assert not lay_out([]) and span([]) is None
    assert span([torch.empty(0)]) is None
