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
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int, epoch: int = 0, batch: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless minibatches of this shard of (x, y), from batch `batch` of epoch `epoch`
        on (a resumed run goes on with the same sequence); the last partial batch of an epoch
        is dropped so that every step costs the same."""
        x, y = x[self.indices], y[self.indices]
        per_epoch = self.batches_per_epoch(batch_size)
        if not 0 <= batch < per_epoch or epoch < 0:
            raise ValueError(f"no batch {batch} of epoch {epoch} ({per_epoch} batches an epoch)")
        while True:
            order = self.epoch_order(epoch)
            for b in range(batch, per_epoch):
                take = order[b * batch_size : (b + 1) * batch_size]
                yield x[take], y[take]
            epoch, batch = epoch + 1, 0

    def batches_per_epoch(self, batch_size: int) -> int:
        return max(1, len(self.indices) // batch_size)

    def position(self, drawn: int, batch_size: int) -> tuple[int, int]:
        """(epoch, batch) of the next batch after `drawn` batches from the start."""
        return divmod(drawn, self.batches_per_epoch(batch_size))
