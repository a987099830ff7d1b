"""`--on-failure continue`: a worker killed or stopped mid-run is left out and the others go on
(real processes; the protocols' reactions are unit-tested with their cores)."""

from __future__ import annotations

import json

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError, WorkerFailed
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl

pytestmark = pytest.mark.integration

_RUN = dict(workload="svm", workers=4, step_time=10.0, max_time=5.0, hang_timeout=2.0,
            stop_at_target=False, quiet=True, on_failure="continue")


@pytest.mark.parametrize(("protocol", "options"), [
    ("hop", {"backup": 1}),
    ("prague", {}),
    # AD-PSGD's loss is also resumed from in tests/launch/test_resume_after_loss.py, async
    # PS's server lost below: behind slow here, for CI time.
    pytest.param("adpsgd", {}, marks=pytest.mark.slow),
    pytest.param("ps", {"ps_mode": "async"}, marks=pytest.mark.slow),
])
def test_a_killed_worker_is_left_out_and_the_others_go_on(protocol, options, tmp_path, capsys):
    out = tmp_path / protocol
    result = run(RunConfig(protocol=protocol, out=out, fault="kill:rank=3,at=1.5s",
                           **_RUN, **options))
    summary = result.summary
    assert summary["stop_reason"] == "max_time"
    [lost] = summary["lost_workers"]
    assert lost["rank"] == 3 and "killed by signal SIGKILL" in lost["reason"]
    assert 1.4 < lost["at_s"] < 4.0
    survivors = [summary["iterations"][r] for r in range(3)]
    assert min(survivors) > 2 * summary["iterations"][3]  # they went on well past the loss
    err = capsys.readouterr().err
    assert "going on without it" in err
    assert "aborted while exiting" not in err  # the survivors ended cleanly
    final = [row for row in read_jsonl(out / "eval.jsonl") if row["model"] == "final"]
    assert final and final[0]["ranks"] == [0, 1, 2]  # the consensus of the survivors


@pytest.mark.slow  # the core's unit test and the ps-sync-lose1 fuzz variant cover it in CI
def test_a_synchronous_server_goes_on_without_a_worker_lost_with_its_push_in_a_round(tmp_path):
    """Rank 1 computes 2 s per iteration and the others 0.5 s, so rank 3's push waits in the
    round when it is killed (0.8 s) and still when the launcher declares it lost (about 1.6 s):
    before PSServerCore's WorkerLost, the server took the loss for a goodbye with its push
    unanswered and failed the run."""
    out = tmp_path / "ps"
    result = run(RunConfig(protocol="ps", out=out, fault="kill:rank=3,at=0.8s",
                           slowdown="deterministic:ranks=1,factor=4",
                           **{**_RUN, "step_time": 500.0, "max_time": 6.0, "hang_timeout": 6.0}))
    summary = result.summary
    assert summary["stop_reason"] == "max_time"
    assert [w["rank"] for w in summary["lost_workers"]] == [3]
    assert min(summary["iterations"][r] for r in range(3)) > summary["iterations"][3]


def test_a_stopped_worker_is_killed_and_left_out(tmp_path):
    out = tmp_path / "run"
    result = run(RunConfig(protocol="hop", backup=1, out=out, fault="stop:rank=2,at=1s",
                           **{**_RUN, "max_time": 7.0}))
    [lost] = result.summary["lost_workers"]
    assert lost["rank"] == 2 and "was stopped" in lost["reason"]
    assert lost["at_s"] < 1.0 + 2.0 + 1.5  # within --hang-timeout of the stop
    assert result.summary["stop_reason"] == "max_time"
    rows = read_jsonl(out / "workers" / "rank0.jsonl")
    assert rows[-1]["t"] > lost["at_s"] + 1.0  # rank 0 trained on after the loss


def test_losing_the_rank_that_hosts_a_service_still_ends_the_run(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(WorkerFailed, match="worker rank 0 was killed"):
        run(RunConfig(protocol="ps", ps_mode="async", out=out, fault="kill:rank=0,at=1.5s",
                      **_RUN))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"].startswith("failed: worker rank 0 was killed")


@pytest.mark.parametrize(("options", "message"), [
    ({"protocol": "allreduce"}, "allreduce cannot go on without a worker"),
    ({"protocol": "dpsgd"}, "dpsgd cannot go on without a worker"),
    ({"protocol": "prague", "schedule": "static"}, "--schedule static has every worker"),
    ({"protocol": "prague", "backend": "nccl"}, "P-Reduce would run on NCCL"),
    ({"protocol": "adpsgd", "adpsgd_mode": "naive", "topology": "complete"}, "naive"),
    ({"protocol": "hop", "topology": "directed-ring"}, "not strongly connected without rank"),
])
def test_protocols_that_cannot_go_on_are_refused_in_one_line(options, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as refused:
        run(RunConfig(**{**_RUN, **options, "out": tmp_path / "run"}))
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()
