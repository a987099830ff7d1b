"""`place()`: the backend and compute device of a worker, from the options and the counts
alone (the GPU count is an argument, so every rule is checked on a machine without one)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hetsync
from hetsync.errors import ConfigError
from hetsync.transport.placement import Placement, place, visible_gpus


def _place(backend: str = "auto", device: str = "auto", *, gpus: int, workers: int = 4,
           rank: int = 0) -> Placement:
    return place(backend, device, gpus=gpus, local_workers=workers, local_rank=rank)


@pytest.mark.parametrize("device", ["auto", "cpu"])
@pytest.mark.parametrize("backend", ["auto", "gloo"])
def test_without_gpus_the_workers_compute_on_the_cpu_over_gloo(backend, device):
    assert _place(backend, device, gpus=0) == Placement("gloo", "cpu", None)


def test_a_gpu_for_every_worker_gives_nccl_and_a_gpu_each():
    devices = [_place(gpus=4, rank=r).device for r in range(4)]
    assert devices == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert {_place(gpus=4, rank=r).backend for r in range(4)} == {"nccl"}
    assert _place(gpus=8, workers=2, rank=1) == Placement("nccl", "cuda:1", None)
    assert _place("nccl", "cuda", gpus=2, workers=2, rank=1) == Placement("nccl", "cuda:1", None)


def test_workers_sharing_one_gpu_get_gloo_with_their_models_on_it_and_a_note():
    """The workstation case of issue 21: one GPU, 4 workers; NCCL would refuse two ranks on
    one GPU, so gloo, the models on cuda:0, messages staged through host memory."""
    placements = [_place(gpus=1, rank=r) for r in range(4)]
    assert {(p.backend, p.device) for p in placements} == {("gloo", "cuda:0")}
    note = placements[0].note
    assert note is not None and "\n" not in note
    assert note.startswith("4 workers share 1 GPU: gloo") and "host memory" in note


def test_workers_share_several_gpus_round_robin():
    assert [_place(gpus=2, workers=5, rank=r).device for r in range(5)] == \
        ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    shared = _place(gpus=2, workers=5)
    assert shared.backend == "gloo" and "5 workers share 2 GPUs" in (shared.note or "")


def test_explicit_choices_carry_no_note():
    assert _place("gloo", gpus=1) == Placement("gloo", "cuda:0", None)
    assert _place("gloo", "cuda", gpus=4) == Placement("gloo", "cuda:0", None)
    assert _place(device="cpu", gpus=4, rank=3) == Placement("gloo", "cpu", None)


def test_a_single_process_with_a_gpu_uses_nccl_on_it():
    assert _place(gpus=1, workers=1) == Placement("nccl", "cuda:0", None)
    assert _place(device="cpu", gpus=1, workers=1) == Placement("gloo", "cpu", None)


@pytest.mark.parametrize(
    ("backend", "device", "gpus", "workers", "message"),
    [
        ("auto", "cuda", 0, 1, "--device cuda needs a CUDA device; none is visible"),
        ("gloo", "cuda", 0, 4, "--device cuda needs a CUDA device; none is visible"),
        ("nccl", "auto", 0, 1, "--backend nccl needs CUDA devices; none is visible here"),
        ("nccl", "cpu", 4, 1, "--backend nccl sends device memory, but --device cpu keeps"),
        ("nccl", "auto", 1, 4, "--backend nccl needs a GPU per worker: 4 workers on this "
         "machine, 1 GPU visible; --backend gloo lets them share"),
        ("nccl", "cuda", 2, 3, "3 workers on this machine, 2 GPUs visible"),
        ("mpi", "auto", 0, 1, "--backend must be auto or gloo or nccl (got 'mpi')"),
        ("auto", "gpu", 1, 1, "--device must be auto or cpu or cuda (got 'gpu')"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line(backend, device, gpus, workers, message):
    with pytest.raises(ConfigError) as refused:
        _place(backend, device, gpus=gpus, workers=workers)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.skipif(visible_gpus() > 0, reason="this machine has a CUDA device")
def test_init_applies_the_same_rule_with_torchruns_local_counts(monkeypatch):
    """Without a launcher (torchrun), `init()` decides by itself, from LOCAL_WORLD_SIZE and
    LOCAL_RANK, and refuses what the launcher would, before joining any group."""
    threads = torch.get_num_threads()  # init() gives a worker among 4 one thread
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    try:
        with pytest.raises(ConfigError, match="--device cuda needs a CUDA device"):
            hetsync.init(device="cuda")
    finally:
        torch.set_num_threads(threads)
    assert not dist.is_initialized()


def test_init_records_what_it_decided():
    """A world of one: by the same rule (gloo on the CPU here, NCCL on a GPU machine)."""
    expected = place("auto", "auto", gpus=visible_gpus(), local_workers=1, local_rank=0)
    runtime = hetsync.init(protocol="allreduce")
    try:
        assert (runtime.backend, runtime.device) == (expected.backend,
                                                     torch.device(expected.device))
        assert runtime.config.backend == expected.backend
        assert runtime.config.device == runtime.device.type
    finally:
        hetsync.shutdown()


def test_visible_gpus_is_a_count():
    assert isinstance(visible_gpus(), int) and visible_gpus() >= 0
