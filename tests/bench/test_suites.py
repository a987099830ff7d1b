"""Suites are data: every one plans into valid run configurations, with shared seeds."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from hetsync.bench.runner import BenchOptions, plan
from hetsync.bench.suites import (
    EVERY_PROTOCOL,
    GPU,
    HEADLINE,
    SUITES,
    describe_suites,
    get_suite,
)
from hetsync.cli import main
from hetsync.errors import ConfigError
from hetsync.protocols.registry import available_protocols
from hetsync.workloads import get_workload


@pytest.mark.parametrize("name", [n for n in SUITES if n != "gpu"])  # gpu: its own tests
@pytest.mark.parametrize("workload", ["cnn", "svm"])
def test_every_suite_plans_valid_runs(name, workload, tmp_path):
    suite = get_suite(name)
    runs = plan(suite, BenchOptions(suite=name, workload=workload), tmp_path)
    assert len(runs) == sum(len(suite.variants_of(s)) for s in suite.settings)
    assert len({run.run_dir for run in runs}) == len(runs)
    assert all(run.run_dir.is_relative_to(tmp_path / "runs") for run in runs)


def test_every_protocol_is_in_the_full_suites():
    """A new protocol must join the suites, or this fails."""
    assert {v.options["protocol"] for v in EVERY_PROTOCOL} == set(available_protocols())
    assert len({v.label for v in EVERY_PROTOCOL}) == len(EVERY_PROTOCOL)


def test_rows_of_a_setting_share_workload_seed_and_slowdown(tmp_path):
    options = BenchOptions(suite="deterministic", repeats=3, seed=7)
    runs = plan(get_suite("deterministic"), options, tmp_path)
    for setting in get_suite("deterministic").settings:
        rows = [run for run in runs if run.setting == setting]
        assert {run.config.slowdown for run in rows} == {setting.slowdown}
        assert {run.config.seed for run in rows} == {7, 8, 9}
        for repeat in range(3):
            assert len({run.config.seed for run in rows if run.repeat == repeat}) == 1


def test_scaling_sets_the_worker_counts(tmp_path):
    runs = plan(get_suite("scaling"), BenchOptions(suite="scaling"), tmp_path)
    assert sorted({run.config.workers for run in runs}) == [4, 8, 16]


def test_headline_uses_its_target_and_cap_unless_told(tmp_path):
    runs = plan(HEADLINE, BenchOptions(), tmp_path)
    assert {run.config.target_loss for run in runs} == {HEADLINE.target_loss["cnn"]}
    assert {run.config.max_time for run in runs} == {HEADLINE.max_time}
    told = plan(HEADLINE, BenchOptions(target_loss=0.45, max_time=30), tmp_path)
    assert {(r.config.target_loss, r.config.max_time) for r in told} == {(0.45, 30)}


def test_a_protocol_that_cannot_run_in_a_setting_is_kept_with_the_reason(tmp_path):
    runs = plan(get_suite("scaling"), BenchOptions(suite="scaling"), tmp_path)
    left_out = {(r.setting.name, r.variant.label): r.not_applicable for r in runs
                if r.not_applicable}
    assert list(left_out) == [("4 workers", "prague-division2")]
    assert "divisions of the 4 workers holds a group of 3" in \
        left_out["4 workers", "prague-division2"]


def test_a_suite_that_cannot_run_at_all_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no run of the suite can start: --step-time must not"):
        plan(get_suite("smoke"), BenchOptions(suite="smoke", step_time=-1), tmp_path)


def test_unknown_suite_workload_and_bad_repeats():
    with pytest.raises(ConfigError, match="unknown workload 'nope'"):
        BenchOptions(workload="nope").check()
    with pytest.raises(ConfigError, match="unknown suite 'fast'"):
        BenchOptions(suite="fast").check()
    with pytest.raises(ConfigError, match="--repeats must be >= 1"):
        BenchOptions(repeats=0).check()


def test_describe_suites_counts_runs():
    lines = {line.split()[0]: line.split()[1:3] for line in describe_suites().splitlines()}
    assert lines["headline"] == ["14", "runs"]  # 7 variants (localsgd's since issue 23), 2 settings
    assert lines["everything"] == [str(8 * len(EVERY_PROTOCOL)), "runs"]
    assert lines["regimes-small"] == ["28", "runs"]


def test_every_workload_a_suite_names_exists():
    for suite in SUITES.values():
        for setting in suite.settings:
            if setting.workload is not None:
                get_workload(setting.workload)


def test_the_gpu_suite_is_every_protocol_family_against_ddp_on_real_compute():
    """Listed without planning (planning a CUDA run validates it against this machine)."""
    assert GPU.workload == "resnet-wide" and dict(GPU.run_options) == {"device": "cuda"}
    labels = [variant.label for variant in GPU.variants]
    assert "ddp" in labels
    assert {v.options["protocol"] for v in GPU.variants} == set(available_protocols())
    assert {"prague", "prague-no-overlap", "prague-static", "ps-sync", "ps-async"} <= set(labels)
    assert [(s.slowdown, s.workers, s.step_time) for s in GPU.settings] == [
        ("none", 4, 0.0), ("deterministic:ranks=3,factor=5", 4, 0.0)]
    lines = {line.split()[0]: line.split()[1] for line in describe_suites().splitlines()}
    assert lines["gpu"] == str(2 * len(labels))


@pytest.mark.gpu
def test_the_gpu_suite_passes_its_device_and_real_compute_to_every_run(gpu_device, tmp_path):
    """Planned on `gpu_device` (cuda, or cpu with HETSYNC_TEST_GPU_DEVICE=cpu), since a run
    on a device this machine lacks is refused."""
    suite = dataclasses.replace(GPU, run_options=MappingProxyType({"device": gpu_device}))
    runs = plan(suite, BenchOptions(suite="gpu", workload="resnet-wide"), tmp_path)
    assert len(runs) == 2 * len(GPU.variants) and not any(r.not_applicable for r in runs)
    assert {(r.config.device, r.config.step_time, r.config.workers) for r in runs} == {
        (gpu_device, 0.0, 4)}


def test_variants_runs_the_named_rows_and_every_reference(tmp_path):
    """`--variants`: part of a suite rerun in the same rounds; the solo runs stay (the ideal)."""
    options = BenchOptions(suite="real-small", variants="hop, allreduce")
    runs = plan(options.chosen_suite(), options, tmp_path)
    by_setting: dict[str, set[str]] = {}
    for run in runs:
        by_setting.setdefault(run.setting.name, set()).add(run.variant.label)
    references = {s.name for s in get_suite("real-small").settings if s.reference}
    assert references and all(by_setting[name] in ({"solo"}, {"alone at once"})
                              for name in references)
    others = set(by_setting) - references
    assert others and all(by_setting[name] == {"hop", "allreduce"} for name in others)


def test_variants_refuses_a_label_the_suite_does_not_run():
    with pytest.raises(ConfigError, match=r"--variants: hop-skip not in suite real-small \(its "
                       r"variants: .*allreduce"):
        BenchOptions(suite="real-small", variants="hop-skip,allreduce").check()


def test_workload_keeps_a_real_suites_settings_of_that_workload(tmp_path):
    """`--workload` on a suite whose settings name their workloads: that workload's settings,
    its solo references among them, and nothing of the other."""
    options = BenchOptions(suite="real", workload="mlp-wide", variants="hop-stale-skip")
    runs = plan(options.chosen_suite(), options, tmp_path)
    assert {r.config.workload for r in runs} == {"mlp-wide"}
    assert {r.variant.label for r in runs} == {"solo", "alone at once", "hop-stale-skip"}
    assert sum(r.setting.reference for r in runs) == 3
    side = [r for r in runs if r.setting.side_by_side]  # the 8 workers alone at once
    assert len(side) == 1 and side[0].config.workers == 8 and side[0].setting.reference
    # CPU cores are what a real suite measures, also on a GPU machine (where auto means cuda)
    assert {(r.config.device, r.config.pin, r.config.stop_at_target) for r in runs} == {
        ("cpu", True, False)}  # and every run lasts its cap: "of ideal" compares rates
    assert len(plan(BenchOptions(suite="real").chosen_suite(), BenchOptions(suite="real"),
                    tmp_path)) == 50  # a workload that is not its own leaves the suite whole


def test_workload_the_real_suite_does_not_run_is_refused_in_one_line(capsys):
    assert main(["bench", "--suite", "real", "--workload", "cnn", "--list"]) == 0  # --list first
    code = main(["bench", "--suite", "real", "--workload", "cnn", "--out", "/nonexistent/x"])
    err = capsys.readouterr().err
    assert code == 2 and "--workload cnn: suite real runs resnet and mlp-wide only" in err
    assert err.count("\n") == 1


def test_cpus_per_worker_gives_every_real_run_that_many_cores_and_is_refused_elsewhere(
        tmp_path):
    options = BenchOptions(suite="real-small", variants="hop", cpus_per_worker=2).check()
    runs = plan(options.chosen_suite(), options, tmp_path)
    assert {r.config.cpus_per_worker for r in runs} == {2}  # the solo runs too: the ideal's
    with pytest.raises(ConfigError, match="--cpus-per-worker applies to the suites that pin"):
        BenchOptions(suite="headline", cpus_per_worker=2).check()
    with pytest.raises(ConfigError, match="--cpus-per-worker must be >= 1"):
        BenchOptions(suite="real", cpus_per_worker=0).check()
