"""DDP's driver in real processes: the stop vote rides in one bucket of several; the script
uses its own model (prepare returns it) while DDP averages the gradients; a forward pass that
skips the hooks fails in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import hetsync
from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_stop.py"


def test_one_workers_stop_reaches_the_other_through_a_model_of_several_buckets(tmp_path):
    run(RunConfig(protocol="ddp", workers=2, script=[str(SCRIPT), str(tmp_path)], out=tmp_path,
                  max_iterations=30, quiet=True, hang_timeout=20.0, device="cpu"))
    ranks = [json.loads((tmp_path / f"ddp_rank{r}.json").read_text()) for r in range(2)]
    assert all(rank["buckets"] >= 2 for rank in ranks)
    # Rank 1 asked after its fifth backward pass, which had voted already: its vote rides in
    # the sixth's buckets, and both stop after the sixth.
    assert [rank["iterations"] for rank in ranks] == [6, 6]


def test_prepare_returns_the_users_own_model_and_ddp_still_averages_the_gradients(
    tmp_path, monkeypatch
):
    script = SCRIPT.parent / "ddp_own_model.py"
    result = run(RunConfig(protocol="ddp", workers=2, script=[str(script), str(tmp_path)],
                           out=tmp_path, max_iterations=12, quiet=True, hang_timeout=20.0,
                           device="cpu"))
    assert result.summary["iterations"] == [12, 12]
    assert result.summary["stop_reason"] == "max_iterations"
    facts = [torch.load(tmp_path / f"facts_rank{r}.pt") for r in range(2)]
    for fact in facts:
        assert fact["same"]  # prepare(model, ...)[0] is model
        assert fact["hidden"] == (3, 16)  # its own method
        assert fact["keys"] == ["body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias",
                                "body.1.running_mean", "body.1.running_var",
                                "body.1.num_batches_tracked", "head.weight", "head.bias"]
    assert facts[0]["mid_run_loaded"]  # saved whole mid-run, loaded and evaluated there
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # own_model, the class's module
    from own_model import Net

    models = [torch.load(tmp_path / f"model_rank{r}.pt", weights_only=False) for r in range(2)]
    val = torch.randn(64, 4, generator=torch.Generator().manual_seed(7))
    for model, fact in zip(models, facts, strict=True):
        assert type(model) is Net and list(model.state_dict()) == fact["keys"]
        model.eval()
        with torch.no_grad():
            assert torch.allclose(model(val), fact["output"], atol=1e-6)  # here too
    # Different data and different initial models on the two ranks: only the broadcast and
    # the averaged gradients leave the same parameters, which moved from the initial ones.
    params = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
    assert torch.allclose(params[0], params[1], atol=1e-6)
    torch.manual_seed(0)
    initial = torch.cat([p.detach().reshape(-1) for p in Net().parameters()])
    assert (params[0] - initial).abs().max() > 0.01


def test_a_forward_pass_past_the_hooks_fails_in_one_line():
    hetsync.init(protocol="ddp", device="cpu")  # a world of one, this process
    try:
        model = nn.Linear(2, 2)
        _, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        model.forward(torch.randn(3, 2)).sum().backward()  # not model(...): DDP never hears
        with pytest.raises(RuntimeError, match=r"^ddp: iteration 1 reduced no gradients: .*"
                                               r"model\.forward\(\.\.\.\) skips"):
            optimizer.step()
        optimizer.close()
    finally:
        hetsync.shutdown()
