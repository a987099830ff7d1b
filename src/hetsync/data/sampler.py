"""Data dealt out as workers ask: a faster worker takes more of each epoch.

With `DistributedSampler` each worker owns a fixed 1/n of the data, so an N-epoch run ends
when the slowest worker has finished its shard, whatever the protocol. `DynamicSampler` (for
a `DataLoader`) and `deal` (for scripts that slice a stream by hand) deal each epoch from a
counter in the run's control store instead: every item is used once an epoch, and a worker
that finds the epoch used up ends it. That pays under the protocols whose workers may stop
after different numbers of iterations (`Protocol.ends_alone`: AD-PSGD, Hop, Prague's Group
Generator, the asynchronous parameter server); under the lock-step ones (All-Reduce, DDP,
D-PSGD, ...) a worker that ran out would leave the others waiting in a collective, so they
get `DistributedSampler`'s fixed equal shares (docs/protocols.md, "Epochs"). A worker whose
environment has `HETSYNC_SAMPLER=static` gets equal shares under any protocol: a script's
static half of an A/B, unedited (the `epochs-lm` bench suite's).

A worker the run loses (`--on-failure continue`) may hold a claim it had not finished: where
workers may be lost, each records its claim in hand beside the counter (`<key>/open/<rank>`),
and a worker that finds the epoch used up takes over a lost rank's recorded claim (an atomic
`compare_set`, so one taker only) and deals it to itself whole: every item of the epoch is
dealt once among the survivors' claims and the lost worker's finished ones, the items of
the open claim it had already taken (up to a claim less one) taken again. A claim is lost
with its worker only where the worker died between the claim's `add` and its record (one
store round trip), or where the others had ended the epoch before the loss was declared.
The run's summary.json counts the items dealt again (`redealt_items`).

A checkpoint keeps `DynamicSampler.state_dict()`: the pass, the rest of the claim in hand and
the epoch's counter. A resume takes that claim first and raises the counter to the furthest
of the workers' checkpoints, so nothing is dealt twice; what a worker drew after its own
checkpoint where another's is later (its model rolled back) is skipped. `deal()`'s passes
(`Deal`) have the same `state_dict()` and `load_state_dict()`.

A counter's key names the sampler (by default the order in which the script built it, the
same on every worker), the epoch, how many times the sampler was iterated within it (a loop
that never calls `set_epoch` still deals each pass afresh) and torchrun's restart count; a
run of hetsync's launcher, resumed too, has a store of its own.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from hetsync.data.dealing import (
    ENV_SAMPLER,
    REDEALT_KEY,
    checked_epoch_size,
    claimed,
    equal_share,
)
from hetsync.errors import ConfigError
from hetsync.protocols.registry import get_protocol
from hetsync.transport.lost_workers import LostWorkers
from hetsync.transport.runtime import Runtime, current_runtime

__all__ = ["DEFAULT_CHUNK", "Deal", "DynamicSampler", "deal"]

#: Items a claim takes where no batch size is given: a common DataLoader batch.
DEFAULT_CHUNK = 32
_BUILT = itertools.count()  # samplers built in this process: each one's default name
#: deal()'s passes over each (name, epoch) by this process's worker (a test's workers share one)
_DEAL_PASSES: dict[tuple[str, int, int], int] = {}


@dataclass
class _Pass:
    """Where a worker is in one pass over an epoch: what a checkpoint keeps of it."""

    key: str
    taken: int = 0
    """Equal shares: the items of the share taken so far."""
    in_hand: range = range(0)
    """Dealt dynamically: the rest of the claim being taken (on resume: to take first)."""


class _Dealer:
    """One worker's side of the dealing: its world, and the store it claims from."""

    def __init__(self, what: str, num_replicas: int | None, rank: int | None,
                 equal_shares: bool | None, store: dist.Store | None,
                 lost: LostWorkers | None = None) -> None:
        self.what = what
        runtime = _runtime()
        self.lost = lost
        if store is not None:
            if num_replicas is None or rank is None:
                raise ConfigError(f"{what}: a store given by hand needs num_replicas and rank")
            self.world, self.rank, self.store = num_replicas, rank, store
            self.equal = bool(equal_shares)
        elif runtime is not None:
            for given, own, name in ((num_replicas, runtime.world_size, "num_replicas"),
                                     (rank, runtime.rank, "rank")):
                if given is not None and given != own:
                    raise ConfigError(f"{what}: {name}={given} disagrees with the run's "
                                      f"({own}): leave it out, the run says it")
            self.world, self.rank, self.store = runtime.world_size, runtime.rank, runtime.store
            self.lost = runtime.lost
            self.equal = (_static_by_env(what) or not get_protocol(
                runtime.config.protocol).ends_alone(runtime.config)
                if equal_shares is None else equal_shares)
        elif (num_replicas or 1) == 1 and not rank:
            self.world, self.rank, self.store, self.equal = 1, 0, None, True
        else:
            raise ConfigError(f"{what}: num_replicas={num_replicas}, rank={rank} outside a run: "
                              "call hetsync.init() first (or give the store to deal from)")
        if not 0 <= self.rank < self.world:
            raise ConfigError(f"{what}: rank {self.rank} is outside 0..{self.world - 1}")
        self.pid = os.getpid()

    def items(self, order: Sequence[int], chunk: int, drop_last: bool, at: _Pass,
              tally: dict[str, int]) -> Iterator[int]:
        """This worker's items of an epoch in `order`: its equal share, or what it claims
        under `at.key`, going on from where `at` says (a resumed pass). `tally` counts the
        items it was dealt (`dealt`) and those of a claim its consumer stopped taking before
        the end (`unused`: a loop cut short; a prefetching DataLoader's pending batches are
        not seen here); `at` follows the items taken."""
        size = len(order)
        if self.equal or self.world == 1:
            share = equal_share(size, self.world, self.rank, drop_last)[at.taken:]
            tally["dealt"] += len(share)
            for position in share:
                at.taken += 1
                yield order[position]
            return
        if os.getpid() != self.pid:
            raise RuntimeError(f"{self.what}: iterated in a forked process (a DataLoader "
                               "worker?): its store client belongs to the process that made it; "
                               "give the sampler to DataLoader(sampler=...), which iterates it "
                               "in the main process")
        size = checked_epoch_size(self.what, size, None, chunk, drop_last)
        key, mine = at.key, f"{at.key}/open/{self.rank}"
        resumed, at.in_hand = at.in_hand, range(0)
        while taken := (resumed or claimed(self.store.add(key, chunk), chunk, size)
                        or self._take_over(key, tally)):
            resumed = range(0)
            if self.lost is not None:  # in hand: another takes it if I am lost
                self.store.set(mine, f"{taken.start}:{taken.stop}")
            tally["dealt"] += len(taken)
            left = len(taken)
            try:
                for position in taken:
                    left -= 1
                    at.in_hand = range(position + 1, taken.stop)
                    yield order[position]
            finally:
                tally["unused"] += left
        if self.lost is not None:
            self.store.set(mine, "")  # none in hand: the epoch ended here

    def _take_over(self, key: str, tally: dict[str, int]) -> range:
        """A lost rank's claim in hand, now this worker's (empty if there is none): the
        record swapped for this rank's mark in one `compare_set`, so that one worker takes
        it."""
        if self.lost is None:
            return range(0)
        for rank in sorted(self.lost.refresh() - {self.rank}):
            theirs = f"{key}/open/{rank}"
            if not self.store.check([theirs]):
                continue  # lost before its first claim of the epoch
            record = self.store.get(theirs).decode()
            if ":" not in record:
                continue  # it had ended the epoch, or another worker took its claim
            mark = f"taken by {self.rank}"
            if self.store.compare_set(theirs, record, mark).decode() == mark:
                start, stop = map(int, record.split(":"))
                tally["redealt"] += stop - start
                self.store.add(REDEALT_KEY, stop - start)  # the run's count, for its summary
                return range(start, stop)
        return range(0)


