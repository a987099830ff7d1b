from __future__ import annotations

import json
import os

import torch
from torch import nn
from torch.utils.serialization import config as serialization_config

from hetsync.metrics.evaluator import average_states
from hetsync.metrics.worker_log import IterationLog, Snapshotter, snapshot_path


def test_iteration_log_writes_every_row(tmp_path):
    log = IterationLog(tmp_path, rank=2, flush_every=3600)
    for i in range(1, 6):
        log.append({"t": i * 0.1, "iteration": i, "loss": 1.0 / i})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "workers" / "rank2.jsonl").open()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5]


def test_snapshotter_fills_every_index_it_slept_through(tmp_path):
    model = nn.Linear(3, 1)
    snaps = Snapshotter(tmp_path, rank=0, every=1.0)
    snaps.maybe_snapshot(model, elapsed=0.5, iteration=1)  # index 0: right after iteration 1
    assert torch.load(snapshot_path(tmp_path, 0, 0))["iteration"] == 1
    snaps.maybe_snapshot(model, elapsed=0.7, iteration=2)  # nothing due
    assert not snapshot_path(tmp_path, 1, 0).exists()
    snaps.maybe_snapshot(model, elapsed=3.2, iteration=9)  # blocked across 1, 2 and 3
    for index in (1, 2, 3):
        saved = torch.load(snapshot_path(tmp_path, index, 0))
        assert saved["iteration"] == 9 and saved["t"] == 3.2
    snaps.maybe_snapshot(model, elapsed=3.9, iteration=10)
    assert not snapshot_path(tmp_path, 4, 0).exists()
    snaps.final(model, elapsed=4.5, iteration=11)
    assert torch.load(snapshot_path(tmp_path, "final", 0))["iteration"] == 11


def test_average_states_is_the_mean():
    states = [{"w": torch.full((2,), float(r)), "n": torch.tensor(r)} for r in range(4)]
    averaged = average_states(states)
    assert torch.equal(averaged["w"], torch.full((2,), 1.5))
    assert averaged["n"].dtype == torch.int64


def test_a_snapshot_loads_and_leaves_torch_save_s_checksum_as_it_was(tmp_path):
    # Snapshots skip the zip checksum (a third of the CPU of saving a 45 MB model); a
    # user's own torch.save in the same process still computes it.
    model = nn.Linear(300, 200)
    Snapshotter(tmp_path, rank=0, every=1.0).maybe_snapshot(model, elapsed=0.0, iteration=1)
    saved = torch.load(snapshot_path(tmp_path, 0, 0))
    assert torch.equal(saved["state"]["weight"], model.weight.detach())
    assert serialization_config.save.compute_crc32


def test_the_indexes_slept_through_exist_before_the_first_of_them(tmp_path, monkeypatch):
    """They are links of one file, made before it is renamed into place: an evaluator that
    drops the first index as soon as its set is complete cannot take the file from under
    the links (it would, were they made after)."""
    model = nn.Linear(3, 1)
    snaps = Snapshotter(tmp_path, rank=0, every=1.0)
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append([snapshot_path(tmp_path, i, 0).exists() for i in (0, 1, 2)])
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    snaps.maybe_snapshot(model, elapsed=2.5, iteration=4)
    assert seen[-1] == [False, True, True]
    assert all(snapshot_path(tmp_path, i, 0).exists() for i in (0, 1, 2))
