"""The dealing of `hetsync.data`: threads as workers over a real torch.distributed store."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hetsync
from hetsync.config import RunConfig
from hetsync.data import Deal, DynamicSampler, deal
from hetsync.data.dealing import ENV_SAMPLER, REDEALT_KEY
from hetsync.errors import ConfigError
from hetsync.protocols.registry import get_protocol
from hetsync.transport.lost_workers import LOST_KEY, LostWorkers

DATA = list(range(1000))


def _sampler(store: dist.Store, rank: int, world: int = 2, **options: object) -> DynamicSampler:
    return DynamicSampler(DATA, num_replicas=world, rank=rank, store=store, name="train",
                          **options)


def _fast_and_slow(fast: Iterable[int], slow: Iterable[int]) -> tuple[list[int], list[int]]:
    """What each of two workers took when the slow one stalls after its first item until the
    fast one has finished the epoch (a straggler, without timing)."""
    taken: dict[str, list[int]] = {"fast": [], "slow": []}
    started, finished = threading.Event(), threading.Event()

    def run_slow() -> None:
        for i, item in enumerate(slow):
            taken["slow"].append(item)
            if i == 0:
                started.set()
                finished.wait(10)

    thread = threading.Thread(target=run_slow)
    thread.start()
    assert started.wait(10)
    taken["fast"] = list(fast)
    finished.set()
    thread.join(10)
    return taken["fast"], taken["slow"]


@pytest.mark.parametrize("store", ["hash", "tcp"])
def test_a_fast_worker_takes_more_and_every_sample_is_dealt_once(store):
    if store == "hash":
        stores: list[dist.Store] = [dist.HashStore()] * 2
    else:
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        stores = [server, dist.TCPStore("127.0.0.1", server.port, is_master=False)]
    fast, slow = _sampler(stores[0], 0, chunk=10), _sampler(stores[1], 1, chunk=10)
    for epoch in range(2):
        fast.set_epoch(epoch)
        slow.set_epoch(epoch)
        got_fast, got_slow = _fast_and_slow(fast, slow)
        assert len(got_slow) == 10  # its one claim; the fast worker took the other 99
        assert sorted(got_fast + got_slow) == DATA
    assert (fast.dealt, slow.dealt, fast.unused, slow.unused) == (1980, 20, 0, 0)


def test_each_epoch_has_its_own_seeded_order_and_counter():
    store = dist.HashStore()
    sampler = _sampler(store, 0, seed=3)
    sampler.set_epoch(1)
    assert list(sampler) == torch.randperm(1000, generator=torch.Generator().manual_seed(4)
                                           ).tolist()  # alone: the whole order, claimed
    assert len(list(sampler)) == 1000  # a second pass over epoch 1 (no set_epoch) deals anew
    sampler.set_epoch(1)
    assert list(sampler) == []  # epoch 1's first pass again: dealt already
    other = _sampler(store, 1, seed=3)
    other.set_epoch(1)
    assert list(other) == []  # another worker's epoch 1: the same counter


def test_two_samplers_of_one_script_have_their_own_counters():
    store = dist.HashStore()
    train = DynamicSampler(DATA, num_replicas=2, rank=0, store=store)
    held_out = DynamicSampler(DATA[:100], num_replicas=2, rank=0, store=store)
    assert (len(list(train)), len(list(held_out))) == (1000, 100)
    assert train.name != held_out.name


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_equal_shares_are_distributed_samplers(shuffle, drop_last):
    data = list(range(103))
    for rank in range(4):
        ours = DynamicSampler(data, 4, rank, shuffle, 5, drop_last, store=dist.HashStore(),
                              equal_shares=True)
        theirs = DistributedSampler(data, 4, rank, shuffle, 5, drop_last)
        ours.set_epoch(2)
        theirs.set_epoch(2)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)


def test_drop_last_deals_whole_claims_only():
    def sampler(rank: int) -> DynamicSampler:
        return DynamicSampler(DATA[:103], 2, rank, store=store, batch_size=10, drop_last=True,
                              name="train")

    store = dist.HashStore()
    batches = list(DataLoader(DATA[:103], batch_size=10, sampler=sampler(0)))
    assert [len(batch) for batch in batches] == [10] * 10  # the last 3 dropped: no partial batch
    assert list(sampler(1)) == []


def test_a_loop_cut_short_counts_its_claims_untaken():
    sampler = _sampler(dist.HashStore(), 0, chunk=10)
    items = iter(sampler)
    assert len([next(items) for _ in range(13)]) == 13
    items.close()  # type: ignore[attr-defined]
    assert (sampler.dealt, sampler.unused) == (20, 7)


def test_a_dataloader_with_worker_processes_claims_in_its_own_process():
    """The loader's forked workers get indices from the sampler in the main process: over a
    HashStore (this process's memory), claims made in a child would be dealt again here."""
    store = dist.HashStore()
    dataset = TensorDataset(torch.arange(200))
    sampler = DynamicSampler(dataset, 2, 0, store=store, batch_size=8, name="train")
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2,
                        multiprocessing_context="fork")
    seen = torch.cat([batch for (batch,) in loader]).tolist()
    assert sorted(seen) == list(range(200))
    assert list(DynamicSampler(dataset, 2, 1, store=store, batch_size=8, name="train")) == []


