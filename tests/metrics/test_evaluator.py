"""The evaluator's bisection of the first crossing of the target (no processes: a fake
measure whose loss is a parameter of the model)."""

from __future__ import annotations

import json

import pytest
import torch

from hetsync.metrics import evaluator as evaluator_module
from hetsync.metrics.evaluator import Evaluator, WorkloadMeasure, has_batchnorm
from hetsync.metrics.summary import time_to_target
from hetsync.metrics.worker_log import snapshot_path
from hetsync.workloads import get_workload


def _snapshot(run_dir, index, loss, world=2, iteration=None):
    """Set `index` at t = iteration / 4 s (iteration: the index unless given), whose consensus
    loss is `loss`."""
    iteration = index if iteration is None else iteration
    for rank in range(world):
        path = snapshot_path(run_dir, index, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"w": torch.tensor([loss + (0.1 if rank else -0.1)])}
        torch.save({"iteration": iteration, "t": iteration / 4, "state": state}, path)


class LossIsW:
    def __init__(self):
        self.calls = 0
        self.averaged: list[bool] = []

    def __call__(self, state, subset, averaged=False):
        self.calls += 1
        self.averaged.append(averaged)
        return float(state["w"]), None


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]


def _losses(n):
    """Falling by 0.1 every set: 1.6 at set 0, 0.5 at set 11, 0.4 at set 12."""
    return [1.6 - 0.1 * i for i in range(n)]


def test_the_skipped_sets_are_bisected_down_to_one_snapshot_period(tmp_path):
    measure = LossIsW()
    evaluator = Evaluator(tmp_path, 2, measure, per_worker=False, target_loss=0.45)
    _snapshot(tmp_path, 0, 1.6)
    evaluator.poll(throttle=False)
    for index, loss in enumerate(_losses(16)[1:], start=1):  # fell behind: 15 sets at once
        _snapshot(tmp_path, index, loss)
    stops = []
    evaluator.on_consensus = lambda t, loss: stops.append(t)
    assert evaluator.poll(throttle=False) == 1
    assert stops == [15 / 4]  # only the newest set counts for stopping the run
    assert measure.calls == 2 + 4  # the 14 sets between: log2(15) evaluations, not 14
    assert not (tmp_path / "snapshots" / "000005").exists()  # all dropped afterwards
    assert time_to_target(_rows(tmp_path), 0.45) == pytest.approx((11.5 / 4, 11 / 4, 12 / 4))


def test_after_the_crossing_skipped_sets_are_dropped_unevaluated(tmp_path):
    measure = LossIsW()
    evaluator = Evaluator(tmp_path, 2, measure, per_worker=False, target_loss=0.45)
    for index, loss in enumerate([0.3, 0.2, 0.1]):
        _snapshot(tmp_path, index, loss)
    evaluator.poll(throttle=False)
    assert measure.calls == 2  # crossed at once: set 0 (already below) bounds the bracket
    for index, loss in enumerate([0.05, 0.04, 0.03], start=3):
        _snapshot(tmp_path, index, loss)
    evaluator.poll(throttle=False)
    assert measure.calls == 3  # the newest only


def test_a_throttled_poll_keeps_the_sets_a_bisection_may_need(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluator_module, "CPU_SHARE", 1e-9)  # wait "forever" after one
    evaluator = Evaluator(tmp_path, 2, LossIsW(), per_worker=False, target_loss=0.45)
    _snapshot(tmp_path, 0, 1.6)
    assert evaluator.poll() == 1
    for index, loss in enumerate(_losses(4)[1:], start=1):
        _snapshot(tmp_path, index, loss)
    assert evaluator.poll() == 0
    assert all((tmp_path / "snapshots" / f"{i:06d}").exists() for i in (1, 2, 3))


def test_without_a_target_nothing_is_kept_or_bisected(tmp_path):
    measure = LossIsW()
    evaluator = Evaluator(tmp_path, 2, measure, per_worker=False)
    for index, loss in enumerate(_losses(5)):
        _snapshot(tmp_path, index, loss)
    evaluator.poll(throttle=False)
    assert measure.calls == 1
    assert not (tmp_path / "snapshots" / "000000").exists()


