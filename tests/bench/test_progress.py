"""The suite's ETA learns from the runs it has timed."""

from __future__ import annotations

import io

import pytest

from hetsync.bench.progress import STARTUP_S_PER_WORKER, EtaEstimator, SuiteProgress, clock


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (59.4, "59 s"), (60, "1m00s"),
                                               (185, "3m05s"), (3720, "1h02m")])
def test_clock(seconds, text):
    assert clock(seconds) == text


def test_before_any_run_the_cap_and_startup():
    assert EtaEstimator().predict(8, 60.0) == 60.0 + 8 * STARTUP_S_PER_WORKER


def test_same_size_runs_predict_by_their_mean_others_scale_by_workers():
    eta = EtaEstimator()
    eta.record(8, 40.0)
    eta.record(8, 60.0)
    assert eta.predict(8, 60.0) == 50.0
    assert eta.predict(16, 60.0) == 100.0
    assert eta.remaining([(8, 60.0), (4, 60.0)]) == 75.0


def test_progress_lines_name_the_run_and_eta():
    stream = io.StringIO()
    progress = SuiteProgress(12, stream)
    progress.skipped(2)
    progress.started(3, "homogeneous · hop · repeat 1", [(8, 60.0), (8, 60.0)])
    progress.finished(8, "target in 20.0 s")
    progress.started(4, "homogeneous · prague · repeat 1", [(8, 60.0)])
    lines = stream.getvalue().splitlines()
    assert lines[0] == "resuming: 2 of 12 runs already done"
    assert lines[1] == "[ 3/12] homogeneous · hop · repeat 1 | elapsed 0 s, ETA at most 2m40s"
    assert lines[2].startswith("    target in 20.0 s (")
    assert lines[3].startswith("[ 4/12] homogeneous · prague · repeat 1 | elapsed 0 s, ETA ~")
