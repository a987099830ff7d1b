"""`--epochs` and `--sampler`: what a run accepts, and the one line it refuses with."""

from __future__ import annotations

import re

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError


@pytest.mark.parametrize(("options", "error"), [
    ({"sampler": "elastic"}, "--sampler must be static or dynamic (got 'elastic')"),
    ({"epochs": 0}, "--epochs must be >= 1 (got 0)"),
    ({"epochs": 2, "script": ["examples/own_script.py"]}, "--epochs sets the built-in"),
])
def test_bad_options_fail_in_one_line(options, error):
    with pytest.raises(ConfigError, match=re.escape(error)) as raised:
        RunConfig(**options).validate()
    assert "\n" not in str(raised.value)


def test_a_dynamic_run_may_be_checkpointed():
    RunConfig(sampler="dynamic", epochs=2, checkpoint_every=5.0).validate()


def test_epochs_replace_the_default_time_limit():
    assert RunConfig(epochs=3, sampler="dynamic").validate().resolved().max_time is None
    assert RunConfig().resolved().max_time == RunConfig.DEFAULT_MAX_TIME
