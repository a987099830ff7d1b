"""The sync parameter server's rounds, backup workers included, without processes."""

from __future__ import annotations

import random

import pytest

from hetsync.cores.errors import RemoteProtocolError
from hetsync.protocols.ps.rounds import Reply, SyncRounds


def test_without_backups_a_round_waits_for_every_worker():
    rounds = SyncRounds(world=3)
    assert rounds.push(2, 0, False).reply is None
    assert rounds.push(0, 0, False).reply is None
    decision = rounds.push(1, 0, True)
    assert decision.accept
    assert decision.reply == Reply(ranks=(2, 0, 1), version=1, applied=3, staleness=0, stop=True)


def test_a_late_gradient_is_dropped_and_its_sender_catches_up_at_once():
    rounds = SyncRounds(world=3, backup=1)
    rounds.push(0, 0, False)
    closed = rounds.push(1, 0, False).reply
    assert closed == Reply(ranks=(0, 1), version=1, applied=2, staleness=0, stop=False)
    late = rounds.push(2, 0, False)
    assert not late.accept and rounds.dropped == 1
    assert late.reply == Reply(ranks=(2,), version=1, applied=0, staleness=1, stop=False)
    rounds.push(2, 1, False)  # caught up: its next gradient counts
    assert rounds.push(0, 1, False).reply.ranks == (2, 0)


def test_a_dropped_vote_stops_the_next_round_and_every_later_reply():
    rounds = SyncRounds(world=3, backup=1)
    rounds.push(0, 0, False)
    rounds.push(1, 0, False)
    assert not rounds.push(2, 0, True).reply.stop  # dropped, but its vote counts
    rounds.push(0, 1, False)
    assert rounds.push(1, 1, False).reply.stop
    assert rounds.push(2, 1, False).reply == Reply(ranks=(2,), version=2, applied=0,
                                                   staleness=1, stop=True)


def test_rounds_stop_waiting_for_workers_that_left():
    rounds = SyncRounds(world=3, backup=1)
    rounds.leave()
    rounds.leave()
    assert rounds.push(0, 0, False).reply.ranks == (0,)
    rounds = SyncRounds(world=2)
    rounds.push(0, 0, False)
    assert rounds.leave().ranks == (0,)


def test_refused():
    with pytest.raises(ValueError, match="backup"):
        SyncRounds(world=2, backup=2)
    with pytest.raises(RemoteProtocolError, match="rank 1 pushed for version 1"):
        SyncRounds(world=2).push(1, 1, False)


@pytest.mark.parametrize("backup", [0, 1, 3])
def test_random_speeds_every_push_answered_all_end_on_one_model(backup):
    """Event simulation: each worker pushes, waits for its reply, computes for its own time."""
    rng = random.Random(backup)
    world = 5
    speed = [rng.uniform(1.0, 5.0) for _ in range(world)]
    rounds = SyncRounds(world, backup)
    ready = {rank: (speed[rank], 0) for rank in range(world)}  # next push: time, version
    pushes, answers, final = [0] * world, [0] * world, {}
    while ready:
        rank = min(ready, key=lambda r: ready[r][0])
        now, version = ready.pop(rank)
        pushes[rank] += 1
        reply = rounds.push(rank, version, vote=now > 60).reply
        for answered in reply.ranks if reply else ():
            answers[answered] += 1
            if reply.stop:
                final[answered] = reply.version
                assert rounds.leave() is None  # no round is open after the stop
            else:
                ready[answered] = (now + speed[answered], reply.version)
    assert pushes == answers and len(final) == world and len(set(final.values())) == 1
    assert rounds.members == [] and (rounds.dropped > 0) == (backup > 0)
    if backup == 0:
        assert len(set(pushes)) == 1
