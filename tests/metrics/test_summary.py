from __future__ import annotations

import json

import pytest

from hetsync.config import RunConfig
from hetsync.metrics.summary import read_jsonl, summarize, time_to_target


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def run_dir(tmp_path):
    for rank, speed in enumerate([1.0, 1.0, 0.5]):
        rows = [
            {"t": i / (10 * speed), "iteration": i, "loss": 1.0 / i, "compute_s": 0.05,
             "injected_delay_s": 0.0, "sync_wait_s": 0.01, "bytes_sent": 100}
            for i in range(1, 21)
        ]
        _write(tmp_path / "workers" / f"rank{rank}.jsonl", rows)
    _write(tmp_path / "eval.jsonl", [
        {"t": 1.0, "model": "consensus", "loss": 0.9, "accuracy": 0.5, "iterations": [1, 1, 1]},
        {"t": 2.0, "model": "consensus", "loss": 0.4, "accuracy": 0.8, "iterations": [1, 1, 1]},
        {"t": 2.0, "model": "rank0", "loss": 0.3, "accuracy": 0.9, "iterations": [1, 1, 1]},
        {"t": 4.0, "model": "final", "loss": 0.35, "accuracy": 0.85, "iterations": [1, 1, 1]},
    ])
    return tmp_path


def test_summary_figures(run_dir):
    config = RunConfig(workers=3, batch_size=10, target_loss=0.5, workload="digits")
    summary = summarize(run_dir, config, "max_time")
    assert summary["iterations"] == [20, 20, 20]
    assert summary["wall_time_s"] == pytest.approx(4.0)
    assert summary["samples_per_s"] == pytest.approx(60 * 10 / 4.0)
    # consensus rows only, not a worker's own model; 0.9 at 1 s, 0.4 at 2 s: 0.5 at 1.8 s
    assert summary["time_to_target_s"] == pytest.approx(1.8)
    assert summary["time_to_target_bracket_s"] == [1.0, 2.0]
    assert summary["final_loss"] == 0.35 and summary["final_accuracy"] == 0.85
    assert summary["sync_wait_fraction"] == pytest.approx(0.6 / (2 + 2 + 4), rel=1e-3)
    assert summary["stop_reason"] == "max_time"


def test_unreached_target_is_null(run_dir):
    config = RunConfig(workers=3, batch_size=10, target_loss=0.1)
    summary = summarize(run_dir, config, None)
    assert summary["time_to_target_s"] is None and summary["time_to_target_bracket_s"] is None


def _consensus(*points):
    return [{"t": t, "model": "consensus", "loss": loss} for t, loss in points]


def test_time_to_target_uses_time_order_not_file_order():
    # a bisection appends its look-back rows after the evaluation that crossed
    rows = _consensus((0.0, 2.0), (2.0, 1.0), (4.0, 0.4), (3.0, 0.8), (3.5, 0.6))
    assert time_to_target(rows, 0.5) == (3.75, 3.5, 4.0)


def test_time_to_target_is_the_first_crossing():
    rows = _consensus((1.0, 0.9), (2.0, 0.5), (3.0, 0.7), (4.0, 0.3))
    assert time_to_target(rows, 0.5) == (2.0, 1.0, 2.0)  # at the target counts as reached


def test_time_to_target_met_by_the_first_evaluation():
    assert time_to_target(_consensus((0.4, 0.2), (1.0, 0.1)), 0.5) == (0.4, 0.0, 0.4)


def test_time_to_target_without_target_or_crossing():
    rows = _consensus((1.0, 0.9), (2.0, 0.6))
    assert time_to_target(rows, None) is None
    assert time_to_target(rows, 0.5) is None


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
