"""`hetsync bench --simulate` and the scaling section: suites run in the simulator."""

from __future__ import annotations

import json

from hetsync.bench.command import bench
from hetsync.bench.runner import BenchOptions


def test_a_suite_runs_in_the_simulator_and_reports_scaling(tmp_path):
    options = BenchOptions(suite="scaling", workload="svm", simulate=True, max_time=2.0)
    report = bench(options, tmp_path / "scaling", show_run_progress=False)
    results = json.loads((tmp_path / "scaling" / "results.json").read_text())
    applicable = sum(not row["not_applicable"] for s in results["settings"] for row in s["results"])
    assert results["simulated"] and results["runs_done"] == applicable
    summary = json.loads(next((tmp_path / "scaling" / "runs").rglob("summary.json")).read_text())
    assert summary["engine"] == "simulator"
    text = report.read_text()
    assert "## Scaling" in text and "16 workers" in text
    assert (tmp_path / "scaling" / "plots" / "scaling.png").is_file()
    assert "--simulate" in text  # the command that regenerates it
