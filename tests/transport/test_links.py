"""The links (hetsync.transport.links): buffers are packed onto the wire device and checked
there before every operation; messages are the bytes they always were. On a real world of
one over gloo (a HashStore), and two real processes for point-to-point transfers. The
`meta` device stands in for a device other than the wire's (a GPU on a gloo wire)."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.protocols.ddp.driver import DDP
from hetsync.transport.contiguous import lay_out
from hetsync.transport.flat import BufferDrift, average_model, broadcast_model, model_tensors
from hetsync.transport.header import Frame
from hetsync.transport.links import Link, Links, WireDeviceError
from hetsync.transport.mixing import average_pair_into, mix, mix_into
from hetsync.transport.runtime import Runtime

META = torch.device("meta")


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo process group of one rank, unless one exists already (left as it is then)."""
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if made:
        dist.destroy_process_group()


def _tensors(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 4, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype),
            torch.randn(2, 1, 2, generator=g).to(dtype)]


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "send", "recv", "isend", "irecv",
                                "post", "exchange"])
def test_a_buffer_off_the_wire_never_reaches_the_process_group(op):
    link = Link("host", None, torch.device("cpu"))
    buffer = torch.zeros(4, device=META)
    call = {"all_reduce": lambda: link.all_reduce(buffer),
            "broadcast": lambda: link.broadcast(buffer, 0),
            "send": lambda: link.send(buffer, 1), "recv": lambda: link.recv(buffer, 1),
            "isend": lambda: link.isend(buffer, 1), "irecv": lambda: link.irecv(buffer, 1),
            "post": lambda: link.post([(buffer, 1)], [], 7),
            "exchange": lambda: link.exchange([], [(buffer, 1)], 7)}[op]
    with pytest.raises(WireDeviceError, match=r"the host link \(gloo\) carries buffers on cpu, "
                                              r"but \w+ was given one on meta"):
        call()


def test_a_host_buffer_is_refused_by_a_device_wire():
    link = Link("direct", None, META)  # as NCCL's wire on the GPU refuses host memory
    with pytest.raises(WireDeviceError, match="on meta, but send was given one on cpu"):
        link.send(torch.zeros(2), 1)
    assert link.flat([torch.zeros(2)]).device == META  # packing puts buffers there


def test_links_of_a_run_put_collectives_on_the_compute_device_only_under_nccl():
    gloo = Links.of("gloo", torch.device("cpu"), None, None)
    assert gloo.direct.device == gloo.host.device == torch.device("cpu")
    assert gloo.direct.group is None and gloo.host.group is None
    nccl = Links.of("nccl", META, None, None)  # META: the GPU
    assert nccl.direct.device == META and nccl.host.device == torch.device("cpu")


def test_host_buffers_are_pinned_for_a_model_on_a_gpu_only():
    """Also on a machine with a GPU, a CPU run pins nothing (pinning would start CUDA in every
    worker); a GPU model's host buffers are pinned, also on the direct link under gloo."""
    cpu = Links.of("gloo", torch.device("cpu"), None, None)
    assert not cpu.direct.pinned and not cpu.host.pinned and not Link.default().pinned
    staged = Links.of("gloo", torch.device("cuda", 0), None, None)  # several ranks on one GPU
    assert staged.direct.pinned and staged.host.pinned
    assert staged.direct.device == staged.host.device == torch.device("cpu")
    with pytest.raises(ValueError, match="only host buffers are pinned, not meta"):
        Link("direct", None, META, pinned=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("laid_out", [False, True])
def test_flat_then_unpack_restores_every_tensor(dtype, laid_out):
    link = Link.default()
    tensors = _tensors(dtype)
    if laid_out:
        assert lay_out(tensors)
    flat = link.flat(tensors, 1.0, 3.0)
    assert flat.dtype == dtype and flat.numel() == 12 + 5 + 4 + 2
    assert flat[-2:].tolist() == [1.0, 3.0]
    copies = [torch.zeros_like(t) for t in tensors]
    if laid_out:
        assert lay_out(copies)  # then unpacked in one copy
    link.unpack_into(flat[:-2], copies)
    assert all(torch.equal(a, b) for a, b in zip(copies, tensors, strict=True))


def _same_average(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """Bit for bit in fp32; in bf16 within one rounding (vectorised and scalar loops of a
    scaled add round apart, and a tensor's boundary moves elements between them)."""
    for a, b in zip(got, want, strict=True):
        if a.dtype == torch.bfloat16:
            torch.testing.assert_close(a, b, rtol=2**-7, atol=2**-7)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("in_place", "contiguous", "laid_out"),
                         [(True, True, False), (True, False, False), (False, True, False),
                          (False, False, False), (True, True, True)])
@pytest.mark.parametrize("weights", [(0.45, 0.3, 0.25), (0.5, 0.5), (0.3, 0.7)],
                         ids=["three", "pair", "uneven-pair"])
def test_mix_into_is_the_flat_average_bit_for_bit(dtype, in_place, contiguous, laid_out,
                                                 weights):
    """In place on the tensors where their dtype is the buffers', through a flat buffer where it
    is not (one tensor of another dtype): both give what flat, `mix`, unpack gave. The
    shapes cross the kernels' vector widths; in place, fp32 goes through torch's multi-tensor
    ops, bf16 and a non-contiguous tensor tensor by tensor, and tensors laid out in one
    buffer (`lay_out`) as that buffer: the reference's own arithmetic, exact in bf16 too."""
    link = Link.default()
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=generator).to(dtype)
               for shape in ((3, 4), (5,), (1000,), (333, 7))]
    if not contiguous:
        tensors.append(torch.randn(9, 4, generator=generator).to(dtype).T)
    if not in_place:
        tensors.append(torch.randn(7, generator=generator, dtype=torch.float64))
    if laid_out:
        assert lay_out(tensors)
    numel = sum(t.numel() for t in tensors)
    self_weight, *others = weights
    inputs = [(torch.randn(numel, generator=generator).to(dtype), weight) for weight in others]
    expected = link.flat(tensors)
    mix(expected, self_weight, inputs)
    want = [torch.zeros_like(t) for t in tensors]
    link.unpack_into(expected, want)
    scratch = mix_into(link, tensors, self_weight, inputs)
    assert (scratch is None) == in_place
    if laid_out:
        assert all(torch.equal(a, b) for a, b in zip(tensors, want, strict=True))
    _same_average(tensors, want)


