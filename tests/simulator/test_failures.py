"""Lost workers in the simulator: `--fault kill --on-failure continue` drives the cores' lost-worker
events; every other failure is refused in one line, by the check real runs make."""

from __future__ import annotations

import json

import pytest

from hetsync.cli import main
from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.simulator.run import SimOptions, simulate
from hetsync.simulator.world import DETECTION_S

QUIET = SimOptions(progress=False)
KILL = "kill:rank=3,at=1s"


def config(tmp_path, **options: object) -> RunConfig:
    values: dict[str, object] = {"workload": "svm", "workers": 6, "step_time": 50.0,
                                 "max_iterations": 60, "out": tmp_path / "sim", "quiet": True,
                                 "fault": KILL, "on_failure": "continue"}
    return RunConfig(**{**values, **options})  # type: ignore[arg-type]


@pytest.mark.parametrize("options", [
    {"protocol": "hop", "backup": 1}, {"protocol": "hop"}, {"protocol": "prague"},
    {"protocol": "prague", "gg_policy": "random", "group_buffer": True},
    {"protocol": "adpsgd"}, {"protocol": "ps", "ps_mode": "async"}, {"protocol": "ps"}])
def test_the_survivors_of_a_lost_worker_complete_their_iterations(options, tmp_path):
    result = simulate(config(tmp_path, **options), QUIET)
    summary = result.summary
    assert summary["stop_reason"] is None
    [lost] = summary["lost_workers"]
    assert lost["rank"] == 3 and lost["at_s"] == pytest.approx(1.0 + DETECTION_S)
    assert "killed by signal SIGKILL" in lost["reason"]
    iterations = summary["iterations"]
    assert iterations[3] < 60 and all(n == 60 for r, n in enumerate(iterations) if r != 3)


def test_a_lost_worker_under_max_time_and_math_leaves_the_survivors_consensus(tmp_path):
    result = simulate(config(tmp_path, protocol="prague", max_iterations=None, max_time=2.5),
                      SimOptions(math=True, progress=False))
    for rank in (0, 1, 2, 4, 5):  # each survivor ran until --max-time
        last = (result.run_dir / "workers" / f"rank{rank}.jsonl").read_text().splitlines()[-1]
        assert json.loads(last)["t"] >= 2.5
    evals = [json.loads(line) for line in (result.run_dir / "eval.jsonl").read_text().splitlines()]
    assert "ranks" not in evals[0]  # before the loss: everyone's
    assert evals[-1]["ranks"] == [0, 1, 2, 4, 5]
    assert result.summary["lost_workers"][0]["rank"] == 3


def test_a_worker_done_before_its_kill_is_not_lost(tmp_path):
    result = simulate(config(tmp_path, protocol="hop", max_iterations=5, fault="kill:rank=3,at=9s"),
                      QUIET)
    assert result.summary["lost_workers"] == []


def test_the_cli_records_the_loss_for_the_report(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--workload", "svm", "--workers", "4", "--step-time", "20",
                 "--max-iterations", "40", "--protocol", "adpsgd", "--fault",
                 "kill:rank=1,at=0.3s", "--on-failure", "continue", "--out", str(out),
                 "--quiet"]) == 0
    assert "1 worker(s) lost (ranks 1)" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["lost_workers"][0]["rank"] == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"fault": "stop:rank=1,at=1s"},
     "models --fault kill, slow-link only: --fault stop applies to real"),
    ({"fault": "raise:rank=1,at=4"}, "--fault raise applies to real runs"),
    ({"fault": "delay-messages:p=0.1,ms=5"}, "--fault delay-messages applies to real runs"),
    ({"on_failure": "stop"}, "killed worker under --on-failure continue only"),
    ({"protocol": "prague", "fault": "kill:rank=0,at=1s"}, "rank 0 hosts prague's central"),
    ({"protocol": "ps", "fault": "kill:rank=0,at=1s"}, "rank 0 hosts ps's central"),
    ({"protocol": "allreduce"}, "allreduce cannot go on without a worker"),
    ({"protocol": "dpsgd"}, "dpsgd cannot go on without a worker"),
    ({"protocol": "prague", "schedule": "static"}, "--schedule static has every worker"),
    ({"protocol": "adpsgd", "adpsgd_mode": "naive"}, "--adpsgd-mode naive is for showing"),
    ({"protocol": "hop", "topology": "directed-ring"}, "would be not strongly connected"),
])
def test_what_real_runs_refuse_or_the_simulator_does_not_model_is_refused(options, message,
                                                                           tmp_path):
    with pytest.raises(ConfigError, match=message):
        simulate(config(tmp_path, **{"protocol": "hop", **options}), QUIET)
