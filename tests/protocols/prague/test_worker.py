from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.cores.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from hetsync.protocols.prague.group_generator import Group
from hetsync.protocols.prague.worker import (
    GroupAssigned,
    MergeModels,
    PragueWorkerCore,
    PReduceFinished,
    ReportFinished,
    RequestGroup,
    RunPReduce,
    StartStep,
    StepFinished,
    StopTraining,
    WorkerState,
)

MINE = Group(id=3, members=(0, 2))
OTHERS = Group(id=1, members=(0, 1, 3))
LATER = Group(id=5, members=(0, 4))


def _core() -> PragueWorkerCore:
    return PragueWorkerCore(rank=0, world=5)


def test_step_request_reduce_step():
    core = _core()
    assert core.state is WorkerState.COMPUTING and core.iteration == 1
    assert core.handle(StepFinished(iteration=1)) == [RequestGroup(rank=0, iteration=1, last=False)]
    assert core.state is WorkerState.SYNCING and core.awaiting_answer
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == [RunPReduce(group=MINE)]
    assert core.state is WorkerState.REDUCING and core.running == MINE
    assert core.handle(PReduceFinished(group_id=3)) == [
        ReportFinished(group_id=3), StartStep(iteration=2)]
    assert core.state is WorkerState.COMPUTING and core.iteration == 2


def test_groups_assigned_during_a_step_run_first_then_the_answer():
    core = _core()
    assert core.handle(GroupAssigned(group=OTHERS)) == []
    assert core.queued == (OTHERS,)
    assert core.handle(StepFinished(iteration=1)) == [
        RequestGroup(rank=0, iteration=1, last=False), RunPReduce(group=OTHERS)
    ]
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == []
    assert core.queued == (MINE,)
    assert core.handle(PReduceFinished(group_id=1)) == [
        ReportFinished(group_id=1), RunPReduce(group=MINE)]
    assert core.handle(GroupAssigned(group=LATER)) == []
    assert core.handle(PReduceFinished(group_id=3)) == [
        ReportFinished(group_id=3), RunPReduce(group=LATER)]
    assert core.handle(PReduceFinished(group_id=5)) == [
        ReportFinished(group_id=5), StartStep(iteration=2)]


def test_no_step_starts_before_the_answer_even_with_an_empty_queue():
    core = _core()
    core.handle(GroupAssigned(group=OTHERS))
    core.handle(StepFinished(iteration=1))
    assert core.handle(PReduceFinished(group_id=1)) == [ReportFinished(group_id=1)]
    assert core.state is WorkerState.SYNCING and core.awaiting_answer


@pytest.mark.parametrize("answer_while", ["queued", "running", "done"])
def test_an_answer_naming_a_group_already_assigned_needs_no_second_preduce(answer_while):
    core = _core()
    core.handle(GroupAssigned(group=OTHERS))
    core.handle(GroupAssigned(group=MINE))
    core.handle(StepFinished(iteration=1))  # runs OTHERS; MINE waits in the queue
    if answer_while == "queued":
        assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == []
        assert core.handle(PReduceFinished(group_id=1)) == [
            ReportFinished(group_id=1), RunPReduce(group=MINE)]
        assert core.handle(PReduceFinished(group_id=3)) == [
            ReportFinished(group_id=3), StartStep(iteration=2)]
        return
    answer = GroupAssigned(group=OTHERS, answers_request=True)
    if answer_while == "running":
        assert core.handle(answer) == []
        core.handle(PReduceFinished(group_id=1))
        assert core.handle(PReduceFinished(group_id=3)) == [
            ReportFinished(group_id=3), StartStep(iteration=2)]
    else:
        core.handle(PReduceFinished(group_id=1))
        assert core.handle(PReduceFinished(group_id=3)) == [ReportFinished(group_id=3)]
        assert core.handle(answer) == [StartStep(iteration=2)]


