"""How an epoch's items are dealt among workers: the arithmetic, no I/O.

An epoch is a fixed order of positions 0..size-1 (`DynamicSampler` maps them to a seeded
permutation of the dataset). Two ways to deal it:

- dynamic: workers claim `chunk` positions at a time from one counter per epoch (an atomic
  add in the run's store returns the claim's end: `claimed`), so a worker that asks more
  often gets more, and every position is dealt exactly once;
- equal (`equal_share`): each worker its fixed 1/n, padded as `DistributedSampler` pads, for
  protocols that need every worker in every step (a worker that ran out while the others
  still step would leave them waiting).
"""

from __future__ import annotations

from hetsync.errors import ConfigError

__all__ = ["ENV_SAMPLER", "REDEALT_KEY", "checked_epoch_size", "claimed", "equal_share"]

#: The run's store key that counts the items of lost workers' claims dealt again (the
#: launcher puts it in summary.json as `redealt_items`).
REDEALT_KEY = "deal/redealt"
#: `static`: every sampler and `deal()` of a worker deals equal shares whatever the protocol
#: (the static half of an A/B of a script, without editing it); `dynamic` or unset: the
#: protocol decides.
ENV_SAMPLER = "HETSYNC_SAMPLER"


def checked_epoch_size(what: str, size: int, batch_size: int | None, chunk: int,
                       drop_last: bool) -> int:
    """The positions an epoch deals dynamically: all `size`, or with `drop_last` only whole
    chunks (so that, with a chunk of whole batches, no worker gets a partial batch). Bad
    input fails in one line naming `what` (the sampler or `deal`)."""
    if size <= 0:
        raise ConfigError(f"{what}: the data is empty (length {size}): nothing to deal")
    if batch_size is not None and batch_size > size:
        raise ConfigError(f"{what}: batch_size {batch_size} is larger than the data "
                          f"({size} items)")
    if chunk < 1:
        raise ConfigError(f"{what}: a claim must take at least 1 item (got {chunk})")
    if drop_last:
        if size < chunk:
            raise ConfigError(f"{what}: drop_last with a claim of {chunk} items leaves none "
                              f"of {size}")
        return size // chunk * chunk
    return size


def claimed(end: int, chunk: int, size: int) -> range:
    """The positions a claim took, given the counter's value after it added `chunk`
    (`store.add(key, chunk)`): empty once the epoch's `size` positions are dealt."""
    return range(max(0, end - chunk), min(end, size))


def equal_share(size: int, workers: int, rank: int, drop_last: bool) -> list[int]:
    """Worker `rank`'s fixed share of `size` positions, as `DistributedSampler` deals them:
    every `workers`-th one from `rank`; all shares have one length, the positions dropped
    past a multiple of `workers` (`drop_last`) or the first ones repeated to fill the last
    round."""
    if drop_last and size < workers:
        raise ConfigError(f"drop_last: {size} items leave none for each of {workers} workers")
    total = size // workers * workers if drop_last else -(-size // workers) * workers
    return [position % size for position in range(rank, total, workers)]
