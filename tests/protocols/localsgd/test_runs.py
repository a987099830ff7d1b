"""Local SGD and DiLoCo in real processes: svm learns; a script whose loop ends by itself ends
the run on a common model; uneven shards end cleanly (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.errors import LOOP_ENDED
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration
TESTS = Path(__file__).parents[2]
MLP = [str(TESTS.parent / "examples" / "batchnorm_mlp.py"), "--epochs", "1", "--hidden", "64"]
EPOCHS = TESTS / "launch" / "scripts" / "epochs.py"


@pytest.mark.parametrize("outer", ["none", pytest.param("nesterov", marks=pytest.mark.slow)])
def test_svm_learns(outer, tmp_path):
    summary = run(RunConfig(protocol="localsgd", outer_optimizer=outer, workload="svm",
                            workers=2, max_iterations=100, stop_at_target=False, quiet=True,
                            out=tmp_path / "run")).summary
    assert summary["iterations"] == [100, 100]
    assert summary["final_loss"] < 0.5  # from about 1.0
    assert summary["final_consensus_distance"] < 1e-9  # iteration 100 ended with a round


def test_a_script_whose_loop_ends_by_itself_ends_on_a_common_model(tmp_path):
    """batchnorm_mlp.py's one epoch is 23 steps: the last 7 are averaged when the loop ends."""
    summary = run(RunConfig(protocol="localsgd", workers=2, script=MLP, out=tmp_path,
                            quiet=True, device="cpu")).summary
    result = json.loads((tmp_path / "user_result.json").read_text())
    assert summary["stop_reason"].startswith(LOOP_ENDED)
    assert summary["iterations"][0] % 8 != 0  # the loop ended mid-round
    assert summary["final_consensus_distance"] < 1e-9
    assert result["val_accuracy"] > 0.8


@pytest.mark.slow
@pytest.mark.parametrize("outer", ["none", "nesterov"])
def test_uneven_shards_end_together_and_conserve_the_sum(outer, tmp_path):
    """Rank r has 4 + r batches an epoch, 2 epochs (8, 10, 12 steps): rank 0's loop ends right
    after round 1, the others' mid-round 2; all meet in round 2. lr 0 from different models:
    the sum of the models is conserved, and all end on their mean."""
    script = [str(EPOCHS), str(tmp_path), "2", "4", "uneven"]
    summary = run(RunConfig(protocol="localsgd", outer_optimizer=outer, workers=3,
                            script=script, out=tmp_path / "run", hang_timeout=10.0,
                            quiet=True, device="cpu")).summary
    saved = [torch.load(tmp_path / f"final_rank{r}.pt") for r in range(3)]
    assert [s["iteration"] for s in saved] == [8, 10, 12]
    assert summary["stop_reason"].startswith(LOOP_ENDED)
    finals = torch.stack([s["final"] for s in saved])
    initial = torch.stack([s["initial"] for s in saved]).sum(0)
    assert torch.allclose(finals.sum(0), initial, atol=1e-5)
    if outer == "none":
        assert torch.allclose(finals, finals.mean(0).expand_as(finals), atol=1e-6)
