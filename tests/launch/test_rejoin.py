"""`--on-failure rejoin`: a worker killed mid-run is restarted and rejoins the running run with a
live model (real processes; the core's part is unit-tested in tests/protocols/allreduce)."""

from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl

pytestmark = pytest.mark.integration

# 4 workers: in a ring of 4 the killed rank's far peer sees no failed pair of its own and
# waits on the old group, which only the newer generation ends (hetsync.transport.membership).
_RUN = dict(protocol="allreduce", workload="svm", workers=4, step_time=20.0,
            max_iterations=250, stop_at_target=False, quiet=True, on_failure="rejoin",
            fault="kill:rank=2,at=1.5s")


def test_a_killed_worker_is_restarted_and_rejoins_with_a_live_model(tmp_path, capsys):
    summary = run(RunConfig(out=tmp_path / "run", **_RUN)).summary
    assert summary["stop_reason"] == "max_iterations"
    [back] = summary["rejoined"]
    assert back["rank"] == 2 and back["restart"] == 1 and "SIGKILL" in back["reason"]
    assert back["back_at_s"] is not None and back["back_at_s"] > back["lost_at_s"]
    assert summary["generations"] == 1
    assert summary["iterations"] == [250] * 4  # the restarted one counts from the others'
    # Its model was the others', not a fresh or stale one: lock-step from there, the final
    # models agree exactly, which they would not from a new start.
    assert summary["final_consensus_distance"] == 0
    rows = [r["iteration"] for r in read_jsonl(tmp_path / "run" / "workers" / "rank2.jsonl")]
    assert rows == sorted(rows) and rows[-1] == 250
    gap = [b for a, b in zip(rows, rows[1:], strict=False) if b != a + 1]
    assert len(gap) == 1  # the iterations it missed while down, then on with the others
    err = capsys.readouterr().err
    assert "restarting it (restart 1 of 3" in err and "rank 2 is back" in err


@pytest.mark.slow  # for CI time: the same generations as above, one fewer member
def test_a_worker_whose_restarts_are_spent_is_left_out_and_the_others_go_on(tmp_path, capsys):
    summary = run(RunConfig(out=tmp_path / "run", max_restarts=0, **_RUN)).summary
    assert summary["stop_reason"] == "max_iterations"
    assert summary["rejoined"] == [] and summary["generations"] == 1
    assert [summary["iterations"][r] for r in (0, 1, 3)] == [250] * 3
    assert summary["iterations"][2] < 250
    assert summary["final_consensus_distance"] == 0  # of the three left
    err = capsys.readouterr().err
    assert "not restarted again" in err and "going on with ranks 0, 1, 3" in err
