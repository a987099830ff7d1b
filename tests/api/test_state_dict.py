"""SyncOptimizer.state_dict(): what a script saves to resume, in a world of one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import hetsync
from hetsync.api import SyncOptimizer
from hetsync.transport.contiguous import span
from hetsync.transport.flat import model_tensors


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    hetsync.init(protocol="allreduce", device="cpu")  # the models here are on the CPU
    yield
    hetsync.shutdown()


def _setup(protocol: str) -> tuple[nn.Module, SyncOptimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, SyncOptimizer(inner, model, protocol)


def _steps(model: nn.Module, opt: SyncOptimizer, first: int, count: int) -> None:
    for i in range(first, first + count):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("protocol", ["allreduce", "ps"])
def test_a_saved_run_goes_on_as_the_original(protocol, tmp_path):
    model, opt = _setup(protocol)
    _steps(model, opt, 0, 3)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert saved["opt"]["hetsync"]["iteration"] == 3
    assert ("server" in saved["opt"]["hetsync"]["protocol"]) == (protocol == "ps")
    _steps(model, opt, 3, 2)
    opt.close()

    resumed_model, resumed = _setup(protocol)
    resumed_model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["opt"])
    assert resumed.iteration == 3
    assert resumed.runtime.elapsed() >= saved["opt"]["hetsync"]["elapsed"]
    _steps(resumed_model, resumed, 3, 2)
    assert resumed.iteration == 5
    for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.allclose(a, b)
    with pytest.raises(RuntimeError, match="before the first step"):
        resumed.load_state_dict(saved["opt"])
    resumed.close()


@pytest.mark.parametrize(("protocol", "options"),
                         [("prague", {"schedule": "static"}), ("dpsgd", {})])
def test_a_resumed_run_stops_at_max_iterations(protocol, options, monkeypatch):
    """Their stop logic foresees K on the protocol's own steps, which count from 1 again after
    a resume: K = 12 resumed at 5 stopped at 13 here, and K = 100 resumed at 40 at 105
    (D-PSGD, 4 hops) and 140 (static Prague, 8 workers)."""
    runtime = hetsync.transport.runtime.current_runtime()
    monkeypatch.setattr(runtime, "config", dataclasses.replace(
        runtime.config, protocol=protocol, max_iterations=12, **options))
    model, opt = _setup(protocol)
    saved = opt.state_dict()
    saved["hetsync"]["iteration"] = 5
    opt.load_state_dict(saved)
    while not opt.should_stop:
        _steps(model, opt, opt.iteration, 1)
    assert opt.iteration == 12
    opt.close()


@pytest.mark.parametrize("contiguous", [True, False])
def test_the_model_is_laid_out_in_one_buffer_unless_told_not_to(contiguous, tmp_path):
    """Laid out, the same Parameter objects train, and a saved state dict holds each value
    once (one storage for its 9 views, not one each: 9x the bytes)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1000), nn.BatchNorm1d(1000), nn.Linear(1000, 2))
    params = list(model.parameters())
    before = [t.clone() for t in model_tensors(model)]
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = SyncOptimizer(inner, model, "allreduce", contiguous=contiguous)
    assert (span(model_tensors(model)) is not None) == contiguous
    assert list(model.parameters()) == params
    assert all(torch.equal(a, b) for a, b in zip(model_tensors(model), before, strict=True))
    _steps(model, opt, 0, 2)
    assert all(not torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=False))
    assert (span(model_tensors(model)) is not None) == contiguous
    torch.save(model.state_dict(), tmp_path / "model.pt")
    values = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert (tmp_path / "model.pt").stat().st_size < values + 4096
    opt.close()
