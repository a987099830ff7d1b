from __future__ import annotations

import json

import pytest

from hetsync.config import RunConfig
from hetsync.metrics.summary import read_jsonl, summarize


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
    assert summary["time_to_target_s"] == 2.0  # consensus rows only, not a worker's own model
    assert summary["final_loss"] == 0.35 and summary["final_accuracy"] == 0.85
    assert summary["sync_wait_fraction"] == pytest.approx(0.6 / (2 + 2 + 4), rel=1e-3)
    assert summary["stop_reason"] == "max_time"


def test_unreached_target_is_null(run_dir):
    config = RunConfig(workers=3, batch_size=10, target_loss=0.1)
    assert summarize(run_dir, config, None)["time_to_target_s"] is None


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
