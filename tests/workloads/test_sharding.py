from __future__ import annotations

import pytest
import torch

from hetsync.workloads import Shard


@pytest.mark.parametrize(("n", "world"), [(100, 1), (100, 3), (1797, 8), (60000, 16)])
def test_shards_are_disjoint_and_complete(n, world):
    shards = [Shard(n, r, world, seed=3).indices for r in range(world)]
    everything = torch.cat(shards)
    assert len(everything) == n
    assert len(torch.unique(everything)) == n
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_epochs_reshuffle_reproducibly():
    shard = Shard(1000, 1, 4, seed=5)
    first, second = shard.epoch_order(0), shard.epoch_order(1)
    assert not torch.equal(first, second)
    assert torch.equal(first, Shard(1000, 1, 4, seed=5).epoch_order(0))
    assert sorted(first.tolist()) == list(range(len(shard)))


def test_batches_stay_inside_the_shard():
    n = 50
    x = torch.arange(n).float().unsqueeze(1)
    y = torch.arange(n)
    shard = Shard(n, 0, 2, seed=0)
    batches = shard.batches(x, y, batch_size=4)
    seen = torch.cat([next(batches)[1] for _ in range(12)])  # two epochs of 6 batches
    assert set(seen.tolist()) <= set(shard.indices.tolist())
    assert len(set(seen[:24].tolist())) == 24


def test_bad_shard_arguments():
    with pytest.raises(ValueError, match="outside"):
        Shard(10, 3, 3, seed=0)
    with pytest.raises(ValueError, match="cannot be split"):
        Shard(2, 0, 4, seed=0)
