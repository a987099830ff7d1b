from __future__ import annotations

import itertools

import pytest
import torch

from hetsync.workloads import Shard


def test_batches_go_on_from_a_position_with_the_same_sequence():
    x, y = torch.arange(100).float().unsqueeze(1), torch.arange(100)
    shard = Shard(100, 1, 3, seed=2)  # 33 samples: 4 batches of 8 an epoch
    whole = [b for _, b in itertools.islice(shard.batches(x, y, 8), 11)]
    assert shard.position(6, 8) == (1, 2)
    resumed = [b for _, b in itertools.islice(shard.batches(x, y, 8, *shard.position(6, 8)), 5)]
    assert all(torch.equal(a, b) for a, b in zip(whole[6:], resumed, strict=True))
    with pytest.raises(ValueError, match="no batch 4 of epoch 0"):
        next(shard.batches(x, y, 8, 0, 4))


def test_a_bad_position_is_refused_when_asked_for_not_at_the_first_batch():
    x, y = torch.arange(100).float().unsqueeze(1), torch.arange(100)
    local = Shard(100, 1, 3, seed=2).take(x, y)
    assert torch.equal(local.y, y[Shard(100, 1, 3, seed=2).indices])
    with pytest.raises(ValueError, match="no batch 0 of epoch -1"):
        local.batches(8, -1, 0)
