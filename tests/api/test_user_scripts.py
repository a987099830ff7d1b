"""A user's script under every protocol: buffers, evaluation, final model, torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parents[1] / "launch" / "scripts" / "batchnorm.py"

SLOW = pytest.mark.slow  # the same buffer policy as a protocol that stays in the default run
PROTOCOLS = [
    ("allreduce", {}), pytest.param("ddp", {}, marks=SLOW), ("ps", {"ps_mode": "sync"}),
    pytest.param("ps", {"ps_mode": "async"}, marks=SLOW), ("dpsgd", {}),
    pytest.param("adpsgd", {}, marks=SLOW),  # its buffers travel in the model's, as D-PSGD's
    pytest.param("hop", {}, marks=SLOW), pytest.param("prague", {"group_size": 2}, marks=SLOW),
]


@pytest.mark.parametrize(("protocol", "options"), PROTOCOLS)
def test_batchnorm_statistics_move_and_stay_consistent(protocol, options, tmp_path):
    workers = 2  # as telling as 4 here, and each run starts faster
    result = run(RunConfig(protocol=protocol, workers=workers, script=[str(SCRIPT), str(tmp_path)],
                           out=tmp_path, max_iterations=40, eval_every=0.5, quiet=True,
                           device="cpu", **options))
    saved = [torch.load(tmp_path / f"bn_rank{r}.pt") for r in range(workers)]
    assert all(s["prepared_is_model"] for s in saved)  # the script's own module, ddp's too
    local = torch.stack([s["local"] for s in saved])
    consensus = saved[0]["consensus"]
    assert torch.allclose(consensus, local.mean(0), atol=1e-6)  # the average of the workers'
    assert all(torch.allclose(s["consensus"], consensus) for s in saved)  # on every rank
    assert consensus.abs().mean() > 0.05  # the forward passes moved the running mean from 0
    spread = (local - consensus).norm(dim=1).max()
    assert spread < 0.35 * consensus.norm()  # async protocols end some updates apart
    summary = result.summary
    assert summary["final_accuracy"] > 0.8  # the script's evaluate() on the consensus model
    assert summary["final_consensus_distance"] is not None
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert any(row["model"] == "consensus" for row in rows)  # evaluated during the run too


def test_a_script_under_torchrun_writes_its_run_directory(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(f'protocol = "dpsgd"\nmax_iterations = 20\nout = "{out}"\n'
                      'device = "cpu"\n')  # the script's model is on the CPU
    env = {**os.environ, "HETSYNC_CONFIG": str(config)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(SCRIPT), str(tmp_path)]
    subprocess.run(torchrun, env=env, check=True, capture_output=True, timeout=120)
    assert json.loads((out / "config.json").read_text())["workers"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == [20, 20]
    assert summary["final_accuracy"] is not None
