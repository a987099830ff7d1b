"""The parameter server's decisions (sync with backups, async) and its workers', no processes."""

from __future__ import annotations

import random

import pytest

from hetsync.config import RunConfig
from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.ps.core import (
    Accumulate,
    Answer,
    Apply,
    Bye,
    GradientReady,
    Leave,
    LoadModel,
    PSServerCore,
    PSWorkerCore,
    Push,
    ReplyReceived,
    SendBye,
    SendPush,
    WorkerLost,
)


def test_sync_round_accumulates_then_applies_the_mean_and_answers_all():
    server = PSServerCore(2)
    assert server.handle(Push(rank=1, version=0, vote=False)) == [Accumulate(rank=1)]
    assert server.handle(Push(rank=0, version=0, vote=True)) == [
        Accumulate(rank=0), Apply(version=1, divisor=2, buffer_divisor=2, lr_scale=1.0),
        Answer(ranks=(1, 0), version=1, staleness=0, stop=True)]


def test_sync_with_a_backup_drops_the_late_gradient_and_answers_it_at_once():
    server = PSServerCore(3, backup=1)
    server.handle(Push(rank=0, version=0, vote=False))
    assert server.handle(Push(rank=1, version=0, vote=False))[-1].ranks == (0, 1)
    late = server.handle(Push(rank=2, version=0, vote=False))
    assert late == [Answer(ranks=(2,), version=1, staleness=1, stop=False)]  # no Accumulate
    assert server.dropped == 1


def test_a_bye_closes_the_round_that_waited_for_the_leaver():
    server = PSServerCore(3)
    server.handle(Push(rank=0, version=0, vote=False))
    server.handle(Push(rank=1, version=0, vote=False))
    assert server.handle(Bye(rank=2)) == [
        Apply(version=1, divisor=2, buffer_divisor=2, lr_scale=1.0),
        Answer(ranks=(0, 1), version=1, staleness=0, stop=False)]
    assert server.handle(Push(rank=0, version=1, vote=False)) == [Accumulate(rank=0)]
    with pytest.raises(RemoteProtocolError, match="that rank left"):
        server.handle(Push(rank=2, version=1, vote=False))


def test_async_applies_each_push_at_1_over_n_and_reports_its_staleness():
    server = PSServerCore(2, mode="async")
    apply_ = Apply(version=1, divisor=1, buffer_divisor=2, lr_scale=0.5)
    assert server.handle(Push(rank=0, version=0, vote=True)) == [
        Accumulate(rank=0), apply_, Answer(ranks=(0,), version=1, staleness=0, stop=False)]
    assert server.handle(Push(rank=1, version=0, vote=False))[-1] == Answer(
        ranks=(1,), version=2, staleness=1, stop=False)
    assert server.handle(Push(rank=0, version=1, vote=False))[-1].staleness == 1
    assert server.handle(Bye(rank=1)) == []


# --- lost workers (--on-failure continue) ------------------------------------------------------
def test_a_worker_lost_with_its_push_in_the_open_round_leaves_when_that_round_closes():
    """The fuzzer's seed 4 of ps-sync-lose1: a synchronous worker is lost while its push waits
    for the round to close. Its gradient counts; the round still waits for every survivor (no
    survivor's push is dropped with no backup), and later rounds no longer wait for it."""
    server = PSServerCore(3)
    server.handle(Push(rank=0, version=0, vote=False))
    server.handle(Push(rank=2, version=0, vote=False))
    assert server.handle(WorkerLost(rank=2)) == []
    assert server.handle(Push(rank=1, version=0, vote=False)) == [
        Accumulate(rank=1), Apply(version=1, divisor=3, buffer_divisor=3, lr_scale=1.0),
        Answer(ranks=(0, 2, 1), version=1, staleness=0, stop=False)]  # rank 2's goes nowhere
    server.handle(Push(rank=0, version=1, vote=False))
    assert server.handle(Push(rank=1, version=1, vote=False))[-1].ranks == (0, 1)
    assert server.dropped == 0


def test_a_worker_lost_between_pushes_closes_the_round_that_waited_for_it():
    server = PSServerCore(3)
    server.handle(Push(rank=0, version=0, vote=False))
    server.handle(Push(rank=1, version=0, vote=False))
    assert server.handle(WorkerLost(rank=2))[-1] == Answer(ranks=(0, 1), version=1,
                                                             staleness=0, stop=False)
    assert server.handle(WorkerLost(rank=2)) == []  # declared twice, or after its goodbye
    async_server = PSServerCore(2, mode="async")
    async_server.handle(Push(rank=1, version=0, vote=False))
    assert async_server.handle(WorkerLost(rank=1)) == []
    assert async_server.handle(Push(rank=1, version=1, vote=False)) == []  # it no longer counts


def test_what_a_lost_worker_sent_before_its_loss_is_dropped_by_the_core():
    # The engines (driver, simulation) hand every message to the core; the core drops the
    # late ones, where a worker that said goodbye and pushes again is still refused.
    server = PSServerCore(3)
    server.handle(WorkerLost(rank=2))
    assert server.handle(Push(rank=2, version=0, vote=False)) == []
    assert server.handle(Bye(rank=2)) == []


