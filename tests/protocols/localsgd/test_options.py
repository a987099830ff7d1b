"""Local SGD's options: checked in one line each; its variants are valid runs."""

from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.protocols.localsgd.variants import VARIANTS


@pytest.mark.parametrize(("options", "message"), [
    ({"local_steps": 0}, "--local-steps must be >= 1"),
    ({"outer_optimizer": "adam"}, "--outer-optimizer must be none or nesterov"),
    ({"outer_lr": -0.1}, "--outer-lr must not be negative"),
    ({"outer_momentum": 1.0}, r"--outer-momentum must be in \[0, 1\)"),
    ({"on_failure": "continue"}, "localsgd cannot go on without a worker"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(protocol="localsgd", workload="svm", **options).validate()


def test_the_variants_are_valid_runs_with_one_default():
    for variant in VARIANTS:
        RunConfig(protocol="localsgd", workload="svm", **variant.options).validate()
    assert [v.label for v in VARIANTS if v.default] == ["localsgd"]
