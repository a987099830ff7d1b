"""Every protocol trains a bf16 (and, slow, an fp16) model past the iteration where a header
carried in the model's dtype would round (review 3, item 5: Hop's tag 257 arrived as 256),
and (slow) a float64 one, sent and loaded back in float64 (the float64 LBFGS runs of
test_closure_runs.py are in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parents[1] / "launch" / "scripts" / "low_precision.py"
PROTOCOLS = {
    "allreduce": ("allreduce", {}), "ddp": ("ddp", {}), "ps-sync": ("ps", {"ps_mode": "sync"}),
    "ps-async": ("ps", {"ps_mode": "async"}), "hop": ("hop", {}),
    "hop-skip": ("hop", {"skip": True}), "dpsgd": ("dpsgd", {}), "adpsgd": ("adpsgd", {}),
    "prague": ("prague", {"group_size": 2}), "localsgd": ("localsgd", {}),
}
# In CI, protocols that carried an integer in the model's dtype (Hop's tag, the PS version,
# Prague's group ids); the rest (D-PSGD's stop too), and every fp16 run, behind slow.
IN_CI = {"hop", "ps-sync", "prague"}  # D-PSGD's behind slow too, for CI time
# past the last integer bf16 (256) or fp16 (2048) holds exactly, as a tag or a version
CASES = [
    pytest.param(*spec, dtype, iterations, id=f"{name}-{dtype}",
                 marks=() if name in IN_CI and dtype == "bfloat16" else pytest.mark.slow)
    for dtype, iterations in (("bfloat16", 300), ("float16", 2100), ("float64", 300))
    for name, spec in PROTOCOLS.items()
]


@pytest.mark.parametrize(("protocol", "options", "dtype", "iterations"), CASES)
def test_a_low_precision_model_trains_past_its_exact_integers(protocol, options, dtype,
                                                              iterations, tmp_path):
    result = run(RunConfig(protocol=protocol, workers=2, script=[str(SCRIPT), str(tmp_path),
                                                                  dtype],
                           out=tmp_path, max_iterations=iterations, quiet=True, device="cpu",
                           **options))
    assert min(result.summary["iterations"]) >= iterations - 1  # nobody stopped early
    for rank in range(2):
        saved = torch.load(tmp_path / f"lp_rank{rank}.pt")
        assert saved["dtypes"] == [f"torch.{dtype}"]  # sent and loaded back in its own dtype
        assert saved["after"] < 0.7 * saved["before"]  # it trained