def _iterate_in_child(sampler: DynamicSampler, answer: multiprocessing.Queue) -> None:
    try:
        list(sampler)
        answer.put("dealt")
    except RuntimeError as error:
        answer.put(str(error))


def test_a_forked_process_does_not_use_the_store():
    sampler = _sampler(dist.HashStore(), 0)
    context = multiprocessing.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_iterate_in_child, args=(sampler, answer))
    child.start()
    child.join(30)
    assert "iterated in a forked process" in answer.get(timeout=5)


def test_deal_hands_out_batch_numbers_in_order():
    store = dist.HashStore()
    fast, slow = _fast_and_slow(deal(50, epoch=0, num_replicas=2, rank=0, store=store),
                                deal(50, epoch=0, num_replicas=2, rank=1, store=store))
    assert slow == [slow[0]]
    assert sorted(fast + slow) == list(range(50))
    assert fast == sorted(fast)
    assert list(deal(50, epoch=1, num_replicas=2, rank=0, store=store)) == list(range(50))


def test_deal_deals_a_sequences_items_as_a_loop_over_it_would_take_them():
    offsets = range(0, 699, 35)  # a stream's batch offsets, as `range(0, len - 1, bptt)`
    store = dist.HashStore()
    fast, slow = _fast_and_slow(deal(offsets, num_replicas=2, rank=0, store=store),
                                deal(offsets, num_replicas=2, rank=1, store=store))
    assert sorted(fast + slow) == list(offsets)
    assert list(deal(offsets, num_replicas=2, rank=1, store=dist.HashStore(),
                     equal_shares=True)) == list(offsets[10:])


