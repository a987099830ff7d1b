"""Scripts in the shapes strangers write (examples/strangers/), adapted in five lines, train
under hetsync's launcher and end cleanly: exit 0, a summary, no traceback, a sane metric.

Each protocol family runs once in CI, two workers, each script in its short form (`--small`);
every other (script, protocol) pair is marked slow. The comparison with DDP under every
protocol, with repeats, is a benchmark (experiments/strangers_scripts.py), not a test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.launcher import run
from hetsync.protocols.catalog import all_variants

pytestmark = pytest.mark.integration
STRANGERS = Path(__file__).parents[2] / "examples" / "strangers"
VARIANTS = {variant.label: variant for variant in all_variants()}

#: Each script's metric bound in its short form: past what an untrained model scores (a
#: uniform guess over the ~90 characters is 4.5 nats, and the LSTM's short form is 11
#: iterations a worker: 3.6 to 3.9 under hop; the sines' variance is 0.5; the digits are 10
#: classes; breast cancer's majority class is 63 % of the held-out rows).
SANE = {
    "lstm_language_model": lambda loss: loss < 0.9 * math.log(90),
    "digits_cnn": lambda accuracy: accuracy > 0.8,
    "sine_lbfgs": lambda mse: mse < 0.2,
    "bare_loop": lambda accuracy: accuracy > 0.85,
}
#: Which script runs which variant in CI: every protocol family once, about ten short runs.
CI = {
    "lstm_language_model": ("hop", "ddp"),
    "digits_cnn": ("dpsgd", "prague", "ps-sync"),
    "sine_lbfgs": ("allreduce",),
    "bare_loop": ("ps-async", "adpsgd", "prague-paper", "localsgd"),
}
EVERY = sorted({label for labels in CI.values() for label in labels})
#: What hetsync refuses in one line before training: the parameter server's update is not the
#: worker's optimizer step, so LBFGS's closure would have no part in it.
REFUSED = {("sine_lbfgs", "ps-sync"), ("sine_lbfgs", "ps-async")}


def _cases() -> list[object]:
    cases = []
    for script in SANE:
        for label in EVERY:
            if (script, label) in REFUSED:
                continue
            marks = () if label in CI[script] else (pytest.mark.slow,)
            cases.append(pytest.param(script, label, marks=marks, id=f"{script}-{label}"))
    return cases


def run_stranger(script: str, label: str, tmp_path: Path, workers: int = 2) -> dict:
    """Launch examples/strangers/SCRIPT/with_hetsync.py --small under variant `label`; rank
    0's result.json, after the checks every run must pass."""
    out = tmp_path / "script"
    command = [str(STRANGERS / script / "with_hetsync.py"), "--small", "--out", str(out)]
    options = dict(VARIANTS[label].run_options)
    summary = run(RunConfig(workers=workers, script=command, out=tmp_path / "run", quiet=True,
                            device="cpu", **options)).summary
    assert summary["stop_reason"], summary
    for log in sorted((tmp_path / "run" / "logs").glob("rank*.out")):
        assert "Traceback" not in log.read_text(), f"{log.name}:\n{log.read_text()}"
    results = [json.loads((out / f"rank{r}" / "result.json").read_text())
               for r in range(workers)]
    assert all(r["metric"] == results[0]["metric"] for r in results)
    return results[0]


@pytest.mark.parametrize(("script", "label"), _cases())
def test_a_strangers_script_trains_and_ends_cleanly(script, label, tmp_path):
    result = run_stranger(script, label, tmp_path)
    assert SANE[script](result["value"]), result


@pytest.mark.slow  # CI time: a refusal, not a run
@pytest.mark.parametrize(("script", "label"), sorted(REFUSED))
def test_a_closure_under_the_parameter_server_is_refused_in_one_line(script, label, tmp_path):
    with pytest.raises(WorkerFailed, match=r"ps cannot run LBFGS\.step\(closure\)"):
        run_stranger(script, label, tmp_path)
