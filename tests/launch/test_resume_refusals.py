"""`train --resume DIR` refuses, in one line, what it cannot go on with (no processes)."""

from __future__ import annotations

import pytest
import torch

from hetsync.cli import main
from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch.checkpoint import checkpoint_path, resume_config
from hetsync.launch.launcher import RunLock, run


@pytest.fixture
def stopped_run(tmp_path):
    """A run directory of 2 workers, checkpointed, with rank 0's checkpoint only."""
    out = tmp_path / "run"
    out.mkdir()
    config = RunConfig(workload="digits", workers=2, checkpoint_every=0.5, max_iterations=50,
                       out=out).resolved()
    (out / "config.json").write_text(config.to_json() + "\n")
    checkpoint_path(out, 0).parent.mkdir()
    torch.save({"iteration": 7, "t": 1.5}, checkpoint_path(out, 0))
    return out


def _refusal(capsys, *argv: str) -> str:
    assert main(["train", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_a_rank_without_a_checkpoint_is_refused(stopped_run, capsys):
    line = _refusal(capsys, "--resume", str(stopped_run))
    assert "no checkpoint of rank 1" in line


def test_a_run_in_progress_is_refused(stopped_run, capsys):
    with RunLock(stopped_run):
        line = _refusal(capsys, "--resume", str(stopped_run))
    assert "in use by a run in progress" in line


def test_a_changed_option_is_refused_but_the_limits_may_grow(stopped_run, capsys):
    line = _refusal(capsys, "--resume", str(stopped_run), "--lr", "0.5")
    assert "--lr 0.5 differs from the run's" in line
    assert "--max-time, --max-iterations" in line
    config = resume_config(stopped_run, {"max_iterations": 80, "workers": 2})
    assert config.max_iterations == 80 and config.fault == "none"


def test_a_run_without_checkpoints_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text(RunConfig(workload="digits").to_json())
    assert "was not checkpointed" in _refusal(capsys, "--resume", str(tmp_path))
    assert "not a run directory" in _refusal(capsys, "--resume", str(tmp_path / "nothing"))


def test_checkpoints_are_for_the_builtin_loop():
    with pytest.raises(ConfigError, match="a script checkpoints itself"):
        run(RunConfig(script=[__file__], workload="script", checkpoint_every=1.0))
