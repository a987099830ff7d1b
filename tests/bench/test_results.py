"""Medians over repeats, ratios to the baselines, and bounds where a target was not reached.

The summaries are written as the launcher writes them (the same keys), so these tests check
the reduction alone; test_command.py checks it on real runs."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from hetsync.bench.markdown import (
    format_speedup,
    headline_lines,
    real_table,
    setting_table,
    workloads_line,
)
from hetsync.bench.results import collect, speedup
from hetsync.bench.runner import FAILED_FILE, BenchOptions, in_rounds, plan
from hetsync.bench.suites import Setting, Suite, Variant

SUITE = Suite(
    "test", "two settings",
    (Setting("homogeneous"), Setting("slow", "deterministic:ranks=1,factor=5")),
    (Variant.of("allreduce", protocol="allreduce"), Variant.of("ddp", protocol="ddp"),
     Variant.of("adpsgd", protocol="adpsgd")),
)


def summary(ttt: float | None, samples: float, wall: float = 60.0) -> dict:
    return {"time_to_target_s": ttt, "samples_per_s": samples, "wall_time_s": wall,
            "ideal_samples_per_s": 5000.0, "ideal_fraction": samples / 5000.0,
            "final_accuracy": 0.8, "final_loss": 0.45, "sync_wait_fraction": 0.1,
            "target_loss": 0.5}


def write(runs, figures: dict[tuple[str, str], list[dict | None]]) -> None:
    """figures[(setting, label)]: a summary per repeat (None: the repeat failed)."""
    for run in runs:
        value = figures[(run.setting.name, run.variant.label)][run.repeat]
        run.run_dir.mkdir(parents=True)
        if value is None:
            (run.run_dir / FAILED_FILE).write_text("worker 1 failed: boom\n")
        else:
            (run.run_dir / "summary.json").write_text(json.dumps(value))


@pytest.fixture
def results(tmp_path):
    options = BenchOptions(suite="test", workers=4, repeats=3)
    runs = plan(SUITE, options, tmp_path)
    write(runs, {
        ("homogeneous", "allreduce"): [summary(30, 3000), summary(40, 2800), summary(20, 3100)],
        ("homogeneous", "ddp"): [summary(32, 2900), summary(None, 2000), summary(34, 2950)],
        ("homogeneous", "adpsgd"): [summary(15, 4800), summary(None, 4700), None],
        ("slow", "allreduce"): [summary(None, 900, 60), summary(None, 910, 61), summary(80, 950)],
        ("slow", "ddp"): [summary(None, 880, 60)] * 3,
        ("slow", "adpsgd"): [summary(16, 4600), summary(18, 4500), summary(17, 4550)],
    })
    return collect(SUITE, options, runs, tmp_path)


def rows(results, setting):
    return {row["label"]: row for s in results["settings"] if s["name"] == setting
            for row in s["results"]}


def test_medians_count_unreached_repeats_as_slowest(results):
    homogeneous = rows(results, "homogeneous")
    assert homogeneous["allreduce"]["time_to_target_s"] == 30
    assert homogeneous["allreduce"]["samples_per_s"] == 3000
    assert homogeneous["ddp"]["time_to_target_s"] == 34  # median of 32, 34 and not reached
    assert homogeneous["ddp"]["reached_target"] == 2


def test_failed_repeats_are_left_out_and_counted(results):
    adpsgd = rows(results, "homogeneous")["adpsgd"]
    assert (adpsgd["repeats_done"], adpsgd["repeats_failed"]) == (2, 1)
    assert adpsgd["errors"] == ["worker 1 failed: boom"]
    assert adpsgd["time_to_target_s"] is None  # median of 15 and not reached
    assert adpsgd["time_to_target_above_s"] == 60.0


def test_ratios_to_both_baselines(results):
    homogeneous = rows(results, "homogeneous")
    assert homogeneous["ddp"]["speedup_vs_allreduce"] == {"value": round(30 / 34, 3),
                                                          "kind": "exact"}
    assert homogeneous["allreduce"]["speedup_vs_ddp"] == {"value": round(34 / 30, 3),
                                                          "kind": "exact"}
    assert homogeneous["adpsgd"]["throughput_vs_allreduce"] == round(4750 / 3000, 3)
    assert homogeneous["adpsgd"]["speedup_vs_allreduce"] == {"value": 0.5, "kind": "at most"}


def test_a_baseline_that_never_reached_gives_a_lower_bound(results):
    slow = rows(results, "slow")
    assert slow["allreduce"]["time_to_target_s"] is None  # 2 of 3 repeats did not reach it
    assert slow["allreduce"]["time_to_target_above_s"] == 60
    assert slow["adpsgd"]["speedup_vs_allreduce"] == {"value": round(60 / 17, 3),
                                                      "kind": "at least"}
    assert slow["ddp"]["speedup_vs_allreduce"] is None  # neither reached it
    assert format_speedup(slow["adpsgd"]["speedup_vs_allreduce"]) == "≥ 3.53x"


def test_headline_names_the_first_to_target(results):
    winners = {h["setting"]: h for h in results["headline"]}
    assert winners["homogeneous"]["winner"] == "allreduce"
    assert winners["slow"]["winner"] == "adpsgd"
    lines = headline_lines(results)
    assert lines[1] == ("- **slow**: adpsgd reaches the target first, in 17.0 s "
                        "(≥ 3.53x allreduce, ≥ 3.53x ddp).")


def test_table_marks_unreached_and_repeat_counts(results):
    table = setting_table(results["settings"][1])
    assert "| allreduce | not reached (> 60) (1/3 reached) |" in table
    assert "| adpsgd | 17.0 (3/3 reached) | ≥ 3.53x | ≥ 3.53x | 4550 | 5.00x |" in table


@pytest.mark.parametrize(("base", "row", "expected"), [
    ((None, 60.0), (None, 60.0), None),
    ((30.0, None), (15.0, None), {"value": 2.0, "kind": "exact"}),
])
def test_speedup_cases(base, row, expected):
    def as_row(pair):
        return {"time_to_target_s": pair[0], "time_to_target_above_s": pair[1]}
    assert speedup(as_row(base), as_row(row)) == expected


SOLO = (Variant.of("solo", protocol="allreduce"),)
REAL = Suite(
    "real-test", "real compute against one worker alone",
    (Setting("solo", workers=1, variants=SOLO, step_time=0.0, reference=True),
     Setting("solo at share", "cpu:ranks=0,share=0.25", workers=1, variants=SOLO,
             step_time=0.0, reference=True),
     Setting("alone at once", workers=4, variants=(Variant.of("alone", protocol="allreduce"),),
             step_time=0.0, reference=True, side_by_side=True),
     Setting("homogeneous", step_time=0.0),
     Setting("slow", "cpu:ranks=1,share=0.25", step_time=0.0)),
    (Variant.of("allreduce", protocol="allreduce"), Variant.of("adpsgd", protocol="adpsgd")),
    real=True, run_options=MappingProxyType({"pin": True}),
)


def test_a_real_suite_takes_its_ideal_and_compute_inflation_from_one_worker_alone(tmp_path):
    options = BenchOptions(suite="real-test", workers=4)
    runs = plan(REAL, options, tmp_path)
    assert all(run.config.step_time == 0 and run.config.pin for run in runs)

    def real(samples: float, compute_ms: float) -> dict:
        return {**summary(None, samples), "ideal_samples_per_s": None, "ideal_fraction": None,
                "compute_ms_median": compute_ms, "iterations": [10, 10, 9, 11]}

    write(runs, {("solo", "solo"): [real(600, 52)], ("solo at share", "solo"): [real(150, 210)],
                 ("alone at once", "alone"): [real(2000, 62)],  # 500 each: the machine's own
                 ("homogeneous", "allreduce"): [real(1560, 65)],
                 ("homogeneous", "adpsgd"): [real(2232, 51)],
                 ("slow", "allreduce"): [real(500, 60)], ("slow", "adpsgd"): [real(1600, 55)]})
    results = collect(REAL, options, runs, tmp_path)
    homogeneous, slow = rows(results, "homogeneous"), rows(results, "slow")
    assert homogeneous["adpsgd"]["ideal_samples_per_s"] == 2400  # 4 x 600
    assert homogeneous["adpsgd"]["ideal_fraction"] == 0.93
    assert homogeneous["allreduce"]["compute_inflation"] == 1.25  # 65 / 52
    assert slow["adpsgd"]["ideal_samples_per_s"] == 1950  # 3 x 600 + 150
    # Against the 4 alone at once: 4 x 500, and 3 x 500 + the straggler's own 150
    assert homogeneous["adpsgd"]["alone_at_once_samples_per_s"] == 2000
    assert homogeneous["allreduce"]["alone_at_once_fraction"] == 0.78
    assert homogeneous["allreduce"]["alone_at_once_inflation"] == 1.048  # 65 / 62
    assert slow["adpsgd"]["alone_at_once_samples_per_s"] == 1650
    assert [h["setting"] for h in results["headline"]] == ["homogeneous", "slow"]
    table = real_table(results["settings"][3])
    assert ("| adpsgd | not reached (> 60) | 2232 | 93.0% | 111.6% | 51 | 0.98x | 0.82x | "
            "9 / 10 / 11 |") in table


def test_the_header_names_every_workload_with_its_target():
    settings = [{"workload": "resnet"}, {"workload": "mlp-wide"}, {"workload": "resnet"}]
    line = workloads_line({"settings": settings}, {"resnet": 0.6, "mlp-wide": 0.7})
    assert line == "Workloads resnet (target loss 0.6), mlp-wide (target loss 0.7)"
    assert workloads_line({"settings": settings[:1]}, {}) == "Workload resnet"


def test_repeats_run_in_rounds_so_drift_slows_every_variant_alike(tmp_path):
    runs = plan(SUITE, BenchOptions(suite="test", workers=4, repeats=2), tmp_path)
    order = in_rounds(list(enumerate(runs, 1)))
    assert [run.repeat for _, run in order] == [0] * 6 + [1] * 6
    assert [(run.setting.name, run.variant.label) for _, run in order[:6]] == [
        (run.setting.name, run.variant.label) for run in runs if run.repeat == 0]


@pytest.mark.parametrize("reason", ["interrupted", "failed: worker rank 1 exited with code 1"])
def test_an_interrupted_or_failed_run_is_not_done_and_resume_runs_it_again(tmp_path, reason):
    """Both leave a summary.json of what they measured; neither is a repeat's figures."""
    [run, *_] = plan(SUITE, BenchOptions(suite="test", workers=4), tmp_path)
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "summary.json").write_text(json.dumps({**summary(None, 900),
                                                         "stop_reason": reason}))
    assert not run.done
    (run.run_dir / "summary.json").write_text(json.dumps({**summary(None, 900),
                                                         "stop_reason": "max_time"}))
    assert run.done


