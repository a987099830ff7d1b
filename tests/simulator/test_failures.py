"""The simulator models no failures, and says so rather than ignore the options."""

from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.simulator.run import simulate


@pytest.mark.parametrize("options", [{"fault": "kill:rank=1,at=1s"},
                                     {"on_failure": "continue", "protocol": "hop"}])
def test_failures_are_not_simulated_and_say_so(options, tmp_path):
    config = RunConfig(workload="svm", workers=4, step_time=10.0, max_iterations=5,
                       out=tmp_path / "sim", **options)
    with pytest.raises(ConfigError, match="does not model failures"):
        simulate(config)
