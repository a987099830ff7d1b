"""Headers travel as int64 words beside the payload, never rounded to the model's dtype."""

from __future__ import annotations

import math

import pytest
import torch

from hetsync.transport.flat import flatten
from hetsync.transport.header import Frame, float_word, word_float
from hetsync.transport.links import Link

# Each dtype's first integer it cannot hold: Hop's tag 257 arrived as 256 in bf16 (review 3).
LINK = Link.default()  # messages are packed and received through a link
BREAKS = [(torch.bfloat16, 2**8 + 1), (torch.float16, 2**11 + 1), (torch.float32, 2**24 + 1)]


@pytest.mark.parametrize(("dtype", "value"), BREAKS)
def test_an_integer_past_the_dtypes_exact_range_survives_whole(dtype, value):
    assert int(flatten([torch.zeros(3, dtype=dtype)], float(value))[-1]) != value  # the defect
    tensors = [torch.randn(3, 2).to(dtype), torch.randn(5).to(dtype)]
    frame = Frame.of(tensors, words=3)
    header = (value, 2**53 + 1, -1)  # beyond float64's exact integers too
    message = LINK.pack(frame, header, tensors)
    received = LINK.empty(frame)
    received.copy_(message)  # what a receive into a fresh buffer holds
    assert frame.header(received) == header
    payload = frame.payload(received)
    assert payload.dtype == dtype
    assert torch.equal(payload, torch.cat([t.reshape(-1) for t in tensors]))
    assert received.numel() == 3 * 8 + frame.payload_bytes == frame.nbytes


@pytest.mark.parametrize("value", [0.0, -1.5, 1e-300, 12345.678901234567, math.inf, -math.inf])
def test_a_float_rides_a_word_bit_for_bit(value):
    assert word_float(float_word(value)) == value


def test_a_payload_written_through_the_view_lands_in_the_message():
    frame = Frame.of([torch.zeros(4, dtype=torch.float16)], words=1)
    message = LINK.pack(frame, (7,), [torch.ones(4, dtype=torch.float16)])
    frame.payload(message).mul_(3)
    assert frame.header(message) == (7,)
    assert torch.equal(frame.payload(message), torch.full((4,), 3.0, dtype=torch.float16))


def test_a_header_only_message_and_a_wrong_header_length():
    frame = Frame(words=1, numel=0, dtype=torch.int64)
    assert frame.header(LINK.pack(frame, (2**40,))) == (2**40,)
    with pytest.raises(ValueError, match="a header of 1 words, not 2"):
        LINK.pack(frame, (1, 2))


def test_a_header_through_torch_reads_as_through_host_memory():
    """A buffer that is not plain host bytes (a GPU one; here a strided view) takes torch's
    path: the same words either way."""
    frame = Frame(words=2, numel=0, dtype=torch.int64)
    plain = LINK.empty(frame)
    strided = torch.zeros(2 * frame.nbytes, dtype=torch.uint8)[::2]
    header = (-(2**63), 2**63 - 1)
    for message in (plain, strided):
        frame.write_header(message, header)
        assert frame.header(message) == header
    assert torch.equal(strided, plain)
    assert plain.view(torch.int64).tolist() == list(header)  # torch's own int64 view reads it