def test_mix_of_a_pair_is_its_correctly_rounded_mean_where_the_models_are_close():
    """`mix` of a pair is one lerp, not a scaling and an add: where the two values are within a
    factor of 2 (models being averaged are), it is the mean rounded once, as the scaled sum
    is, bit for bit; anywhere it is within a rounding of the larger value of the exact mean.
    More terms are the scaled sum itself."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(100_003, generator=generator)
    close = x * (1 + 0.4 * torch.rand(x.shape, generator=generator))  # within a factor of 2
    mean = x.clone()
    mix(mean, 0.5, [(close, 0.5)])
    assert torch.equal(mean, ((x.double() + close.double()) / 2).float())
    assert torch.equal(mean, x.mul(0.5).add_(close, alpha=0.5))
    far = torch.randn(x.shape, generator=generator) * 100  # signs and scales apart
    mean = x.clone()
    mix(mean, 0.5, [(far, 0.5)])
    exact = (x.double() + far.double()) / 2
    larger = torch.maximum(x.abs(), far.abs()).double()
    assert ((mean.double() - exact).abs() <= larger * 2**-23).all()
    three = x.clone()
    mix(three, 0.45, [(close, 0.3), (far, 0.25)])
    assert torch.equal(three, x.mul(0.45).add_(close, alpha=0.3).add_(far, alpha=0.25))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("in_place", "laid_out"), [(True, False), (False, False), (True, True)])
def test_average_pair_into_is_the_flat_average_bit_for_bit(dtype, in_place, laid_out):
    """AD-PSGD's served average: tensor by tensor where the dtypes allow, over the one buffer
    of a laid-out model, through the flat buffer where not; all as flat, add, halve, unpack
    gave (`mix`'s mean of a pair), in the reply and in the model."""
    link = Link.default()
    generator = torch.Generator().manual_seed(1)
    tensors = [torch.randn(shape, generator=generator).to(dtype)
               for shape in ((3, 4), (5,), (1000,), (333, 7))]
    if not in_place:
        tensors.append(torch.randn(7, generator=generator, dtype=torch.float64))
    if laid_out:
        assert lay_out(tensors)
    other = torch.randn(sum(t.numel() for t in tensors), generator=generator).to(dtype)
    expected = link.flat(tensors)
    mix(expected, 0.5, [(other, 0.5)])
    want = [torch.zeros_like(t) for t in tensors]
    link.unpack_into(expected, want)
    out = torch.full_like(other, float("nan"))
    average_pair_into(link, tensors, other, out)
    assert torch.equal(out, expected)
    assert all(torch.equal(a, b) for a, b in zip(tensors, want, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("laid_out", [False, True])
@pytest.mark.parametrize("weights", [(0.45, 0.3, 0.25), (0.5, 0.5)], ids=["three", "pair"])
def test_buffer_drift_mix_into_is_the_corrected_flat_average_bit_for_bit(dtype, laid_out,
                                                                       weights):
    """D-PSGD's average: the parameters in place, the BatchNorm statistics (moved by the
    forward pass since they were sent) corrected, as the flat sum, `apply`, unpack gave."""
    link = Link.default()
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(40, 60), nn.BatchNorm1d(60)).to(dtype)
    tensors = model_tensors(model)
    if laid_out:
        assert lay_out(tensors)
    drift = BufferDrift(model)
    sent = link.flat(tensors)
    model(torch.randn(8, 40, dtype=dtype))  # the forward pass moves the running statistics
    self_weight, *others = weights
    inputs = [(torch.randn_like(sent), weight) for weight in others]
    expected = sent.clone()
    mix(expected, self_weight, inputs)
    drift.apply(expected, sent)
    want = [torch.zeros_like(t) for t in tensors]
    link.unpack_into(expected, want)
    assert drift.mix_into(link, tensors, self_weight, sent, inputs) is None  # no model buffer
    _same_average(tensors, want)  # bf16: the parameters' span ends where the reference's not


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_message_is_the_frame_s_bytes_and_unpacks(dtype):
    link, tensors = Link.default(), _tensors(dtype)
    frame = Frame.of(tensors, words=2)
    header = (2**40 + 1, -1)
    message = link.pack(frame, header, tensors)
    wire = [torch.tensor(header).view(torch.uint8),
            *(t.reshape(-1).view(torch.uint8) for t in tensors)]
    assert torch.equal(message, torch.cat(wire))  # the int64 words, then the values' bytes
    assert frame.header(message) == header
    received = link.empty(frame)
    received.copy_(message)
    copies = [torch.zeros_like(t) for t in tensors]
    link.unpack_into(frame.payload(received), copies)
    assert all(torch.equal(a, b) for a, b in zip(copies, tensors, strict=True))
    assert torch.equal(link.pack(Frame(1, 0, torch.int64), (5,)),
                       torch.tensor([5]).view(torch.uint8))


def test_collectives_on_a_world_of_one(world_of_one):
    link = Link.default()
    flat = link.flat(_tensors())
    before = flat.clone()
    link.all_reduce(flat)
    work = link.all_reduce(flat, async_op=True)
    assert work is not None
    assert torch.equal(work.get_future().wait()[0], before)
    link.broadcast(flat, 0)
    link.barrier()
    assert torch.equal(flat, before)
    model = nn.Linear(3, 2)
    weights = model.weight.detach().clone()
    broadcast_model(model, link)
    average_model(model, link)
    assert torch.equal(model.weight, weights)


def test_ddp_under_nccl_with_a_model_on_the_cpu_is_a_config_error():
    runtime = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                      backend="nccl", config=RunConfig(protocol="ddp"), store=dist.HashStore(),
                      t0=time.time(), run_dir=None, launched=False, hang_timeout=20.0)
    model = nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="ddp: --backend nccl .* model is on cpu"):
        DDP(runtime, model, torch.optim.SGD(model.parameters(), lr=0.1))