class _Tallied:
    """What a worker was dealt: `_tally`'s counts, as read-only figures."""

    _tally: dict[str, int]

    @property
    def dealt(self) -> int:
        return self._tally["dealt"]

    @property
    def unused(self) -> int:
        return self._tally["unused"]

    @property
    def redealt(self) -> int:
        """Items of lost workers' unfinished claims dealt to this one (counted in `dealt`)."""
        return self._tally["redealt"]


class DynamicSampler(_Tallied, Sampler[int]):
    """`DistributedSampler`'s drop-in that deals each epoch out as workers ask.

    Args (as `DistributedSampler`'s): `dataset`; `num_replicas`, `rank` (the run's; given by
    hand they must agree with it); `shuffle` (each epoch's order a permutation drawn from
    `seed` and the epoch, the same on every worker); `drop_last` (dynamic: only whole claims
    are dealt, so with a claim of whole batches no worker gets a partial batch; equal
    shares: `DistributedSampler`'s).
    Keywords: `batch_size`, the DataLoader's (a claim is then `chunk` = one batch, and a
    batch larger than the data fails); `chunk`, items per claim (default one batch, or
    `DEFAULT_CHUNK`): a slow worker's last claim is what the others may wait for at the end,
    and each claim costs one store round trip; `name`, the counter's (default: the order of
    construction); `equal_shares` (default: from the run's protocol, see the module);
    `store`, to deal from a store of one's own (then `num_replicas` and `rank` too), and
    `lost`, the ranks lost from its run (in a run, the run's): their unfinished claims are
    dealt again (see the module).

    `len()` is the equal share, ceil(len(dataset) / num_replicas): under dynamic dealing a
    worker's epoch may be longer or shorter (a schedule sized from `len(loader)`, such as
    OneCycleLR's, must allow for more steps); `dealt` and `unused` count, over the epochs,
    the items this worker was dealt and those of a claim left untaken when its loop stopped
    mid-epoch. A `DataLoader` with `num_workers > 0` iterates the sampler in its main process
    (the store's client stays there) and prefetches `prefetch_factor x num_workers` batches
    ahead: claimed, and lost to the epoch if the loop stops before they are taken.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 batch_size: int | None = None, chunk: int | None = None,
                 name: str | None = None, equal_shares: bool | None = None,
                 store: dist.Store | None = None, lost: LostWorkers | None = None) -> None:
        self.dataset, self.shuffle, self.seed, self.drop_last = dataset, shuffle, seed, drop_last
        self.chunk = chunk if chunk is not None else batch_size or DEFAULT_CHUNK
        self.name = name if name is not None else f"sampler{next(_BUILT)}"
        self._dealer = _Dealer("DynamicSampler", num_replicas, rank, equal_shares, store, lost)
        self.num_replicas, self.rank = self._dealer.world, self._dealer.rank
        self.equal_shares = self._dealer.equal
        checked_epoch_size("DynamicSampler", len(dataset), batch_size, self.chunk, drop_last)
        self.epoch = 0
        self._passes = 0  # iterations since the last set_epoch
        self._pass: _Pass | None = None  # the latest, for state_dict()
        self._resumed: _Pass | None = None  # load_state_dict()'s, for the next __iter__
        self._tally = {"dealt": 0, "unused": 0, "redealt": 0}

    def set_epoch(self, epoch: int) -> None:
        """Deal epoch `epoch` next (its order, and its counter)."""
        self.epoch, self._passes = epoch, 0

    def __len__(self) -> int:
        size = len(self.dataset)  # type: ignore[arg-type]
        if self.drop_last and not self.equal_shares:
            size = size // self.chunk * self.chunk
        if self.drop_last and self.equal_shares:
            return size // self.num_replicas
        return -(-size // self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        size = len(self.dataset)  # type: ignore[arg-type]
        order = (torch.randperm(size, generator=torch.Generator().manual_seed(
            self.seed + self.epoch)).tolist() if self.shuffle else range(size))
        key = _key(self.name, self.epoch, self._passes)
        self._passes += 1
        self._pass = (self._resumed if self._resumed is not None and self._resumed.key == key
                      else _Pass(key))
        self._resumed = None
        return self._dealer.items(order, self.chunk, self.drop_last, self._pass, self._tally)

    def state_dict(self) -> dict[str, Any]:
        """How far this worker's latest pass was dealt, for a checkpoint: its epoch and pass,
        the items it took of its equal share or the rest of the claim in hand, and how far
        every worker had claimed the epoch (`dealt`, the counter's value now)."""
        at = self._pass
        dealt = (self._dealer.store.add(at.key, 0)
                 if at is not None and not self.equal_shares and self._dealer.store else None)
        return {"epoch": self.epoch, "passes": self._passes, "in_pass": at is not None
                and at.key == _key(self.name, self.epoch, self._passes - 1),
                "taken": at.taken if at else 0,
                "in_hand": [at.in_hand.start, at.in_hand.stop] if at else [0, 0],
                "dealt": dealt}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a checkpoint's `state_dict()`: the next iteration resumes its pass (the
        claim in hand first), and the epoch's counter is raised to the checkpoint's `dealt`
        (every worker's resume raises it to the furthest of theirs, in `compare_set`s, before
        any claims: load it before the run's first collective, as `hetsync train` does)."""
        self.epoch, self._passes = state["epoch"], state["passes"]
        if not state["in_pass"]:
            return
        self._passes -= 1
        key = _key(self.name, self.epoch, self._passes)
        self._resumed = _Pass(key, state["taken"], range(*state["in_hand"]))
        if state["dealt"] is not None and self._dealer.store is not None:
            _raise_to(self._dealer.store, key, state["dealt"])


def deal(batches: int | Sequence[int], epoch: int = 0, *, shuffle: bool = False,
         seed: int = 0, chunk: int = 1, name: str = "deal", equal_shares: bool | None = None,
         num_replicas: int | None = None, rank: int | None = None,
         store: dist.Store | None = None, lost: LostWorkers | None = None) -> Deal:
    """This worker's batches of `epoch`, dealt as `DynamicSampler` deals samples, for a script
    that slices its own stream: `for i in deal(range(0, len(data) - 1, bptt), epoch=e):`
    deals the range's items (the batches' offsets), `deal(n)` the batch numbers 0..n-1.

    In their order (`shuffle` draws a permutation from `seed` and `epoch`), `chunk` batches a
    claim; under a lock-step protocol each worker's equal share, a contiguous run of
    ceil(len / n) (the last padded from the start), so that a carried state (an RNN's hidden
    state) meets consecutive batches. Each call of the same `name` and `epoch` deals a new
    pass. The other arguments are `DynamicSampler`'s.
    """
    dealer = _Dealer("deal", num_replicas, rank, equal_shares, store, lost)
    items = range(batches) if isinstance(batches, int) else batches
    checked_epoch_size("deal", len(items), None, chunk, False)
    if shuffle:
        items = [items[i] for i in torch.randperm(
            len(items), generator=torch.Generator().manual_seed(seed + epoch)).tolist()]
    return Deal(dealer, items, name, epoch, chunk)


class Deal(_Tallied, Iterator[int]):
    """One pass of `deal()` over an epoch: an iterator of this worker's batches, which deals
    nothing before its first `next()`, so that a resume may load its `state_dict()` first.

    `dealt`, `unused` and `redealt` count as `DynamicSampler`'s do, for this pass."""

    def __init__(self, dealer: _Dealer, items: Sequence[int], name: str, epoch: int,
                 chunk: int) -> None:
        self._dealer, self._items, self.name, self.epoch = dealer, items, name, epoch
        self._chunk = chunk
        self.passes = _DEAL_PASSES.get((name, epoch, dealer.rank), 0)
        _DEAL_PASSES[(name, epoch, dealer.rank)] = self.passes + 1
        self._pass = _Pass(_key(name, epoch, self.passes))
        self._dealing: Iterator[int] | None = None
        self._tally = {"dealt": 0, "unused": 0, "redealt": 0}

    def __iter__(self) -> Deal:
        return self

    def __next__(self) -> int:
        if self._dealing is None:
            self._dealing = self._deal()
        return next(self._dealing)

    def close(self) -> None:
        """Stop taking: the rest of the claim in hand counts as `unused`."""
        if self._dealing is not None:
            self._dealing.close()  # type: ignore[attr-defined]

    def _deal(self) -> Iterator[int]:
        dealer, at = self._dealer, self._pass
        if not (dealer.equal or dealer.world == 1):
            yield from dealer.items(self._items, self._chunk, False, at, self._tally)
            return
        size = len(self._items)
        share = -(-size // dealer.world)
        self._tally["dealt"] += share - at.taken
        for j in range(at.taken, share):
            at.taken += 1
            yield self._items[(dealer.rank * share + j) % size]

    def state_dict(self) -> dict[str, Any]:
        """How far this pass was dealt, for a checkpoint: as `DynamicSampler.state_dict()`,
        the items taken of the equal share or the rest of the claim in hand, and how far every
        worker had claimed the epoch (`dealt`)."""
        at, store = self._pass, self._dealer.store
        dynamic = not (self._dealer.equal or self._dealer.world == 1) and store is not None
        return {"name": self.name, "epoch": self.epoch, "passes": self.passes,
                "started": self._dealing is not None, "taken": at.taken,
                "in_hand": [at.in_hand.start, at.in_hand.stop],
                "dealt": store.add(at.key, 0) if dynamic else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a checkpoint's `state_dict()` of the same epoch: the claim in hand
        first, the epoch's counter raised to the checkpoint's (as
        `DynamicSampler.load_state_dict`: before the run's first collective)."""
        if self._dealing is not None:
            raise RuntimeError("deal: load_state_dict() before the first batch is taken")
        if (state["name"], state["epoch"]) != (self.name, self.epoch):
            raise ConfigError(f"deal: the checkpoint is of {state['name']!r} epoch "
                              f"{state['epoch']}, this deal of {self.name!r} epoch {self.epoch}")
        if not state["started"]:
            return  # the pass had not begun: dealt whole
        self.passes = state["passes"]
        counts = (self.name, self.epoch, self._dealer.rank)
        _DEAL_PASSES[counts] = max(_DEAL_PASSES.get(counts, 0), self.passes + 1)
        key = _key(self.name, self.epoch, self.passes)
        self._pass = _Pass(key, state["taken"], range(*state["in_hand"]))
        if state["dealt"] is not None and self._dealer.store is not None:
            _raise_to(self._dealer.store, key, state["dealt"])


def _raise_to(store: dist.Store, key: str, value: int) -> None:
    """Set the counter `key` to `value` unless it is there or past it already."""
    while (now := store.add(key, 0)) < value:
        if store.compare_set(key, str(now), str(value)).decode() == str(value):
            return


def _key(name: str, epoch: int, passes: int) -> str:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"deal/{name}/{restart}/{epoch}/{passes}"


def _static_by_env(what: str) -> bool:
    """Whether `HETSYNC_SAMPLER` asks for equal shares whatever the protocol."""
    value = os.environ.get(ENV_SAMPLER, "dynamic")
    if value not in ("static", "dynamic"):
        raise ConfigError(f"{what}: {ENV_SAMPLER}={value!r} must be static or dynamic")
    return value == "static"


def _runtime() -> Runtime | None:
    """The run `hetsync.init()` joined, or None outside one."""
    try:
        return current_runtime()
    except RuntimeError:
        return None