def test_server_refuses(assert_refused):
    push = Push(rank=0, version=0, vote=False)
    assert_refused(PSServerCore(2), [push, push], RemoteProtocolError, "unanswered",
                   then=Push(rank=1, version=0, vote=False))
    assert_refused(PSServerCore(2), [Bye(rank=1), Push(rank=1, version=0, vote=False)],
                   RemoteProtocolError, "that rank left", then=push)
    assert_refused(PSServerCore(2, mode="async"), [Push(rank=0, version=3, vote=False)],
                   RemoteProtocolError, "server is at version 0", then=push)
    assert_refused(PSServerCore(2), [Push(rank=5, version=0, vote=False)],
                   RemoteProtocolError, "no such rank", then=push)
    with pytest.raises(ValueError, match="async waits for no one"):
        PSServerCore(2, mode="async", backup=1)
    with pytest.raises(ValueError, match="mode"):
        PSServerCore(2, mode="semi")


@pytest.mark.parametrize(("mode", "backup", "reply_stop", "stop", "dropped"), [
    ("sync", 0, True, True, None), ("sync", 1, False, False, True), ("async", 0, False, True, None),
])
def test_worker_tags_its_push_with_the_last_version_and_decides_its_stop(
        mode, backup, reply_stop, stop, dropped):
    worker = PSWorkerCore(1, mode, backup)
    assert worker.handle(GradientReady(iteration=1, wants_stop=False)) == [
        SendPush(iteration=1, version=0, vote=False)]
    assert worker.handle(ReplyReceived(version=3, staleness=0, stop=False))[0].version == 3
    assert worker.handle(GradientReady(iteration=2, wants_stop=True)) == [
        SendPush(iteration=2, version=3, vote=True)]
    assert worker.handle(ReplyReceived(version=5, staleness=1, stop=reply_stop)) == [
        LoadModel(iteration=2, version=5, staleness=1, dropped=dropped, stop=stop)]
    if stop:
        with pytest.raises(LocalProtocolError, match="STOPPED"):
            worker.handle(GradientReady(iteration=3, wants_stop=False))
    else:
        assert worker.handle(Leave()) == [SendBye()]


def test_worker_refuses(assert_refused):
    reply = ReplyReceived(version=1, staleness=0, stop=False)
    assert_refused(PSWorkerCore(0), [reply], RemoteProtocolError, "answers no push", then=Leave())
    assert_refused(PSWorkerCore(0), [GradientReady(iteration=1, wants_stop=False),
                                     ReplyReceived(version=0, staleness=0, stop=False)],
                   RemoteProtocolError, "computed on version 0", then=Leave())
    assert_refused(PSWorkerCore(0), [GradientReady(iteration=1, wants_stop=False), Leave()],
                   LocalProtocolError, "state PUSHED", then=reply)


@pytest.mark.parametrize(("mode", "backup"), [("sync", 0), ("sync", 2), ("async", 0)])
def test_random_speeds_every_push_answered_and_staleness_is_the_version_gap(mode, backup):
    """Event simulation of server and workers: each worker computes for its own time."""
    rng, world = random.Random(7), 5
    speed = [rng.uniform(1.0, 5.0) for _ in range(world)]
    server = PSServerCore(world, mode, backup)
    workers = [PSWorkerCore(rank, mode, backup) for rank in range(world)]
    ready = {rank: speed[rank] for rank in range(world)}  # when its next gradient is done
    iteration, pushes, answers, applied = [0] * world, 0, 0, 0
    while ready:
        rank = min(ready, key=ready.__getitem__)
        now = ready.pop(rank)
        iteration[rank] += 1
        [push] = workers[rank].handle(GradientReady(iteration=iteration[rank],
                                                    wants_stop=now > 60))
        pushes += 1
        for decision in server.handle(Push(rank=rank, version=push.version, vote=push.vote)):
            applied += isinstance(decision, Apply)
            if not isinstance(decision, Answer):
                continue
            for answered in decision.ranks:
                answers += 1
                [load] = workers[answered].handle(ReplyReceived(
                    version=decision.version, staleness=decision.staleness, stop=decision.stop))
                if mode == "async":  # the server's version before applying it - the pushed one
                    assert load.staleness == decision.version - 1 - push.version
                if load.stop:
                    assert workers[answered].handle(Leave()) == [SendBye()]
                    server.handle(Bye(rank=answered))
                else:
                    ready[answered] = now + speed[answered]
    assert pushes == answers
    assert applied == (pushes if mode == "async" else server.rounds.version)
    if mode == "sync":
        assert len({w.version for w in workers}) == 1  # all end on the same model
        assert (server.dropped > 0) == (backup > 0)


@pytest.mark.parametrize(("mode", "backup"), [("sync", 1), ("async", 0)])
def test_both_engines_build_the_cores_from_the_run_options(mode, backup):
    options = RunConfig(protocol="ps", workers=3, workload="svm", ps_mode=mode, ps_backup=backup)
    server, worker = PSServerCore.of_run(options, 3), PSWorkerCore.of_run(options, 2)
    assert (server.world, server.sync, worker.rank, worker.sync) == (3, mode == "sync", 2,
                                                                       mode == "sync")
    assert (server.rounds.quorum, worker.backup) == (3 - backup, backup)