def test_last_step_leaves_once_every_group_is_done():
    core = PragueWorkerCore(rank=0, world=5, first_iteration=7)
    assert core.handle(StepFinished(iteration=7, last=True)) == [
        RequestGroup(rank=0, iteration=7, last=True)
    ]
    core.handle(GroupAssigned(group=MINE, answers_request=True))
    assert core.handle(PReduceFinished(group_id=3)) == [ReportFinished(group_id=3), StopTraining()]
    assert core.state is WorkerState.DONE


def test_a_group_of_one_is_run_like_any_other():
    core = _core()
    core.handle(StepFinished(iteration=1))
    alone = Group(id=0, members=(0,))
    answer = GroupAssigned(group=alone, answers_request=True)
    assert core.handle(answer) == [RunPReduce(group=alone)]


# Overlap: P-Reduces beside the compute.


def _overlapped(first_iteration: int = 1, group_lag: int = 0) -> PragueWorkerCore:
    return PragueWorkerCore(rank=0, world=5, first_iteration=first_iteration, overlap=True,
                            group_lag=group_lag)


def test_overlap_merges_requests_and_steps_at_once_then_reduces_beside_the_step():
    core = _overlapped()
    assert core.handle(StepFinished(iteration=1)) == [
        MergeModels(), RequestGroup(rank=0, iteration=1, last=False), StartStep(iteration=2)]
    assert core.state is WorkerState.COMPUTING and core.awaiting_answer
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == [RunPReduce(group=MINE)]
    assert core.state is WorkerState.COMPUTING and core.running == MINE
    assert core.handle(PReduceFinished(group_id=3)) == [ReportFinished(group_id=3)]
    assert core.handle(StepFinished(iteration=2)) == [
        MergeModels(), RequestGroup(rank=0, iteration=2, last=False), StartStep(iteration=3)]


def test_overlap_the_next_step_ends_waiting_for_the_previous_answers_group():
    core = _overlapped()
    core.handle(StepFinished(iteration=1))
    assert core.handle(StepFinished(iteration=2)) == []  # no answer yet
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == [RunPReduce(group=MINE)]
    assert core.handle(PReduceFinished(group_id=3)) == [
        ReportFinished(group_id=3), MergeModels(), RequestGroup(rank=0, iteration=2, last=False),
        StartStep(iteration=3)]


def test_overlap_groups_of_others_wait_for_the_first_merge_then_run_in_order():
    core = _overlapped()
    assert core.handle(GroupAssigned(group=OTHERS)) == []  # no copy of the model yet
    assert core.handle(StepFinished(iteration=1)) == [
        MergeModels(), RequestGroup(rank=0, iteration=1, last=False), StartStep(iteration=2),
        RunPReduce(group=OTHERS)]
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == []
    assert core.handle(StepFinished(iteration=2)) == []  # OTHERS runs, MINE is queued
    assert core.handle(PReduceFinished(group_id=1)) == [
        ReportFinished(group_id=1), RunPReduce(group=MINE)]
    assert core.handle(GroupAssigned(group=LATER)) == []
    assert core.handle(PReduceFinished(group_id=3)) == [
        ReportFinished(group_id=3), MergeModels(), RequestGroup(rank=0, iteration=2, last=False),
        StartStep(iteration=3), RunPReduce(group=LATER)]


def test_overlap_an_answer_naming_the_running_group_needs_no_second_preduce():
    core = _overlapped()
    core.handle(StepFinished(iteration=1))
    core.handle(GroupAssigned(group=OTHERS))  # runs at once
    assert core.handle(GroupAssigned(group=OTHERS, answers_request=True)) == []
    assert core.handle(StepFinished(iteration=2)) == []
    assert core.handle(PReduceFinished(group_id=1))[:3] == [
        ReportFinished(group_id=1), MergeModels(), RequestGroup(rank=0, iteration=2, last=False)]


