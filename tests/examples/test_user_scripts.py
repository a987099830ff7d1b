"""The example user scripts (a GRU language model, a BatchNorm MLP) learn under hetsync.

Short runs, two workers; the full comparison with DDP under every protocol is a benchmark
(experiments/user_scripts.py), not a test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.errors import LOOP_ENDED
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).parents[2] / "examples"
GRU = [str(EXAMPLES / "gru_language_model.py"), "--epochs", "1", "--hidden", "64",
       "--seq-len", "32"]
MLP = [str(EXAMPLES / "batchnorm_mlp.py"), "--epochs", "4", "--hidden", "64"]


def _run(script: list[str], protocol: str, tmp_path: Path, **options: object) -> dict:
    """Launch `script` on 2 workers; its user_result.json, checked against summary.json."""
    summary = run(RunConfig(protocol=protocol, workers=2, script=script, out=tmp_path,
                            quiet=True, device="cpu", **options)).summary
    result = json.loads((tmp_path / "user_result.json").read_text())
    assert summary["stop_reason"].startswith(LOOP_ENDED)  # the loop ran its epochs
    assert summary["final_loss"] == pytest.approx(result["val_loss"], abs=1e-3)
    return result


@pytest.mark.parametrize("protocol", [pytest.param("allreduce", marks=pytest.mark.slow),  # CI time
                                      "hop"])
def test_gru_language_model_learns(protocol, tmp_path):
    result = _run(GRU, protocol, tmp_path)
    assert result["val_loss"] < 0.75 * math.log(96)  # well below a uniform guess


@pytest.mark.parametrize(("protocol", "options"), [
    ("dpsgd", {}),
    # CI time: the PS's running statistics are tests/api/test_user_scripts.py's too
    pytest.param("ps", {"ps_mode": "sync"}, marks=pytest.mark.slow),
])
def test_batchnorm_mlp_learns_with_its_running_statistics(protocol, options, tmp_path):
    result = _run(MLP, protocol, tmp_path, **options)
    assert result["val_accuracy"] > 0.9  # evaluated in eval mode: running statistics
