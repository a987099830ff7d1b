"""Every JSON file hetsync writes is strict JSON: NaN and infinities are written as null."""

from __future__ import annotations

import json
import math

import pytest

from hetsync.config import RunConfig
from hetsync.metrics import strict_json
from hetsync.metrics.summary import read_jsonl, summarize, time_to_target, write_summary
from hetsync.metrics.worker_log import IterationLog


def strict_loads(text: str) -> object:
    """json.loads refusing NaN, Infinity and -Infinity, as jq or a browser would."""
    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_null_at_any_depth():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5, 2], "c": {"d": (math.nan, "x")},
             "e": None, "f": True}
    text = strict_json.dumps(value)
    assert strict_loads(text) == {"a": None, "b": [None, None, 1.5, 2], "c": {"d": [None, "x"]},
                                  "e": None, "f": True}


def test_dumps_passes_formatting_options_through():
    assert strict_json.dumps({"a": 1}, indent=2) == json.dumps({"a": 1}, indent=2)


def test_summary_and_worker_log_of_a_diverged_run_are_strict(tmp_path):
    log = IterationLog(tmp_path, rank=0, flush_every=3600)
    for i, loss in enumerate([0.7, 1e30, math.inf, math.nan], start=1):
        log.append({"t": 0.1 * i, "iteration": i, "loss": loss, "sync_wait_s": 0.0})
    log.close()
    lines = (tmp_path / "workers" / "rank0.jsonl").read_text().splitlines()
    assert [strict_loads(line)["loss"] for line in lines] == [0.7, 1e30, None, None]
    config = RunConfig(workers=1, workload="digits", batch_size=8, target_loss=0.5)
    summary = summarize(tmp_path, config, "diverged at iteration 3")
    write_summary(tmp_path, {**summary, "final_loss": math.nan})
    written = strict_loads((tmp_path / "summary.json").read_text())
    assert written["final_loss"] is None and written["stop_reason"] == "diverged at iteration 3"


@pytest.mark.parametrize("bad", [math.nan, None])
def test_a_nan_consensus_loss_never_reaches_the_target(bad):
    """A diverged model's NaN loss (null once written) is not 'at or below the target': the
    run claimed `target loss 0.13 in nan s`."""
    evals = [{"t": 1.0, "model": "consensus", "loss": 0.9},
             {"t": 2.0, "model": "consensus", "loss": bad},
             {"t": 3.0, "model": "final", "loss": bad}]
    assert time_to_target(evals, 0.5) is None


def test_read_back_rows_hold_none_for_what_was_nan(tmp_path):
    (tmp_path / "eval.jsonl").write_text(strict_json.dumps({"t": 1.0, "loss": math.nan}) + "\n")
    assert read_jsonl(tmp_path / "eval.jsonl") == [{"t": 1.0, "loss": None}]
