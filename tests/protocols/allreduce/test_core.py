"""All-Reduce's decisions (the workers' side and the collective's completion), without processes."""

from __future__ import annotations

import pytest

from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.allreduce.core import (
    AllReduceRound,
    AllReduceWorker,
    Completed,
    Contributed,
    Finish,
    GradientsReady,
    Reduce,
    Reduced,
    Regrouped,
)


def _iteration(workers, round_, k, votes):
    """Every worker contributes to iteration k; returns each worker's Finish."""
    completed = []
    for worker, vote in zip(workers, votes, strict=True):
        [reduce] = worker.handle(GradientsReady(iteration=k, wants_stop=vote))
        assert reduce == Reduce(iteration=k, divisor=len(workers), vote=int(vote))
        completed += round_.handle(Contributed(rank=worker.rank, iteration=k, vote=reduce.vote))
    [done] = completed  # only the last contribution completes the collective
    return [w.handle(Reduced(iteration=k, votes=done.votes))[0] for w in workers], done


def test_the_collective_completes_with_every_worker_and_one_vote_stops_all():
    workers = [AllReduceWorker(rank, 3) for rank in range(3)]
    round_ = AllReduceRound(3)
    finishes, done = _iteration(workers, round_, 1, [False, False, False])
    assert done == Completed(iteration=1, votes=0, stop=False)
    assert finishes == [Finish(iteration=1, stop=False)] * 3
    finishes, done = _iteration(workers, round_, 2, [False, True, False])
    assert done == Completed(iteration=2, votes=1, stop=True)
    assert finishes == [Finish(iteration=2, stop=True)] * 3
    assert workers[0].divisor == 3


def test_a_round_waits_for_the_last_worker():
    round_ = AllReduceRound(2)
    assert round_.handle(Contributed(rank=1, iteration=1, vote=0)) == []
    assert round_.count == 1
    assert round_.handle(Contributed(rank=0, iteration=1, vote=0))[0].iteration == 1


def test_worker_refuses(assert_refused):
    assert_refused(AllReduceWorker(0, 2), [Reduced(iteration=1, votes=0)], LocalProtocolError,
                   "cannot take Reduced", then=GradientsReady(iteration=1, wants_stop=False))
    worker = AllReduceWorker(0, 2)
    assert_refused(worker, [GradientsReady(iteration=1, wants_stop=False),
                            GradientsReady(iteration=2, wants_stop=False)], LocalProtocolError,
                   "state REDUCING", then=Reduced(iteration=1, votes=0))
    assert_refused(AllReduceWorker(0, 2), [GradientsReady(iteration=1, wants_stop=False),
                                           Reduced(iteration=1, votes=3)],
                   RemoteProtocolError, "votes must be in 0..2", then=Reduced(iteration=1, votes=0))
    worker = AllReduceWorker(0, 1)
    worker.handle(GradientsReady(iteration=1, wants_stop=True))
    assert worker.handle(Reduced(iteration=1, votes=1)) == [Finish(iteration=1, stop=True)]
    with pytest.raises(LocalProtocolError, match="DONE"):
        worker.handle(GradientsReady(iteration=2, wants_stop=False))
    with pytest.raises(ValueError, match="rank"):
        AllReduceWorker(2, 2)


def test_round_refuses(assert_refused):
    assert_refused(AllReduceRound(2), [Contributed(rank=0, iteration=1, vote=0),
                                       Contributed(rank=0, iteration=1, vote=0)],
                   RemoteProtocolError, "already contributed",
                   then=Contributed(rank=1, iteration=1, vote=0))
    assert_refused(AllReduceRound(2), [Contributed(rank=0, iteration=1, vote=0),
                                       Contributed(rank=1, iteration=2, vote=0)],
                   RemoteProtocolError, "at iteration 1",
                   then=Contributed(rank=1, iteration=1, vote=0))
    assert_refused(AllReduceRound(2), [Contributed(rank=2, iteration=1, vote=0)],
                   RemoteProtocolError, "no such rank",
                   then=Contributed(rank=1, iteration=1, vote=0))
    round_ = AllReduceRound(1)
    round_.handle(Contributed(rank=0, iteration=1, vote=1))
    with pytest.raises(LocalProtocolError, match="DONE"):
        round_.handle(Contributed(rank=0, iteration=2, vote=0))


def test_a_new_generation_mid_collective_contributes_again_with_its_divisor():
    worker = AllReduceWorker(rank=0, world=4)
    assert worker.handle(GradientsReady(iteration=1, wants_stop=True)) == [
        Reduce(iteration=1, divisor=4, vote=1)]
    # rank 2 lost and not back: three left, the same vote contributed again
    assert worker.handle(Regrouped(iteration=1, world=3)) == [
        Reduce(iteration=1, divisor=3, vote=1)]
    assert worker.handle(Reduced(iteration=1, votes=1)) == [Finish(iteration=1, stop=True)]


def test_a_new_generation_between_steps_changes_the_next_divisor_only():
    worker = AllReduceWorker(rank=1, world=3)
    worker.handle(GradientsReady(iteration=1, wants_stop=False))
    worker.handle(Reduced(iteration=1, votes=0))
    assert worker.handle(Regrouped(iteration=1, world=4)) == []  # a worker back: 4 again
    assert worker.handle(GradientsReady(iteration=2, wants_stop=False)) == [
        Reduce(iteration=2, divisor=4, vote=0)]
    with pytest.raises(LocalProtocolError):
        worker.handle(Regrouped(iteration=1, world=4))  # an old iteration's news: a bug
