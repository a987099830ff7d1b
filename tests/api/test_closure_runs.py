"""Two workers train pytorch/examples' float64 sequence model with LBFGS, whose step(closure)
evaluates the model several times a step: under allreduce (and ddp, slow) each evaluation is
averaged, so both end with the same parameters; under D-PSGD each step is local, between the
exchanges."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parents[1] / "launch" / "scripts" / "lbfgs_sequence.py"
ITERATIONS = 5


@pytest.mark.parametrize("protocol", [
    "allreduce",
    # CI time: a model-averaging protocol's closure step is tests/api/test_closure.py's too
    pytest.param("dpsgd", marks=pytest.mark.slow),
    pytest.param("ddp", marks=pytest.mark.slow),
])
def test_lbfgs_trains_a_float64_sequence_model_on_two_workers(protocol, tmp_path):
    result = run(RunConfig(protocol=protocol, workers=2, script=[str(SCRIPT), str(tmp_path)],
                           out=tmp_path, max_iterations=ITERATIONS, quiet=True, device="cpu"))
    saved = [torch.load(tmp_path / f"lbfgs_rank{rank}.pt") for rank in range(2)]
    for rank, worker in enumerate(saved):
        assert len(worker["returned"]) == ITERATIONS
        assert worker["after"] < 0.5 * worker["before"]  # it trained, on both shards
        assert all(p.dtype == torch.float64 and torch.isfinite(p).all()
                   for p in worker["params"])
        logged = [row["loss"] for row in read_jsonl(result.run_dir / "workers"
                                                    / f"rank{rank}.jsonl")]
        assert logged == pytest.approx(worker["returned"])  # the closure's first loss
    assert saved[0]["before"] == saved[1]["before"]  # both began from rank 0's model
    ours, theirs = saved[0]["params"], saved[1]["params"]
    if protocol != "dpsgd":  # the same averaged gradients and losses: the same steps
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    else:  # two models averaged every step, each then stepping on its own shard
        apart = sum(float((a - b).square().sum()) for a, b in zip(ours, theirs, strict=True))
        assert 0 < math.sqrt(apart) < 0.5 * math.sqrt(sum(float(a.square().sum()) for a in ours))