# --- two processes: batched exchanges, sends and receives ----------------------
def _pair(rank: int, port: int, out: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    link, other = Links().direct, 1 - rank
    frame = Frame(2, 3, torch.bfloat16)
    mine = link.pack(frame, (rank, 2**40), [torch.full((3,), rank + 0.5)])
    theirs = link.empty(frame)
    link.exchange([(mine, other)], [(theirs, other)], tag=5)
    got = link.empty(frame)
    if rank == 0:
        link.recv(got, 1, tag=6)
        link.send(mine, 1, tag=7)
    else:
        link.send(mine, 0, tag=6)
        link.recv(got, 0, tag=7)
    link.barrier()
    torch.save({"exchanged": theirs, "got": got}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_processes_exchange_send_and_receive(tmp_path, spawn):
    spawn(_pair, 2, tmp_path).join()
    frame = Frame(2, 3, torch.bfloat16)
    for rank in range(2):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        other = 1 - rank
        assert frame.header(saved["exchanged"]) == (other, 2**40)
        assert frame.payload(saved["exchanged"]).tolist() == [other + 0.5] * 3
        assert frame.header(saved["got"]) == (other, 2**40)


def test_no_tensors_to_mix_or_unpack_is_nothing_to_do():
    """A model part with no tensors (a parameter server's client without buffers, say)."""
    link = Link.default()
    flat = torch.zeros(0)
    link.unpack_into(flat, [])
    assert mix_into(link, [], 0.5, [(flat, 0.5)]) is None
