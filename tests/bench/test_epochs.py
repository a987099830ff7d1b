"""The `epochs` suite: its plan, and the reduction of its runs to wall time against the ideal.

The summaries are written as the launcher writes them (the keys the reduction reads); the
suite's own measurement is docs/bench/epochs/."""

from __future__ import annotations

import json
import os

import pytest

from hetsync.bench.epochs import epoch_table, goal_lines, ideal_seconds
from hetsync.bench.markdown import write_markdown
from hetsync.bench.results import collect
from hetsync.bench.runner import BenchOptions, _sampler_of, plan
from hetsync.bench.suites import (
    EPOCHS,
    EPOCHS_LM,
    EPOCHS_N,
    HEAVIER_REAL,
    LM_EPOCHS_N,
    LM_SCRIPT,
    REAL_EPOCHS_N,
)
from hetsync.data.dealing import ENV_SAMPLER

#: digits: 1497 training samples, whole batches of 16 an epoch.
SAMPLES = EPOCHS_N * (1497 // 16 * 16)
REAL_SAMPLES = REAL_EPOCHS_N * (1497 // 16 * 16)


def test_every_run_trains_the_epochs_and_each_protocol_has_both_samplers(tmp_path):
    options = BenchOptions(suite="epochs", workload="digits")
    suite = options.chosen_suite()
    runs = plan(suite, options, tmp_path)
    assert not any(r.not_applicable for r in runs)
    assert {(r.config.epochs, r.config.workload, r.config.stop_at_target) for r in runs} == {
        (EPOCHS_N, "digits", False), (REAL_EPOCHS_N, "digits", False)}
    for setting in (s for s in suite.settings if not s.reference):
        mine = [r for r in runs if r.setting == setting]
        samplers: dict[str, set[str]] = {}
        for run in mine:
            samplers.setdefault(run.config.protocol, set()).add(run.config.sampler)
        assert all(s == {"static", "dynamic"} for s in samplers.values())
        emulated = setting.step_time == 50.0
        assert {(r.config.pin, r.config.workers) for r in mine} == {
            (not emulated, 4 if emulated else 2)}


def test_the_heavier_workload_runs_the_real_settings_only(tmp_path):
    options = BenchOptions(suite="epochs", workload=HEAVIER_REAL)
    runs = plan(options.chosen_suite(), options, tmp_path)
    assert {(r.config.workload, r.config.epochs, r.config.pin, r.config.step_time)
            for r in runs} == {(HEAVIER_REAL, 1, True, 0.0)}
    assert {r.config.workers for r in runs} == {1, 2}


def test_the_ideal_of_one_of_4_workers_4x_slow_is_the_issues():
    settings = {s.name: s for s in EPOCHS.settings}
    slow, _ = ideal_seconds(settings["rank 3 4x slow"], 4, EPOCHS_N, {})
    homogeneous, _ = ideal_seconds(settings["homogeneous"], 4, EPOCHS_N, {})
    assert slow == pytest.approx(SAMPLES / (3 * 320 + 80), abs=1e-3)  # 320 samples/s a worker
    # All-Reduce at the straggler's pace, 4 workers x a quarter of the rate: the issue's 3.25x
    assert SAMPLES / (4 * 80) / slow == pytest.approx(3.25, abs=1e-3)
    assert homogeneous == pytest.approx(SAMPLES / (4 * 320), abs=1e-3)
    real, where = ideal_seconds(settings["rank 1 at share 0.25 · real"], 2, REAL_EPOCHS_N,
                                {"solo": 1000.0, "share": 250.0})
    assert (real, where) == (pytest.approx(REAL_SAMPLES / 1250, abs=1e-3),
                             "the solo runs' samples/s")


def _summary(wall: float, iterations: list[int], loss: float = 0.2) -> dict:
    return {"wall_time_s": wall, "iterations": iterations, "batch_size": 16,
            "samples_per_s": 16 * sum(iterations) / wall, "final_loss": loss,
            "final_accuracy": 0.95, "time_to_target_s": None, "target_loss": 0.3,
            "stop_reason": f"loop ended after iteration {max(iterations)}"}


@pytest.fixture
def results(tmp_path):
    options = BenchOptions(suite="epochs", workload="digits", repeats=2,
                           variants="allreduce static,adpsgd static,adpsgd dynamic")
    suite = options.chosen_suite()
    runs = plan(suite, options, tmp_path)
    walls = {("homogeneous", "allreduce static"): 6.0, ("homogeneous", "adpsgd static"): 5.9,
             ("homogeneous", "adpsgd dynamic"): 6.0, ("rank 3 4x slow", "allreduce static"): 24.0,
             ("rank 3 4x slow", "adpsgd static"): 23.5, ("rank 3 4x slow", "adpsgd dynamic"): 7.5,
             ("solo · real", "solo"): 10.0, ("solo at share 0.25 · real", "solo"): 40.0,
             ("homogeneous · real", "allreduce static"): 6.0,
             ("homogeneous · real", "adpsgd static"): 6.0,
             ("homogeneous · real", "adpsgd dynamic"): 6.0,
             ("rank 1 at share 0.25 · real", "allreduce static"): 20.0,
             ("rank 1 at share 0.25 · real", "adpsgd static"): 20.0,
             ("rank 1 at share 0.25 · real", "adpsgd dynamic"): 8.5}
    for run in runs:
        wall = walls[run.setting.name, run.variant.label] + 0.1 * run.repeat
        workers = run.config.workers
        dynamic = run.config.sampler == "dynamic"
        iterations = ([110] * 3 + [35] if dynamic and workers == 4 else
                      [370, 95] if dynamic else [SAMPLES // 16 // workers] * workers)
        (run.run_dir / "workers").mkdir(parents=True)
        (run.run_dir / "summary.json").write_text(json.dumps(
            _summary(wall, iterations, 0.2 + 0.01 * run.repeat)))
        for rank, count in enumerate(iterations):
            (run.run_dir / "workers" / f"rank{rank}.jsonl").write_text("".join(
                json.dumps({"t": wall * (i + 1) / count, "iteration": i + 1}) + "\n"
                for i in range(count)))
    return collect(suite, options, runs, tmp_path), runs


def test_rows_are_set_against_the_ideal_the_baseline_and_their_own_static(results):
    figures, _ = results
    by_setting = {s["name"]: {r["label"]: r for r in s["results"]} for s in figures["settings"]}
    slow = by_setting["rank 3 4x slow"]["adpsgd dynamic"]
    assert slow["wall_time_s"] == pytest.approx(7.55)  # the median of 7.5 and 7.6
    assert slow["wall_time_range_s"] == [7.5, 7.6]
    assert slow["speedup_vs_baseline"] == pytest.approx(24.05 / 7.55, abs=1e-3)
    assert slow["epoch_ideal_fraction"] == pytest.approx(SAMPLES / 1040 / 7.55, abs=1e-3)
    assert slow["time_vs_static"] == pytest.approx(7.55 / 23.55, abs=1e-3)
    assert slow["samples_per_worker"] == [1760] * 3 + [560]
    assert by_setting["rank 3 4x slow"]["adpsgd static"]["time_vs_static"] is None
    real = by_setting["rank 1 at share 0.25 · real"]["adpsgd dynamic"]
    solo, share = SAMPLES / 10.05, SAMPLES / 40.05  # the solo runs' own samples/s
    assert real["ideal_s"] == pytest.approx(REAL_SAMPLES / (solo + share), abs=1e-3)
    table = epoch_table(next(s for s in figures["settings"] if s["name"] == "rank 3 4x slow"))
    assert "| adpsgd dynamic | 7.55 (7.50-7.60) |" in table


def test_the_goals_are_reported_met_or_not_with_their_figures(results, tmp_path):
    figures, runs = results
    lines = goal_lines(figures)
    slow = next(line for line in lines if line.startswith("- **rank 3 4x slow**"))
    assert "adpsgd dynamic: met: 3.19x sooner than allreduce static" in slow
    assert "94.8% of the ideal" in slow and "final held-out loss 0.205 against 0.205" in slow
    homogeneous = next(line for line in lines if line.startswith("- **homogeneous**"))
    assert "met: the dynamic sampler costs at most +1.7 %" in homogeneous  # 6.05 s over 5.95
    report = write_markdown(figures, runs, tmp_path, "hetsync bench --suite epochs").read_text()
    assert "## Goals" in report and "## rank 1 at share 0.25 · real" in report
    assert "Ideal from the emulated step times." in report
    assert "![rank 3 4x slow: samples dealt per worker](plots/dealt_rank_3_4x_slow.png)" in report
    assert (tmp_path / "plots" / "dealt_rank_3_4x_slow.png").stat().st_size > 0


def test_the_language_models_runs_launch_the_script_with_the_epochs_and_its_sampler(tmp_path):
    runs = plan(EPOCHS_LM, BenchOptions(suite="epochs-lm"), tmp_path)
    assert not any(r.not_applicable for r in runs)
    for run in runs:
        script, *args = run.config.script
        assert script.endswith("examples/strangers/lstm_language_model/with_hetsync.py")
        assert args == [*LM_SCRIPT[1:], "--epochs", str(LM_EPOCHS_N), "--seed", "0", "--out",
                        str(run.run_dir / "script")]
        assert (run.config.epochs, run.config.workers, run.config.step_time) == (None, 4, 50.0)
        with _sampler_of(run):
            assert os.environ[ENV_SAMPLER] == run.variant.options["sampler"]
        assert ENV_SAMPLER not in os.environ
    assert {r.variant.label for r in runs} == {f"{p} {s}" for p in ("allreduce", "adpsgd",
                                                                      "hop-skip", "prague")
                                               for s in ("static", "dynamic")}


def test_a_scripts_rows_count_batches_and_its_workers_test_losses(tmp_path):
    """The ideal of the language model's epochs: the batches its dynamic rows were dealt (a
    lock-step protocol's equal shares pad them) at the step times' rates; the final loss the
    mean of the workers' own."""
    options = BenchOptions(suite="epochs-lm", variants="allreduce static,allreduce dynamic,"
                           "adpsgd dynamic")
    suite = options.chosen_suite()
    runs = plan(suite, options, tmp_path)
    for run in runs:
        dynamic = run.variant.label == "adpsgd dynamic"
        iterations = [150, 150, 150, 21] if dynamic else [120] * 4
        (run.run_dir / "workers").mkdir(parents=True)
        (run.run_dir / "summary.json").write_text(json.dumps(
            {**_summary(8.0 if dynamic else 30.0, iterations), "batch_size": None,
             "samples_per_s": None, "final_loss": None, "final_accuracy": None}))
        for rank, count in enumerate(iterations):
            (run.run_dir / "workers" / f"rank{rank}.jsonl").write_text(
                json.dumps({"t": 1.0, "iteration": count}) + "\n")
            (run.run_dir / "script" / f"rank{rank}").mkdir(parents=True)
            (run.run_dir / "script" / f"rank{rank}" / "result.json").write_text(
                json.dumps({"metric": "test_loss", "value": 3.0 + 0.1 * rank}))
    figures = collect(suite, options, runs, tmp_path)
    slow = next(s for s in figures["settings"] if s["name"] == "rank 3 4x slow")
    rows = {r["label"]: r for r in slow["results"]}
    assert slow["ideal_s"] == pytest.approx(471 / (3 * 20 + 5), abs=1e-3)  # not 480
    assert rows["adpsgd dynamic"]["final_loss"] == pytest.approx(3.15)
    assert rows["adpsgd dynamic"]["samples_per_worker"] == [150, 150, 150, 21]
    assert rows["adpsgd dynamic"]["speedup_vs_baseline"] == pytest.approx(30.0 / 8.0)
    table = epoch_table(slow)
    assert "| batches per worker |" in table and "| adpsgd dynamic | 8.00 |" in table
    report = write_markdown(figures, runs, tmp_path, "hetsync bench --suite epochs-lm")
    assert "the script `examples/strangers/lstm_language_model" in report.read_text()
