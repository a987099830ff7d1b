"""The script decides when it ends: a plain loop that never reads `should_stop` and never
calls anything of hetsync at its end (tests/launch/scripts/plain_loop.py) ends its run
cleanly under every protocol, whether its loop runs out (the interpreter's exit closes the
run: no abort of gloo under a protocol's threads) or a stop the user asked for comes first
(the next `step()` ends the script: `hetsync.RunStopped`, exit status 0, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.errors import LOOP_ENDED
from hetsync.launch.launcher import run

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parents[1] / "launch" / "scripts" / "plain_loop.py"
SLOW = pytest.mark.slow
STEPS = 6

# The protocols whose threads aborted the interpreter's exit without close() (hop, ps,
# prague, adpsgd), and a lock-step one.
PROTOCOLS = [
    ("hop", {}),
    ("ps", {"ps_mode": "async"}),
    pytest.param("prague", {}, marks=SLOW),  # CI time: its threads are tested by the two above
    pytest.param("adpsgd", {}, marks=SLOW),
    pytest.param("allreduce", {}, marks=SLOW),
]


def _launch(tmp_path: Path, protocol: str, options: dict, steps: str, **limits: object) -> dict:
    out = tmp_path / "run"
    out.mkdir()
    summary = run(RunConfig(protocol=protocol, workers=2, script=[str(SCRIPT), str(out), steps],
                            out=out, quiet=True, device="cpu", hang_timeout=10.0, **options,
                            **limits)).summary
    assert not list((out / "logs").glob("rank*.log")), "a worker wrote a traceback"
    return summary


def test_a_launched_script_has_no_time_limit_it_did_not_ask_for():
    script = RunConfig(script=[str(SCRIPT), "out", "1"]).resolved()
    assert script.max_time is None and script.max_iterations is None
    assert RunConfig(workload="svm").resolved().max_time == RunConfig.DEFAULT_MAX_TIME


@pytest.mark.parametrize(("protocol", "options"), PROTOCOLS)
def test_a_loop_that_runs_out_ends_its_run_without_close(protocol, options, tmp_path):
    summary = _launch(tmp_path, protocol, options, str(STEPS))
    assert summary["stop_reason"].startswith(LOOP_ENDED)
    assert summary["iterations"] == [STEPS, STEPS]
    for rank in range(2):
        assert (tmp_path / "run" / f"after_rank{rank}.txt").is_file()


@pytest.mark.parametrize(("protocol", "options"), [
    ("allreduce", {}),
    pytest.param("hop", {}, marks=SLOW),  # CI time: the same step() ends the script
])
def test_a_stop_the_user_asked_for_ends_a_plain_loop_cleanly(protocol, options, tmp_path):
    summary = _launch(tmp_path, protocol, options, "forever", max_iterations=8)
    assert summary["stop_reason"] == "max_iterations"
    out = tmp_path / "run"
    for rank in range(2):  # what it wrote up to its last step is there; after the loop: none
        assert int((out / f"last_rank{rank}.txt").read_text()) == summary["iterations"][rank]
        assert not (out / f"after_rank{rank}.txt").exists()


def test_a_script_that_never_prepares_is_told_it_did_not_synchronise(tmp_path, capsys):
    script = Path(__file__).parents[1] / "launch" / "scripts" / "unprepared.py"
    run(RunConfig(workers=2, script=[str(script)], out=tmp_path / "run", quiet=True,
                  device="cpu"))
    said = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert said == ["hetsync: warning: worker ranks 0, 1 ended without calling "
                    "hetsync.prepare(model, optimizer): the script trained without "
                    "synchronising, and the run measured nothing"]
