"""Shared fixtures: integration runs are real processes over gloo on loopback."""

from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.launch.launcher import RunResult, run


@pytest.fixture
def train_run(tmp_path):
    """Run a short built-in training job and return its RunResult."""

    def start(**options: object) -> RunResult:
        defaults: dict[str, object] = {
            "workload": "digits", "workers": 2, "quiet": True, "eval_every": 0.5,
            "hang_timeout": 20.0, "out": tmp_path / str(options.get("label", "run")),
        }
        return run(RunConfig(**{**defaults, **options}))

    return start
