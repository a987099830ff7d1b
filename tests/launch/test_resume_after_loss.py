"""`train --resume` of a run that lost workers (`--on-failure continue`): the lost stay lost."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hetsync.cli import main
from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch.checkpoint import checkpoint_path, lost_before, prepare_resume, resume_config
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl


def _lost_run(out, protocol: str = "hop", lost_checkpoint: bool = True):
    """Ranks 0 and 1 checkpointed at 195-196 s; rank 2 was lost at 16 s, with a checkpoint at
    15 s or none; evaluations every 10 s up to 200 s."""
    out.mkdir()
    config = RunConfig(protocol=protocol, workload="svm", workers=3, checkpoint_every=5.0,
                       on_failure="continue", out=out, max_time=600.0).resolved()
    (out / "config.json").write_text(config.to_json() + "\n")
    checkpoint_path(out, 0).parent.mkdir()
    saved = [(195.0, 3900), (196.0, 3920)] + ([(15.0, 300)] if lost_checkpoint else [])
    for rank, (t, iteration) in enumerate(saved):
        torch.save({"t": t, "iteration": iteration}, checkpoint_path(out, rank))
    (out / "eval.jsonl").write_text("".join(json.dumps({"t": 10.0 * i, "loss": 1.0}) + "\n"
                                            for i in range(21)))
    (out / "summary.json").write_text(json.dumps(
        {"lost_workers": [{"rank": 2, "reason": "was killed by signal SIGKILL", "at_s": 16.0}]}))
    return config


@pytest.mark.parametrize("lost_checkpoint", [True, False])
def test_only_the_survivors_checkpoints_decide_where_the_resume_goes_on(tmp_path,
                                                                        lost_checkpoint):
    out = tmp_path / "run"
    config = _lost_run(out, lost_checkpoint=lost_checkpoint)
    lost = lost_before(out, config)
    assert [w["rank"] for w in lost] == [2]
    resume = prepare_resume(out, config, frozenset({2}))
    assert resume.at_s == 196.0
    assert resume.iterations == [3900, 3920, None]
    assert resume.base == 3900  # --max-iterations counts from it: rank 2's 300 is not a base
    times = [row["t"] for row in read_jsonl(out / "eval.jsonl")]
    assert times == [10.0 * i for i in range(20)]  # up to the survivors' earliest checkpoint


def test_a_protocol_that_needs_the_lost_rank_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    _lost_run(out, protocol="prague")
    summary = {"lost_workers": [{"rank": 0, "reason": "was killed", "at_s": 16.0}]}
    (out / "summary.json").write_text(json.dumps(summary))
    assert main(["train", "--resume", str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "the run lost rank 0, and prague cannot go on without rank 0" in line


_RUN = dict(workload="svm", workers=4, step_time=10.0, hang_timeout=2.0, stop_at_target=False,
            quiet=True, on_failure="continue", checkpoint_every=1.5)


@pytest.mark.integration
@pytest.mark.parametrize(("protocol", "options"), [
    ("adpsgd", {}),
    pytest.param("hop", {"backup": 1}, marks=pytest.mark.slow),
    pytest.param("prague", {}, marks=pytest.mark.slow),
    pytest.param("ps", {"ps_mode": "async"}, marks=pytest.mark.slow),  # no broadcast to rank 3
])
def test_a_run_that_lost_a_worker_resumes_with_the_survivors(protocol, options, tmp_path):
    """Rank 3 is killed before its first checkpoint; the run goes on without it, and its
    resume too: rank 3 is not brought back, and nothing after the checkpoints is dropped.
    The kill comes 1.2 s before the first checkpoint: the launcher sends it, late on a loaded
    machine."""
    out = tmp_path / protocol
    first = run(RunConfig(protocol=protocol, out=out, fault="kill:rank=3,at=0.3s", max_time=3.5,
                          **_RUN, **options)).summary
    assert [w["rank"] for w in first["lost_workers"]] == [3]
    assert not checkpoint_path(out, 3).exists()
    rank3 = out / "workers" / "rank3.jsonl"
    rows3 = rank3.read_text() if rank3.exists() else None  # killed before its first flush?
    saved = [torch.load(checkpoint_path(out, r), weights_only=False) for r in range(3)]
    evaluated = [row["t"] for row in read_jsonl(out / "eval.jsonl")]

    summary = run(resume_config(out, {"max_time": 6.0}), resume=True).summary
    assert summary["stop_reason"] == "max_time"
    assert summary["lost_workers"] == first["lost_workers"]
    assert summary["resumed_from"][0]["iterations"] == [s["iteration"] for s in saved] + [None]
    assert (rank3.read_text() if rank3.exists() else None) == rows3  # it did not come back
    for rank in range(3):
        assert summary["iterations"][rank] > saved[rank]["iteration"] + 20
    rows = read_jsonl(out / "eval.jsonl")
    earliest = min(s["t"] for s in saved)
    assert [r["t"] for r in rows if r["t"] <= earliest] == [t for t in evaluated if t <= earliest]
    final = [row for row in rows if row["model"] == "final"]
    assert final and final[0]["ranks"] == [0, 1, 2]


def test_a_resume_with_nothing_left_to_run_is_refused_and_trims_nothing(tmp_path):
    """Checkpoints past --max-time (or --max-iterations): refused before the logs are cut."""
    out = tmp_path / "run"
    config = _lost_run(out, lost_checkpoint=True)
    evaluations = (out / "eval.jsonl").read_text()
    for limits, match in (({"max_time": 100.0}, "at 196.0 s of run time, past --max-time 100"),
                          ({"max_iterations": 3000}, "at iteration 3900, past --max-iterations")):
        with pytest.raises(ConfigError, match=match):
            prepare_resume(out, dataclasses.replace(config, **limits), frozenset({2}))
    assert (out / "eval.jsonl").read_text() == evaluations


@pytest.mark.parametrize(("content", "match"), [
    (b"", "is empty"), (bytes(range(256)), "is damaged"), (None, "is not a file"),
    ({"hello": 1}, "is not a hetsync checkpoint")])
def test_a_checkpoint_that_is_not_one_is_named_in_one_line(tmp_path, content, match):
    out = tmp_path / "run"
    config = _lost_run(out, lost_checkpoint=True)
    path = checkpoint_path(out, 1)
    path.unlink()
    if content is None:
        path.mkdir()
    elif isinstance(content, dict):
        torch.save(content, path)
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"checkpoints/rank1.pt {match}") as error:
        prepare_resume(out, config, frozenset({2}))
    assert "\n" not in str(error.value)
