"""All-Reduce's driver in real processes: the gradients it leaves are the workers' mean, kept
in its reduction buffer from step to step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "allreduce_gradients.py"


def test_the_gradients_are_the_mean_and_stay_in_the_reduction_buffer(tmp_path):
    run(RunConfig(protocol="allreduce", workers=2, script=[str(SCRIPT), str(tmp_path)],
                  out=tmp_path, max_iterations=6, quiet=True, hang_timeout=20.0, device="cpu"))
    ranks = [torch.load(tmp_path / f"grads_rank{r}.pt") for r in range(2)]
    assert [len(steps) for steps in ranks] == [6, 6]
    for i, steps in enumerate(zip(*ranks, strict=True)):
        for p, (mine, theirs) in enumerate(zip(steps[0]["local"], steps[1]["local"],
                                               strict=True)):
            mine = torch.zeros_like(theirs) if mine is None else mine
            theirs = torch.zeros_like(mine) if theirs is None else theirs  # rank 1's unused layer
            for step in steps:
                assert torch.allclose(step["reduced"][p], (mine + theirs) / 2, atol=1e-6), (i, p)
        assert all(torch.equal(a, b) for a, b in zip(steps[0]["reduced"], steps[1]["reduced"],
                                                      strict=True))
        for step in steps:
            assert step["one_buffer"]  # the mean is the buffer's, not copied back
            if i == 2:  # zero_grad(set_to_none=False): zeroed where they are
                assert step["kept"]
                assert all(not g.any() for g in step["cleared"])
            else:  # zero_grad(): None, as torch's; gathered by a copy at the next step
                assert all(g is None for g in step["cleared"])
    unused = ranks[1][0]["local"][-1]
    assert unused is None  # the layer rank 1 never used had no gradient of its own there
