"""Every protocol with a CUDA model: over gloo with workers sharing one GPU, and over NCCL with
one worker (issue 21: Prague and D-PSGD handed a CUDA tensor to gloo and crashed).

The model lives on the device (`gpu_device`: cuda, or cpu with HETSYNC_TEST_GPU_DEVICE=cpu to
check this logic without a GPU) and every message to and from it is staged through the
transport. Model-averaging protocols run with lr 0 from different models: the sum of the
models must be conserved and the models must meet at their average, which fails if a staged
copy never reaches the device. With lr 0 the gradient protocols never move a model, so they
train on rank-dependent data from one model instead: their workers must stay identical
(the averaged gradient reached every device copy). Every run checks the BatchNorm statistics
and that `consensus_model()` is their average, on the model's device.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = [pytest.mark.gpu, pytest.mark.integration]
SCRIPT = Path(__file__).parent / "scripts" / "on_device.py"
WORKERS = 4  # sharing one GPU, as on the one-H100 machine

MIXING = {  # lr 0: conservation and consensus
    "dpsgd": {"protocol": "dpsgd"},
    "hop": {"protocol": "hop"},
    "adpsgd": {"protocol": "adpsgd"},
    "prague": {"protocol": "prague"},
    "prague-no-overlap": {"protocol": "prague", "overlap": False},
    "prague-static": {"protocol": "prague", "schedule": "static"},
}
GRADIENT = {  # lr > 0 from one model: the workers stay identical (async: they train)
    "allreduce": {"protocol": "allreduce"},
    "ddp": {"protocol": "ddp"},
    "ps-sync": {"protocol": "ps", "ps_mode": "sync"},
    "ps-async": {"protocol": "ps", "ps_mode": "async"},
}


def _run(out: Path, where: str, lr: float, workers: int, iterations: int,
         **options: object) -> list[dict]:
    out.mkdir()
    run(RunConfig(workers=workers, script=[str(SCRIPT), str(out), where, str(lr)], out=out,
                  max_iterations=iterations, quiet=True, **options))
    return [torch.load(out / f"device_rank{r}.pt") for r in range(workers)]


def _check_devices_and_batchnorm(saved: list[dict], device: str) -> None:
    """Every model and consensus model on `device`'s type; the consensus model holds the
    average of the parameters and of the running statistics, which moved and stayed finite."""
    for s in saved:
        assert torch.device(s["device"]).type == torch.device(device).type
        assert s["consensus_devices"] == [s["device"]]
    finals = torch.stack([s["final"] for s in saved])
    means = torch.stack([s["running_mean"] for s in saved])
    for s in saved:
        assert torch.allclose(s["consensus"], finals.mean(0), atol=1e-5)
        assert torch.allclose(s["consensus_running_mean"], means.mean(0), atol=1e-5)
        assert torch.isfinite(s["running_mean"]).all() and (s["running_var"] > 0).all()
    assert means.abs().mean() > 0.05  # the forward passes moved the statistics from 0


@pytest.mark.parametrize("options", list(MIXING.values()), ids=list(MIXING))
def test_model_averaging_conserves_the_sum_on_the_device(options, gpu_device, tmp_path):
    saved = _run(tmp_path / "run", gpu_device, 0.0, WORKERS, 80, backend="gloo", **options)
    initial = torch.stack([s["initial"] for s in saved])
    final = torch.stack([s["final"] for s in saved])
    assert torch.allclose(final.sum(0), initial.sum(0), atol=1e-4)
    assert (final - final.mean(0)).abs().max() < 1e-3 * (initial - initial.mean(0)).abs().max()
    _check_devices_and_batchnorm(saved, gpu_device)


@pytest.mark.parametrize("options", list(GRADIENT.values()), ids=list(GRADIENT))
def test_gradient_protocols_keep_the_workers_together_on_the_device(options, gpu_device,
                                                                    tmp_path):
    saved = _run(tmp_path / "run", gpu_device, 0.05, WORKERS, 30, backend="gloo", **options)
    final = torch.stack([s["final"] for s in saved])
    assert torch.isfinite(final).all()
    assert (final[0] - saved[0]["initial"]).abs().max() > 1e-3  # it trained
    if options.get("ps_mode") != "async":  # async workers end some pulls apart
        assert (final - final[0]).abs().max() < 1e-5
    _check_devices_and_batchnorm(saved, gpu_device)


@pytest.mark.parametrize("options", [*MIXING.values(), *GRADIENT.values()],
                         ids=[*MIXING, *GRADIENT])
def test_one_worker_over_nccl(options, gpu_device, tmp_path):
    """`--backend nccl --workers 1`, the model on the device the run placed the worker on
    (`hetsync.init().device`). With HETSYNC_TEST_GPU_DEVICE=cpu: gloo, the model on the CPU."""
    backend, where = ("gloo", "cpu") if gpu_device == "cpu" else ("nccl", "runtime")
    group = {"group_size": 1} if options["protocol"] == "prague" else {}
    saved = _run(tmp_path / "run", where, 0.05, 1, 30, backend=backend, **options, **group)
    assert torch.device(saved[0]["device"]).type == torch.device(gpu_device).type
    assert saved[0]["consensus_devices"] == [saved[0]["device"]]
    assert torch.equal(saved[0]["consensus"], saved[0]["final"])
    assert (saved[0]["final"] - saved[0]["initial"]).abs().max() > 1e-3  # it trained


@pytest.mark.parametrize("protocol", ["hop", "adpsgd", "prague", "ps"])
def test_a_cpu_run_on_a_gpu_machine_leaves_cuda_alone(protocol, tmp_path):
    """`--device cpu` where a GPU is visible (the `real` suites on a GPU machine): no worker
    starts CUDA. A link that pinned its buffers wherever CUDA was available started it in
    every worker at its first buffer, inside the run's clock (docs/gpus.md)."""
    saved = _run(tmp_path / "run", "cpu", 0.05, 2, 20, protocol=protocol, device="cpu")
    assert [s["device"] for s in saved] == ["cpu", "cpu"]
    assert not any(s["cuda_initialized"] for s in saved)