def test_overlap_last_step_leaves_after_its_group_and_the_queue_with_a_final_merge():
    core = _overlapped(first_iteration=7)
    assert core.handle(StepFinished(iteration=7, last=True)) == [
        MergeModels(), RequestGroup(rank=0, iteration=7, last=True)]
    assert core.handle(GroupAssigned(group=OTHERS)) == [RunPReduce(group=OTHERS)]
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == []
    assert core.handle(PReduceFinished(group_id=1)) == [
        ReportFinished(group_id=1), RunPReduce(group=MINE)]
    assert core.handle(PReduceFinished(group_id=3)) == [
        ReportFinished(group_id=3), MergeModels(), StopTraining()]
    assert core.state is WorkerState.DONE


# Group lag: steps on past a group not done yet.


def test_a_group_lag_steps_on_past_the_unfinished_group_then_waits_at_the_bound():
    core = _overlapped(group_lag=2)
    core.handle(StepFinished(iteration=1))
    assert core.handle(StepFinished(iteration=2)) == [StartStep(iteration=3)]  # no answer yet
    assert core.handle(GroupAssigned(group=MINE, answers_request=True)) == [RunPReduce(group=MINE)]
    assert core.handle(StepFinished(iteration=3)) == [StartStep(iteration=4)]  # MINE runs
    assert core.handle(StepFinished(iteration=4)) == []  # two steps on: it waits
    assert core.state is WorkerState.SYNCING
    assert core.handle(PReduceFinished(group_id=3)) == [
        ReportFinished(group_id=3), MergeModels(), RequestGroup(rank=0, iteration=4, last=False),
        StartStep(iteration=5)]


def test_a_group_lag_starts_afresh_once_a_step_ends_with_its_group_done():
    core = _overlapped(group_lag=1)
    core.handle(StepFinished(iteration=1))
    assert core.handle(StepFinished(iteration=2)) == [StartStep(iteration=3)]
    core.handle(GroupAssigned(group=MINE, answers_request=True))
    core.handle(PReduceFinished(group_id=3))
    assert core.handle(StepFinished(iteration=3))[1:] == [
        RequestGroup(rank=0, iteration=3, last=False), StartStep(iteration=4)]
    assert core.handle(StepFinished(iteration=4)) == [StartStep(iteration=5)]  # lags again


def test_a_group_lag_never_passes_the_last_step():
    core = _overlapped(group_lag=3)
    core.handle(StepFinished(iteration=1))
    assert core.handle(StepFinished(iteration=2, last=True)) == []
    core.handle(GroupAssigned(group=MINE, answers_request=True))
    assert core.handle(PReduceFinished(group_id=3))[1:] == [
        MergeModels(), RequestGroup(rank=0, iteration=2, last=True)]


@pytest.mark.parametrize(("lag", "overlap"), [(-1, True), (1, False)])
def test_a_group_lag_needs_overlap_and_is_not_negative(lag, overlap):
    with pytest.raises(ValueError, match="group_lag"):
        PragueWorkerCore(rank=0, world=2, overlap=overlap, group_lag=lag)


@pytest.mark.parametrize(
    ("events", "error", "match"),
    [
        ([StepFinished(iteration=2)], LocalProtocolError,
         r"rank 0 in state COMPUTING: cannot take StepFinished\(iteration=2, last=False\): "
         r"expected StepFinished\(iteration=1\)"),
        ([StepFinished(iteration=1), StepFinished(iteration=1)], LocalProtocolError,
         "in state SYNCING"),
        ([PReduceFinished(group_id=3)], LocalProtocolError, "the P-Reduce running is none"),
        ([StepFinished(iteration=1), GroupAssigned(group=MINE, answers_request=True),
          PReduceFinished(group_id=1)], LocalProtocolError, "the P-Reduce running is group 3"),
        (["hello"], LocalProtocolError, "rank 0: unknown event 'hello'"),
        ([GroupAssigned(group=Group(id=0, members=(1, 2)))], RemoteProtocolError,
         "does not contain this rank"),
        ([GroupAssigned(group=MINE, answers_request=True)], RemoteProtocolError,
         "answers no request of this rank"),
        ([GroupAssigned(group=MINE), GroupAssigned(group=OTHERS)], RemoteProtocolError,
         "group 1 arrives after group 3: out of the global order"),
        ([GroupAssigned(group=MINE), GroupAssigned(group=MINE)], RemoteProtocolError,
         "group 3 is assigned twice"),
        ([StepFinished(iteration=1, last=True), GroupAssigned(group=MINE, answers_request=True),
          PReduceFinished(group_id=3), GroupAssigned(group=LATER)], RemoteProtocolError,
         "in state DONE: .*this rank already left"),
    ],
    ids=["wrong-iteration", "step-while-syncing", "no-preduce-running", "other-preduce",
         "not-an-event", "group-without-me", "answer-without-request", "out-of-order",
         "assigned-twice", "after-leaving"],
)
def test_misuse_and_broken_invariants_raise_and_leave_the_core_in_error(
    events, error, match, assert_refused
):
    assert_refused(_core(), events, error, match, then=StepFinished(iteration=1))


