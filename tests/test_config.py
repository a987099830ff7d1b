"""Run options refused before anything starts (the backend and device's combinations:
tests/transport/test_placement.py)."""

from __future__ import annotations

import re

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


def test_a_protocol_option_set_as_an_attribute_travels_with_the_config():
    config = RunConfig(protocol="hop")
    config.max_gap = 5
    config.workers = 3
    assert config.protocol_options.max_gap == 5
    copy = RunConfig(**config.to_dict())
    assert (copy.max_gap, copy.workers) == (5, 3)


def test_another_protocols_option_set_as_an_attribute_is_refused_as_the_constructor_does():
    """It read back, but workers never saw it: to_dict and config.json left it out."""
    config = RunConfig(protocol="prague")
    with pytest.raises(ConfigError) as refused:
        config.max_gap = 5
    assert str(refused.value) == ("--max-gap applies to --protocol hop (this run's protocol "
                                  "is prague)")
    with pytest.raises(ConfigError) as constructed:
        RunConfig(protocol="prague", max_gap=5)
    assert str(constructed.value) == str(refused.value)
    with pytest.raises(ConfigError, match="this run's protocol is allreduce"):
        RunConfig(protocol="allreduce").adpsgd_mode = "naive"  # a protocol without options
    assert "max_gap" not in config.to_dict()
    assert config.max_gap == RunConfig(protocol="hop").max_gap  # it reads as hop's default


def test_a_misspelt_option_set_as_an_attribute_is_refused():
    config = RunConfig(protocol="hop")
    with pytest.raises(AttributeError, match="^RunConfig has no option 'max_gpa'$"):
        config.max_gpa = 5
    assert not hasattr(config, "max_gpa")


@pytest.mark.parametrize(("options", "message"), [
    ({"protocol": "hop"}, "hop's workers cannot rejoin a running run yet"),
    ({"protocol": "ddp"}, "these can: allreduce"),
    ({"backend": "nccl"}, "--on-failure rejoin needs --backend gloo"),
    ({"compress": "int8"}, "--compress int8 is not generation-aware"),
    ({"max_restarts": -1}, "--max-restarts must be 0 or more"),
])
def test_rejoin_is_refused_where_a_restarted_worker_could_not_rejoin(options, message):
    config = RunConfig(**{"protocol": "allreduce", "workers": 4, "on_failure": "rejoin",
                          **options})
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.validate()
