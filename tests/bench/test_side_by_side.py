"""The real suites' n workers alone at once: where each runs, how their runs add up, and (on
real processes) that each really ran alone on its rank's core."""

from __future__ import annotations

import json
import os

import pytest

from hetsync.bench.side_by_side import alone_cores, combined_summary, run_side_by_side
from hetsync.config import RunConfig


def test_each_rank_gets_its_cores_in_the_runs_and_one_of_their_launchers():
    # 16 cores, 8 workers: rank r on core r as in the protocols' runs, its launcher on 8 + r
    assert alone_cores(8, 1, set(range(16))) == [{r, 8 + r} for r in range(8)]
    # fewer launcher cores than ranks: they take turns
    assert alone_cores(4, 1, set(range(6))) == [{0, 4}, {1, 5}, {2, 4}, {3, 5}]
    # no core left over: each launcher shares its worker's, as the runs' shares the last rank's
    assert alone_cores(2, 2, {0, 1, 2, 3}) == [{0, 1}, {2, 3}]


def _alone(rank: int, samples: float, compute: float, iterations: int) -> dict:
    return {"protocol": "allreduce", "label": "alone at once", "workload": "resnet",
            "wall_time_s": 10.0 + rank, "iterations": [iterations], "samples_per_s": samples,
            "compute_ms_median": compute, "stop_reason": "max_time", "target_loss": 0.6,
            "thread_cpu_ms_per_iteration": {"training": compute}}


def test_the_runs_add_up_to_one_reference_row():
    summary = combined_summary([_alone(0, 500, 52, 160), _alone(1, 400, 66, 128),
                                _alone(2, 450, 60, 144)], workers=3, cpus_per_worker=1)
    assert summary["samples_per_s"] == 1350 and summary["compute_ms_median"] == 60
    assert summary["iterations"] == [160, 128, 144] and summary["workers"] == 3
    assert summary["wall_time_s"] == 12 and summary["time_to_target_s"] is None
    assert summary["stop_reason"] == "max_time" and summary["side_by_side"]
    cut = combined_summary([_alone(0, 500, 52, 160), {**_alone(1, 0, 0, 0),
                            "stop_reason": "interrupted"}], workers=2, cpus_per_worker=1)
    assert cut["stop_reason"] == "interrupted"  # one run cut: the reference is not done


# Behind `slow` (17 s here: two launchers and their workers start): the CI budget. The unit
# tests above keep the cores and the sums in the default run; `hetsync bench --suite
# real-small` runs it end to end (docs/benchmarks.md).
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_two_workers_alone_at_once_each_on_its_own_core(tmp_path):
    config = RunConfig(workload="svm", workers=2, pin=True, device="cpu", max_time=1.0,
                       stop_at_target=False, step_time=0.0, quiet=True, out=tmp_path,
                       label="alone at once")
    result = run_side_by_side(config)
    assert result.summary["iterations"] == [
        json.loads((tmp_path / "alone" / f"rank{r}" / "summary.json").read_text())["iterations"][0]
        for r in range(2)] and min(result.summary["iterations"]) > 0
    cores = [json.loads((tmp_path / "alone" / f"rank{r}" / "summary.json").read_text())
             ["placement"]["cores"]["0"] for r in range(2)]
    first = sorted(os.sched_getaffinity(0))[:2]
    assert cores == [[first[0]], [first[1]]]  # as the protocols' runs pin ranks 0 and 1
    assert json.loads((tmp_path / "summary.json").read_text())["workers"] == 2