def test_bad_rank_and_bare_protocol_errors_are_rejected():
    with pytest.raises(ValueError, match=r"rank.*0\.\.3 \(got 4\)"):
        PragueWorkerCore(rank=4, world=4)
    with pytest.raises(TypeError, match="LocalProtocolError or RemoteProtocolError"):
        ProtocolError("whose fault?")


@pytest.mark.parametrize(("options", "overlap", "lag"), [
    ({}, True, 0), ({"group_lag": 2}, True, 2), ({"overlap": False}, False, 0),
    ({"schedule": "static"}, False, 0),
])
def test_both_engines_build_the_core_from_the_run_options(options, overlap, lag):
    config = RunConfig(protocol="prague", workers=4, workload="svm", **options)
    core = PragueWorkerCore.of_run(config, 3, 4)
    assert (core.rank, core.overlap, core.group_lag) == (3, overlap, lag)


# Reporting a finished group with the next request (the `ready` policy).


@pytest.mark.parametrize("overlap", [False, True], ids=["between steps", "overlap"])
def test_a_finished_group_rides_in_the_next_request_and_none_is_held_at_the_end(overlap):
    core = PragueWorkerCore(rank=0, world=5, overlap=overlap, report_with_request=True)
    requests = [d for d in core.handle(StepFinished(iteration=1)) if isinstance(d, RequestGroup)]
    assert requests == [RequestGroup(rank=0, iteration=1, last=False)]
    core.handle(GroupAssigned(group=MINE, answers_request=True))
    assert not any(isinstance(d, ReportFinished)
                   for d in core.handle(PReduceFinished(group_id=3)))  # held
    decisions = core.handle(StepFinished(iteration=2, last=True))
    assert [d for d in decisions if isinstance(d, RequestGroup | ReportFinished)] == [
        RequestGroup(rank=0, iteration=2, last=True, finished=3)]
    core.handle(GroupAssigned(group=LATER, answers_request=True))
    assert core.handle(PReduceFinished(group_id=5))[0] == ReportFinished(group_id=5)  # the last
    assert core.state is WorkerState.DONE


def test_a_second_finished_group_reports_the_held_one_at_once_in_order():
    core = PragueWorkerCore(rank=0, world=5, report_with_request=True)
    core.handle(GroupAssigned(group=OTHERS))
    core.handle(GroupAssigned(group=MINE))
    core.handle(StepFinished(iteration=1))  # runs OTHERS, then MINE
    assert core.handle(PReduceFinished(group_id=1)) == [RunPReduce(group=MINE)]
    assert core.handle(PReduceFinished(group_id=3)) == [ReportFinished(group_id=1)]
    core.handle(GroupAssigned(group=MINE, answers_request=True))
    assert core.handle(StepFinished(iteration=2))[0] == RequestGroup(
        rank=0, iteration=2, last=False, finished=3)


@pytest.mark.parametrize(("policy", "with_request"), [("ready", True), ("random", False)])
def test_only_the_ready_policy_reports_finished_groups_with_the_request(policy, with_request):
    config = RunConfig(protocol="prague", workers=4, workload="svm", gg_policy=policy)
    assert PragueWorkerCore.of_run(config, 1, 4).report_with_request is with_request
