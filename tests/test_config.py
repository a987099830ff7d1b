"""Run options refused before anything starts (the backend and device's combinations:
tests/transport/test_placement.py)."""

from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError


@pytest.mark.parametrize(("name", "value"), [("backend", "mpi"), ("device", "gpu")])
def test_an_unknown_backend_or_device_is_refused_in_one_line(name, value):
    with pytest.raises(ConfigError, match=f"--{name} must be auto or "):
        RunConfig(workload="digits", **{name: value}).validate()


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda"])
def test_the_devices_are_options_of_a_run(device):
    """Checked against the machine's GPUs by the launcher, not by validate(): a config is
    read and checked where no GPU is (the bench, the simulator)."""
    assert RunConfig(workload="digits", device=device).validate().device == device