def test_a_lost_worker_leaves_the_sets_the_consensus_of_the_others(tmp_path):
    """Rank 1 wrote set 0 only: without `lose`, set 1 would wait for it for good."""
    _snapshot(tmp_path, 0, 1.0, world=3)
    for rank in (0, 2):
        path = snapshot_path(tmp_path, 1, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"iteration": 1, "t": 0.25, "state": {"w": torch.tensor([0.5 + rank])}}, path)
    evaluator = Evaluator(tmp_path, 3, LossIsW(), per_worker=False)
    evaluator.lose(1)
    evaluator.poll(every_set=True, throttle=False)
    [row] = [r for r in _rows(tmp_path) if r["iterations"] == [1, 1]]
    assert row["ranks"] == [0, 2]
    assert row["loss"] == pytest.approx(1.5)  # (0.5 + 2.5) / 2


@pytest.mark.parametrize(("final_loss", "measured"), [(0.5, 1), (0.4, 2)])
def test_a_final_set_equal_to_the_newest_is_not_measured_again(tmp_path, final_loss, measured):
    """A run that ends right after its last snapshot: the final models are that set's, and
    their measure is reused; final models that moved on are measured."""
    measure = LossIsW()
    evaluator = Evaluator(tmp_path, 2, measure, per_worker=False)
    _snapshot(tmp_path, 3, 0.5)
    _snapshot(tmp_path, "final", final_loss, iteration=4)
    evaluator.finish()
    assert measure.calls == measured
    rows = _rows(tmp_path)
    assert [r["model"] for r in rows] == ["consensus", "final"]
    assert [r["loss"] for r in rows] == pytest.approx([0.5, final_loss])


def test_averages_are_measured_as_averages_and_workers_models_as_their_own(tmp_path):
    """The consensus and final sets are averages (their BatchNorm statistics recomputed); a
    worker's own model is measured with its own."""
    measure = LossIsW()
    evaluator = Evaluator(tmp_path, 2, measure, per_worker=True)
    _snapshot(tmp_path, 0, 0.5)
    _snapshot(tmp_path, "final", 0.4, iteration=4)
    evaluator.finish()
    models = [r["model"] for r in _rows(tmp_path)]
    assert models == ["consensus", "rank0", "rank1", "final"]
    assert measure.averaged == [True, False, False, True]


def _with_running_stats(state, scale):
    """`state` with every BatchNorm running variance multiplied by `scale` and its means
    shifted: statistics that belong to no weights."""
    return {k: v * scale if k.endswith("running_var") else
            v + scale if k.endswith("running_mean") else v for k, v in state.items()}


def test_an_averaged_models_batchnorm_statistics_are_recomputed_from_training_data():
    """Measured as an average, a ResNet's loss does not depend on the statistics it came with
    (they are recomputed, as torch.optim.swa_utils.update_bn does); as a worker's own model,
    or with `recompute_bn` off, the statistics it has are used."""
    workload = get_workload("resnet")
    torch.manual_seed(0)
    state = workload.build_model().state_dict()
    wrong = _with_running_stats(state, 4.0)
    measure = WorkloadMeasure(workload, 500)
    assert has_batchnorm(measure.model) and measure.bn_batches
    assert sum(len(b) for b in measure.bn_batches) == evaluator_module.BN_SAMPLES
    recomputed = measure(wrong, subset=True, averaged=True)
    assert measure(state, subset=True, averaged=True) == recomputed
    as_saved = measure(wrong, subset=True)
    assert as_saved != recomputed
    saved_only = WorkloadMeasure(workload, 500, recompute_bn=False)
    assert not saved_only.bn_batches
    assert saved_only(wrong, subset=True, averaged=True) == as_saved


def test_a_model_without_batchnorm_has_nothing_recomputed():
    assert not WorkloadMeasure(get_workload("svm"), 100).bn_batches
