"""A worker busy in its script's own code between two steps (a validation pass, a
checkpoint) for several times --hang-timeout is not hung: the launcher sees its training
thread on a core, its peers wait for it in gloo or in their protocol without a deadline of
their own, and the run ends cleanly. A worker that sleeps or is stopped there is still found
(tests/launch/test_monitor.py, test_runs.py's hung worker, tests/test_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "scripts" / "busy_between_steps.py"


@pytest.mark.parametrize(("protocol", "busy_s"), [
    ("allreduce", 4.0),  # lock-step: its peer waits in gloo's all-reduce
    ("hop", 8.0),  # past Hop's own former wait limit (2 x --hang-timeout + 5 s)
])
def test_a_worker_busy_between_steps_for_long_is_not_hung(tmp_path, protocol, busy_s,
                                                          processes_of):
    out = tmp_path / "run"
    result = run(RunConfig(protocol=protocol, workers=2, script=[str(SCRIPT), str(busy_s), "8"],
                           out=out, quiet=True, hang_timeout=1.0, device="cpu"))
    assert result.summary["iterations"] == [8, 8]
    assert processes_of(out) == []
