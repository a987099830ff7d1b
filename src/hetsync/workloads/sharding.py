"""Disjoint per-worker shards of a training set, reshuffled every epoch from a seed."""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["Shard"]


class Shard:
    """Worker `rank`'s share of `n` samples: a seeded permutation dealt out round-robin.

    The shards of ranks 0..world-1 are disjoint and together cover every sample. Each epoch
    visits the shard in a new order drawn from (seed, rank, epoch), so runs are reproducible.
    """

    def __init__(self, n: int, rank: int, world: int, seed: int) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside 0..{world - 1}")
        if n < world:
            raise ValueError(f"{n} samples cannot be split among {world} workers")
        self.rank, self.world, self.seed = rank, world, seed
        permutation = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.indices = permutation[rank::world].clone()

    def __len__(self) -> int:
        return len(self.indices)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """Positions into this shard (0..len-1) in the order of `epoch`."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 7919 + epoch)
        return torch.randperm(len(self.indices), generator=generator)

    def batches(
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless minibatches of this shard of (x, y); the last partial batch of an epoch
        is dropped so that every step costs the same."""
        x, y = x[self.indices], y[self.indices]
        per_epoch = max(1, len(self.indices) // batch_size)
        epoch = 0
        while True:
            order = self.epoch_order(epoch)
            for b in range(per_epoch):
                take = order[b * batch_size : (b + 1) * batch_size]
                yield x[take], y[take]
            epoch += 1
