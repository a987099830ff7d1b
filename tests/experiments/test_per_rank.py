"""experiments/per_rank.py: a rank's figures from its rows, second by second (what a lease's
`OUT/per-rank.txt` is made of)."""

from __future__ import annotations

import importlib
import json
import sys

import pytest


@pytest.fixture(scope="module")
def per_rank(experiments_on_path):
    return importlib.import_module("per_rank")


ROWS = [  # a Hop rank held up in its second second by an in-neighbour's update
    {"t": 0.2, "compute_s": 0.050, "sync_wait_s": 0.0},
    {"t": 0.9, "compute_s": 0.070, "sync_wait_s": 0.001,
     "cpu_s": {"training": 0.81, "hop-updates": 0.045, "other": 0.018}},
    {"t": 1.3, "compute_s": 0.060, "sync_wait_s": 0.120, "wait_update_from_3_s": 0.115,
     "wait_token_from_3_s": 0.115, "skipped": 2},
    {"t": 1.8, "compute_s": 0.080, "sync_wait_s": 0.040, "wait_send_to_3_s": 0.030},
]


def test_a_rank_s_figures_second_by_second(per_rank):
    figures = per_rank.rank_figures(ROWS)
    assert figures["iterations"] == 4 and figures["skipped"] == 2
    assert figures["compute_ms_median"] == 65.0
    assert figures["sync_wait_s"] == 0.161
    assert figures["per_second_ms"] == [60, 70]  # each second's median compute step
    assert figures["per_second_sync_ms"] == [1, 160]
    assert list(figures["waited_s"]) == ["update_from_3", "token_from_3", "send_to_3"]
    # 0.81 s of the training thread's CPU and 0.063 s of the others' in its first 0.9 s
    assert figures["per_second_cpu_percent"] == [(90, 7), None]


def test_only_the_ranks_that_waited_are_shown_second_by_second(per_rank, tmp_path, capsys,
                                                                monkeypatch):
    workers = tmp_path / "runs" / "rank_3_at_share_0.25_resnet" / "hop" / "r0" / "workers"
    workers.mkdir(parents=True)
    (workers / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    idle = [{"t": 0.5, "compute_s": 0.05, "sync_wait_s": 0.0}]
    (workers / "rank1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in idle))
    monkeypatch.setattr(sys, "argv", ["per_rank.py", str(tmp_path)])
    per_rank.main()
    out = capsys.readouterr().out
    waits = out.split("per second (sync wait, ms), the ranks that waited:")[1]
    assert "rank0" in waits and "160" in waits and "rank1" not in waits
    assert "update_from_3 115 ms" in out
    training = out.split("per second (CPU of the training thread, % of a core):")[1]
    assert training.splitlines()[1].split() == ["rank0", "90", "-"]
    assert training.splitlines()[2].split() == ["rank1", "-"]
    others = out.split("per second (CPU of the other threads, % of a core):")[1]
    assert others.splitlines()[1].split() == ["rank0", "7", "-"]