@pytest.mark.parametrize("given", [0.0, 0.25])
def test_a_given_target_loss_is_kept_even_at_zero(tmp_path, given):
    """`--target-loss 0` (never stop at a target) is a value, not "not given"."""
    runs = plan(SUITE, BenchOptions(suite="test", workers=4, target_loss=given), tmp_path)
    assert {run.config.target_loss for run in runs} == {given}


def test_with_repeats_a_real_suite_sets_each_round_against_its_own_references(tmp_path):
    """A machine twice as fast in the second round: each run is set against the ideal of its
    own round, then the median over the rounds; the ratio of the medians would pair one
    round's run with another's references. The range over the rounds is shown beside it."""
    options = BenchOptions(suite="real-test", workers=4, repeats=3)
    runs = plan(REAL, options, tmp_path)

    def real(samples: float) -> dict:
        return {**summary(None, samples), "compute_ms_median": 50.0, "iterations": [10] * 4}

    speed = (1.0, 2.0, 1.5)  # the machine, round by round
    solo, share, side = 500.0, 125.0, 1800.0
    write(runs, {
        ("solo", "solo"): [real(solo * k) for k in speed],
        ("solo at share", "solo"): [real(share * k) for k in speed],
        ("alone at once", "alone"): [real(side * k) for k in speed],
        ("homogeneous", "allreduce"): [real(0.9 * 4 * solo * k) for k in speed],
        ("homogeneous", "adpsgd"): [real(f * 4 * solo * k)
                                    for f, k in zip((0.95, 0.85, 0.8), speed, strict=True)],
        ("slow", "allreduce"): [real(0.3 * (3 * solo + share) * k) for k in speed],
        ("slow", "adpsgd"): [real(0.9 * (3 * solo + share) * k) for k in speed[:2]] + [None],
    })
    results = collect(REAL, options, runs, tmp_path)
    homogeneous, slow = rows(results, "homogeneous"), rows(results, "slow")
    adpsgd = homogeneous["adpsgd"]
    assert adpsgd["ideal_samples_per_s"] == 3000  # of the medians: 4 x 750
    assert adpsgd["samples_per_s"] / 3000 == 0.8  # what the medians alone would say
    assert adpsgd["ideal_fraction"] == 0.85
    assert adpsgd["ideal_fraction_range"] == [0.8, 0.95]
    assert homogeneous["allreduce"]["ideal_fraction"] == 0.9
    assert homogeneous["allreduce"]["ideal_fraction_range"] == [0.9, 0.9]
    assert homogeneous["allreduce"]["alone_at_once_fraction"] == 1.0  # 4 x 450 each round
    assert slow["allreduce"]["ideal_fraction"] == 0.3
    assert slow["adpsgd"]["ideal_fraction"] == 0.9  # over the rounds it finished
    table = real_table(results["settings"][3])
    assert "| 2400 | 85.0% (80.0-95.0) | 94.4% (88.9-105.6) |" in table