def test_deal_gives_equal_contiguous_shares_under_a_lock_step_protocol():
    shares = [list(deal(10, num_replicas=3, rank=r, store=dist.HashStore(), equal_shares=True))
              for r in range(3)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


@pytest.mark.parametrize(("options", "alone"), [
    ({"protocol": "allreduce"}, False), ({"protocol": "ddp"}, False),
    ({"protocol": "dpsgd"}, False), ({"protocol": "localsgd"}, False),
    ({"protocol": "ps"}, False), ({"protocol": "ps", "ps_mode": "async"}, True),
    ({"protocol": "prague", "schedule": "static"}, False), ({"protocol": "prague"}, True),
    ({"protocol": "adpsgd"}, True), ({"protocol": "hop"}, True),
])
def test_only_protocols_whose_workers_end_alone_are_dealt_dynamically(options, alone):
    config = RunConfig(**options)
    assert get_protocol(config.protocol).ends_alone(config) is alone


def test_the_environment_may_ask_for_equal_shares_under_any_protocol(monkeypatch):
    """`HETSYNC_SAMPLER=static`: a script's static half of an A/B, its code unchanged."""
    hetsync.init(protocol="adpsgd", device="cpu")
    try:
        assert not DynamicSampler(DATA).equal_shares
        monkeypatch.setenv(ENV_SAMPLER, "static")
        assert DynamicSampler(DATA).equal_shares
        assert DynamicSampler(DATA, equal_shares=False).equal_shares is False  # given: kept
        monkeypatch.setenv(ENV_SAMPLER, "elastic")
        assert "HETSYNC_SAMPLER='elastic' must be static or dynamic" in _one_line_error(
            lambda: deal(10))
    finally:
        hetsync.shutdown()


def _one_line_error(make: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as error:
        make()
    assert "\n" not in str(error.value)
    return str(error.value)


def test_bad_input_fails_in_one_line():
    store = dist.HashStore()
    assert "the data is empty" in _one_line_error(
        lambda: DynamicSampler([], 2, 0, store=store))
    assert "batch_size 64 is larger than the data (30 items)" in _one_line_error(
        lambda: DynamicSampler(DATA[:30], 2, 0, store=store, batch_size=64))
    assert "the data is empty" in _one_line_error(lambda: deal(0, num_replicas=2, rank=0,
                                                               store=store))
    assert "outside a run" in _one_line_error(lambda: DynamicSampler(DATA, num_replicas=4))


def test_a_world_of_one_gets_all_the_data():
    assert list(DynamicSampler(DATA, shuffle=False)) == DATA  # no run: no store needed
    hetsync.init(protocol="adpsgd", device="cpu")
    try:
        assert sorted(DynamicSampler(DATA)) == DATA
        assert list(deal(7)) == list(range(7))
        assert "num_replicas=4 disagrees with the run's (1)" in _one_line_error(
            lambda: DynamicSampler(DATA, num_replicas=4))
    finally:
        hetsync.shutdown()


def _lost_after(store: dist.Store, items: int, world: int = 2) -> tuple[list[int],
                                                                        list[DynamicSampler]]:
    """Rank 1 takes `items` items and is then lost (its loop never resumes), marked lost in
    the store by hand as the launcher marks it; returns what it took, and the survivors."""
    lost = LostWorkers(store, world, confirm_timeout=1.0)
    taken = iter(_sampler(store, 1, world, chunk=10, lost=lost))
    got = [next(taken) for _ in range(items)]
    store.set(LOST_KEY, "1")
    return got, [_sampler(store, rank, world, chunk=10, lost=lost)
                 for rank in range(world) if rank != 1]


@pytest.mark.parametrize("store", ["hash", "tcp"])
def test_a_lost_workers_unfinished_claim_is_dealt_again_and_every_sample_once(store):
    if store == "hash":
        shared: dist.Store = dist.HashStore()
    else:
        shared = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    got, [survivor] = _lost_after(shared, 15)  # its first claim done, 5 of its second taken
    finished = got[:10]  # the claim it had moved past: trained on
    dealt = list(survivor)
    assert sorted(finished + dealt) == DATA  # every sample exactly once
    assert survivor.redealt == 10  # the open claim, whole: its first 5 items taken again
    assert shared.add(REDEALT_KEY, 0) == 10  # the run's count, summary.json's redealt_items
    assert len(set(got[10:]) & set(dealt)) == 5


def test_a_claim_is_taken_over_once_and_a_finished_epoch_leaves_none():
    store = dist.HashStore()
    _, survivors = _lost_after(store, 3, world=3)
    assert sum(len(list(s)) for s in survivors) == 1000  # rank 1's claim went to one of them
    assert sorted(s.redealt for s in survivors) == [0, 10]
    store = dist.HashStore()  # a worker lost after its epoch's end held no claim
    goner = _sampler(store, 1, chunk=10, lost=LostWorkers(store, 2, confirm_timeout=1.0))
    assert len(list(goner)) == 1000
    store.set(LOST_KEY, "1")
    assert list(_sampler(store, 0, chunk=10, lost=LostWorkers(store, 2, 1.0))) == []


def _take(sampler: DynamicSampler, items: Iterator[int] | None, count: int) -> tuple[
        Iterator[int], list[int]]:
    items = items if items is not None else iter(sampler)
    return items, [next(items) for _ in range(count)]


def test_a_resumed_epoch_goes_on_from_the_checkpoints_without_reuse():
    """Two workers checkpoint mid-epoch (rank 0 inside a claim), train on, fail; resumed over
    a new store from their checkpoints, they deal the rest of the epoch: with the
    checkpoints' items every sample once, the claim in hand finished first."""
    store = dist.HashStore()
    fast, slow = _sampler(store, 0, chunk=10), _sampler(store, 1, chunk=10)
    fast_items, before = _take(fast, None, 25)  # claims 0-10, 10-20, 20-30: 5 left in hand
    _, got = _take(slow, None, 10)  # claim 30-40, taken whole
    before += got
    states = [fast.state_dict(), slow.state_dict()]
    assert states[0]["in_hand"] == [25, 30] and states[0]["dealt"] == 40
    _take(fast, fast_items, 20)  # trained on after the checkpoint: lost with the failure
    resumed_store = dist.HashStore()  # a resumed run's own store
    again = [_sampler(resumed_store, rank, chunk=10) for rank in (0, 1)]
    for sampler, state in zip(again, states, strict=True):
        sampler.load_state_dict(state)
    first = iter(again[0])
    in_hand = [next(first) for _ in range(5)]
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(0)).tolist()
    assert in_hand == order[25:30]
    after = in_hand + list(first) + list(again[1])
    assert sorted(before + after) == DATA


def test_a_resume_skips_only_what_was_claimed_between_the_checkpoints():
    """Rank 1 checkpoints after rank 0 has claimed on: the counter goes on from the later
    checkpoint's, so rank 0's claims between the two (trained on by a model the resume
    rolled back) are skipped, and nothing is dealt twice."""
    store = dist.HashStore()
    fast, slow = _sampler(store, 0, chunk=10), _sampler(store, 1, chunk=10)
    fast_items, before = _take(fast, None, 10)
    _, got = _take(slow, None, 10)
    before += got
    fast_state = fast.state_dict()
    _take(fast, fast_items, 30)  # three claims past its checkpoint ...
    slow_state = slow.state_dict()  # ... before rank 1's
    resumed_store = dist.HashStore()
    again = [_sampler(resumed_store, rank, chunk=10) for rank in (0, 1)]
    again[1].load_state_dict(slow_state)
    again[0].load_state_dict(fast_state)  # its lower count does not lower the counter
    after = list(again[0]) + list(again[1])
    assert len(set(before + after)) == len(before + after) == 1000 - 30


@pytest.mark.parametrize("equal", [True, False])
def test_a_checkpoint_before_an_epoch_starts_resumes_it_whole(equal):
    sampler = _sampler(dist.HashStore(), 0, equal_shares=equal)
    list(sampler)
    sampler.set_epoch(1)
    state = sampler.state_dict()
    again = _sampler(dist.HashStore(), 0, equal_shares=equal)
    again.load_state_dict(state)
    assert (again.epoch, len(list(again))) == (1, 500 if equal else 1000)


def test_an_equal_share_resumes_at_its_place():
    sampler = _sampler(dist.HashStore(), 1, equal_shares=True, shuffle=False)
    _, taken = _take(sampler, None, 7)
    again = _sampler(dist.HashStore(), 1, equal_shares=True, shuffle=False)
    again.load_state_dict(sampler.state_dict())
    assert taken + list(again) == list(range(1, 1000, 2))


def _deals(store: dist.Store, epoch: int = 0) -> list[Deal]:
    return [deal(100, epoch=epoch, chunk=5, num_replicas=2, rank=r, store=store, name="stream")
            for r in range(2)]


def test_a_resumed_deal_goes_on_from_the_checkpoints_without_reuse():
    """As the sampler's: two workers checkpoint their pass of deal() mid-epoch (rank 0 inside
    a claim) and fail after training on; resumed over a new store from the checkpoints, they
    deal the rest of the epoch, the claim in hand first: with the checkpoints' batches every
    batch once."""
    fast, slow = _deals(dist.HashStore())
    before = [next(fast) for _ in range(12)] + [next(slow) for _ in range(5)]
    states = [fast.state_dict(), slow.state_dict()]
    assert (states[0]["in_hand"], states[0]["dealt"]) == ([12, 15], 20)
    _ = [next(fast) for _ in range(20)]  # trained on after the checkpoint: lost
    again = _deals(dist.HashStore())
    for resumed, state in zip(again, states, strict=True):
        resumed.load_state_dict(state)
    first = [next(again[0]) for _ in range(3)]
    assert first == [12, 13, 14]
    after = first + list(again[0]) + list(again[1])
    assert sorted(before + after) == list(range(100))
    assert again[0].dealt + again[1].dealt == 100 - 20 + 3


def test_a_resumed_equal_share_and_a_pass_not_begun():
    share = deal(10, num_replicas=3, rank=1, store=dist.HashStore(), equal_shares=True)
    taken = [next(share), next(share)]
    again = deal(10, num_replicas=3, rank=1, store=dist.HashStore(), equal_shares=True)
    again.load_state_dict(share.state_dict())
    assert taken + list(again) == [4, 5, 6, 7]
    unstarted = _deals(dist.HashStore())[0].state_dict()
    fresh = _deals(dist.HashStore())[0]
    fresh.load_state_dict(unstarted)
    assert len(list(fresh)) == 100  # alone on its store: the whole epoch


def test_a_deal_refuses_another_epochs_checkpoint_and_a_late_load():
    store = dist.HashStore()
    state = _deals(store, epoch=1)[0].state_dict()
    assert "checkpoint is of 'stream' epoch 1, this deal of 'stream' epoch 2" in (
        _one_line_error(lambda: _deals(store, epoch=2)[0].load_state_dict(state)))
    started = _deals(store, epoch=3)[0]
    next(started)
    with pytest.raises(RuntimeError, match="before the first batch"):
        started.load_state_dict(started.state_dict())
