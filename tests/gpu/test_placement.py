"""Where the workers go, end to end on a GPU machine (issue 21: the defaults died on one GPU,
since NCCL refuses several ranks on one device).

`--backend auto` picks NCCL only where every local worker has a GPU of its own, else gloo
with the workers sharing the GPUs; `--backend nccl` with more local workers than GPUs fails
in one line before any worker starts; `--device cuda` puts every worker's model on a GPU.
These need a real GPU and the `--device` option: they skip under HETSYNC_TEST_GPU_DEVICE=cpu.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hetsync.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.integration]
SCRIPT = Path(__file__).parent / "scripts" / "on_device.py"


@pytest.fixture
def gpus(gpu_device: str) -> int:
    if gpu_device == "cpu":
        pytest.skip("needs a GPU: placement counts the visible CUDA devices")
    return torch.cuda.device_count()


def test_defaults_with_more_workers_than_gpus_choose_gloo_and_say_so(gpus, tmp_path, capfd):
    workers = max(4, gpus + 1)
    out = tmp_path / "run"
    code = main(["train", "--workload", "digits", "--workers", str(workers),
                 "--max-iterations", "20", "--out", str(out)])
    captured = capfd.readouterr()
    assert code == 0, captured.err
    assert "gloo" in captured.out + captured.err  # the note that says why not NCCL
    assert json.loads((out / "summary.json").read_text())["iterations"] == [20] * workers


def test_nccl_with_more_workers_than_gpus_fails_in_one_line_before_spawning(gpus, tmp_path,
                                                                           capfd):
    out = tmp_path / "run"
    code = main(["train", "--workload", "digits", "--backend", "nccl",
                 "--workers", str(gpus + 1), "--out", str(out)])
    err = capfd.readouterr().err
    assert code == 2 and "nccl" in err.lower() and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert not out.exists()  # no worker was started


def test_device_cuda_puts_every_workers_model_on_a_gpu(gpus, tmp_path):
    """A script's `hetsync.init().device` is a GPU under gloo (4 workers sharing the GPUs),
    and Prague, the protocol that crashed, conserves the sum of the models there."""
    out = tmp_path / "run"
    out.mkdir()
    code = main(["launch", "--protocol", "prague", "--workers", "4", "--device", "cuda",
                 "--max-iterations", "150", "--out", str(out), "--quiet",
                 str(SCRIPT), str(out), "runtime", "0"])
    assert code == 0
    saved = [torch.load(out / f"device_rank{r}.pt") for r in range(4)]
    assert {torch.device(s["device"]).type for s in saved} == {"cuda"}
    assert {s["device"] for s in saved} == {f"cuda:{r % gpus}" for r in range(4)}
    initial = torch.stack([s["initial"] for s in saved])
    final = torch.stack([s["final"] for s in saved])
    assert torch.allclose(final.sum(0), initial.sum(0), atol=1e-4)