def test_a_round_whose_reference_failed_drops_out_and_the_table_says_so(tmp_path):
    options = BenchOptions(suite="real-test", workers=4, repeats=3)
    runs = plan(REAL, options, tmp_path)

    def real(samples: float) -> dict:
        return {**summary(None, samples), "compute_ms_median": 50.0, "iterations": [10] * 4}

    speed = (1.0, 2.0, 1.5)
    write(runs, {
        ("solo", "solo"): [real(500.0), None, real(750.0)],  # round 2's failed
        ("solo at share", "solo"): [real(125.0 * k) for k in speed],
        ("alone at once", "alone"): [real(1800.0 * k) for k in speed],
        ("homogeneous", "allreduce"): [real(1800.0 * k) for k in speed],
        ("homogeneous", "adpsgd"): [real(f * 2000.0 * k)
                                    for f, k in zip((0.95, 0.85, 0.8), speed, strict=True)],
        ("slow", "allreduce"): [real(500.0 * k) for k in speed],
        ("slow", "adpsgd"): [real(1500.0 * k) for k in speed],
    })
    results = collect(REAL, options, runs, tmp_path)
    adpsgd = rows(results, "homogeneous")["adpsgd"]
    assert adpsgd["ideal_fraction"] == 0.875  # rounds 1 and 3: 0.95 and 0.8
    assert adpsgd["ideal_fraction_rounds"] == 2
    assert adpsgd["alone_at_once_fraction_rounds"] == 3
    assert "| 87.5% (80.0-95.0; 2 of 3 rounds) |" in real_table(results["settings"][3])


def test_one_repeat_shows_no_range(tmp_path):
    options = BenchOptions(suite="real-test", workers=4)
    runs = plan(REAL, options, tmp_path)
    write(runs, {key: [{**summary(None, 1000.0), "compute_ms_median": 50.0}]
                 for key in [("solo", "solo"), ("solo at share", "solo"),
                             ("alone at once", "alone"), ("homogeneous", "allreduce"),
                             ("homogeneous", "adpsgd"), ("slow", "allreduce"),
                             ("slow", "adpsgd")]})
    row = rows(collect(REAL, options, runs, tmp_path), "homogeneous")["adpsgd"]
    assert row["ideal_fraction"] == 0.25 and row["ideal_fraction_range"] is None
