"""The wire formats of `--compress`: what each one loses, and a compressed all-reduce that
sums in fp32 over real processes."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetsync.transport.channel import compressed_all_reduce
from hetsync.transport.codec import INT8_CHUNK, Codec, Residual, codec
from hetsync.transport.links import Links


@pytest.mark.parametrize(("kind", "ratio", "error"), [
    ("none", 1.0, 0.0), ("bf16", 0.5, 2**-8), ("fp16", 0.5, 2**-11), ("int8", 0.251, 1 / 254)])
def test_each_codec_has_its_size_and_its_error(kind, ratio, error):
    values = torch.randn(3 * INT8_CHUNK + 17, generator=torch.Generator().manual_seed(0))
    c = codec(kind)
    wire = c.encode(values)
    assert wire.dtype == torch.uint8 and wire.numel() == c.nbytes(values.numel())
    assert c.ratio() == pytest.approx(ratio, abs=0.002)
    back = c.decode(wire, torch.empty_like(values))
    scale = values.abs().max() if kind == "int8" else values.abs()
    assert ((back - values).abs() <= scale * error + 1e-12).all()


def test_an_all_zero_chunk_and_a_short_tail_decode_exactly():
    values = torch.zeros(INT8_CHUNK + 3)
    values[-3:] = torch.tensor([1.0, -2.0, 0.5])
    c = Codec("int8")
    back = c.decode(c.encode(values), torch.empty_like(values))
    assert back[:INT8_CHUNK].eq(0).all()
    assert back[-3:].tolist() == pytest.approx([1.0, -2.0, 0.5], abs=2 / 127)


def test_error_feedback_cancels_the_rounding_over_repeated_sends():
    """The same value sent 100 times: without feedback every copy carries one rounding, with
    it the decoded copies' mean converges to the value."""
    value = torch.full((INT8_CHUNK,), 0.3)
    value[0] = 1.0  # the chunk's scale: 0.3 falls between two int8 steps
    c, residual = Codec("int8"), Residual()
    sent = []
    for _ in range(100):
        wire_in = value.clone()
        residual.add_into(wire_in)
        decoded = c.decode(c.encode(wire_in), torch.empty_like(value))
        residual.keep(wire_in, decoded)
        sent.append(decoded)
    plain = c.decode(c.encode(value), torch.empty_like(value))
    fed_back = torch.stack(sent).mean(0)
    assert (plain[1:] - 0.3).abs().max() > 5e-4
    assert (fed_back[1:] - 0.3).abs().max() < 5e-5


def test_an_unknown_codec_is_one_line():
    with pytest.raises(ValueError, match="--compress must be none or bf16 or fp16 or int8"):
        codec("fp8")


def _reduce(rank: int, port: int, kind: str, out: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3, timeout=timeout)
    generator = torch.Generator().manual_seed(rank)
    flat = torch.cat([torch.randn(2 * INT8_CHUNK + 5, generator=generator),
                      torch.tensor([float(rank + 1), 300.0])])  # two votes at its end
    mine = flat.clone()
    wire = compressed_all_reduce(Links().direct, Codec(kind), flat, 2, Residual(), Residual())
    torch.save({"mine": mine, "sum": flat, "wire": wire}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize("kind", [pytest.param("bf16", marks=pytest.mark.slow), "int8"])
def test_a_compressed_all_reduce_sums_in_fp32_with_exact_votes(tmp_path, spawn, kind):
    spawn(_reduce, 3, kind, tmp_path).join()
    saved = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(3)]
    exact = sum(s["mine"] for s in saved)
    for s in saved:
        assert torch.equal(s["sum"], saved[0]["sum"])  # every worker holds the same sum
        assert s["sum"][-2:].tolist() == [6.0, 900.0]  # the votes, exact
        tolerance = 3 * (2**-8 if kind == "bf16" else 2 / 254) * exact[:-2].abs().max()
        assert (s["sum"][:-2] - exact[:-2]).abs().max() <= tolerance
        full = exact.numel() * 4
        assert s["wire"] < full * (0.6 if kind == "bf16" else 0.3)
