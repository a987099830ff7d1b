"""The simulator against a real run of the same configuration: the small case of
experiments/sim_validation.py (issue 13 asks simulated throughput within 15 % of measured)."""

from __future__ import annotations

import os

import pytest

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.simulator.run import SimOptions, simulate

pytestmark = pytest.mark.integration


def test_simulated_throughput_matches_a_real_hop_run(tmp_path):
    # The simulator's constants are this machine's own when others leave it its CPUs: with
    # twice as many runnable processes as CPUs the real run measures the others' load, not Hop.
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > 2 * cpus:
        pytest.skip(f"load average {load:.1f} on {cpus} CPUs: a real run's throughput "
                    "would measure the other processes")
    options = {"protocol": "hop", "workload": "svm", "workers": 4, "step_time": 50.0,
               "max_time": 5.0, "stop_at_target": False, "quiet": True, "hang_timeout": 20.0}
    real = run(RunConfig(**options, out=tmp_path / "real")).summary
    simulated = simulate(RunConfig(**options, out=tmp_path / "sim"),
                         SimOptions(progress=False)).summary
    ratio = simulated["samples_per_s"] / real["samples_per_s"]
    assert abs(ratio - 1) <= 0.15, (
        f"simulated {simulated['samples_per_s']:.0f} samples/s, measured "
        f"{real['samples_per_s']:.0f} (ratio {ratio:.2f})")
    assert simulated["iterations"] and min(simulated["iterations"]) > 0
