"""`--fault`: parsing, one clear line for a wrong spec, and when each fault is due."""

from __future__ import annotations

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.faults import Fault, FaultPlan, parse_faults


def test_parses_every_kind():
    assert parse_faults("none") == []
    assert parse_faults("kill:rank=3,at=20s; stop:rank=2,at=500ms,for=5s;raise:rank=1,at=40") == [
        Fault("kill", 3, at_s=20.0), Fault("stop", 2, at_s=0.5, for_s=5.0),
        Fault("raise", 1, at_iteration=40)]
    assert parse_faults("hang:rank=0,at=2s") == [Fault("hang", 0, at_s=2.0)]


@pytest.mark.parametrize("spec,message", [
    ("explode:rank=1,at=2s", "unknown fault 'explode'"),
    ("kill:rank=1", "needs rank= and at="),
    ("kill:rank=x,at=2s", "is not a rank"),
    ("kill:rank=1,at=20", "happens at a time"),
    ("stop:rank=1,at=2h", "is not a time"),
    ("raise:rank=1,at=3,for=2s", "for= applies to stop only"),
    ("raise:rank=1,at=0", "iterations count from 1"),
    ("kill:rank=1,when=2s", "is not rank=, at= or for="),
])
def test_a_wrong_spec_gets_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse_faults(spec)
    assert "\n" not in str(error.value)


def test_a_rank_beyond_the_workers_is_refused_before_starting():
    with pytest.raises(ConfigError, match="--fault names rank 5, but there are only 4 workers"):
        RunConfig(workload="svm", workers=4, fault="kill:rank=5,at=1s").validate()


def test_the_plan_fires_each_fault_once_and_resumes_a_stop():
    plan = FaultPlan(parse_faults("kill:rank=3,at=2s;stop:rank=1,at=1s,for=2s;raise:rank=2,at=5"))
    assert plan.external_due(0.5) == []
    assert plan.external_due(1.0) == [("stop", 1)]
    assert plan.external_due(2.5) == [("kill", 3)]
    assert plan.external_due(2.9) == []
    assert plan.external_due(3.0) == [("cont", 1)]
    assert plan.inside_due(2, 4, 10.0) is None
    assert plan.inside_due(1, 5, 10.0) is None
    assert plan.inside_due(2, 5, 10.0) == Fault("raise", 2, at_iteration=5)
    assert plan.inside_due(2, 6, 10.0) is None


def test_message_delays_parse_and_replay_from_the_seed():
    [fault] = parse_faults("delay-messages:p=0.25,ms=200")
    assert fault == Fault("delay-messages", -1, p=0.25, delay_s=0.2)
    plan = FaultPlan(parse_faults("delay-messages:p=0.5,ms=0,rank=2"))
    assert plan.message_delay(1, seed=0) is None  # only rank 2's messages
    first, again = plan.message_delay(2, seed=7), plan.message_delay(2, seed=7)
    assert first is not None and again is not None
    assert [first.rng.random() for _ in range(5)] == [again.rng.random() for _ in range(5)]
    assert plan.inside_due(2, 1, 0.0) is None  # not a fault of the training loop


@pytest.mark.parametrize("spec,message", [
    ("delay-messages:p=0.1", "needs p= and ms="),
    ("delay-messages:p=2,ms=5", "p= must be in"),
    ("delay-messages:p=x,ms=5", "must be numbers"),
    ("delay-messages:p=0.1,ms=5,at=3s", "is not p=, ms= or rank="),
])
def test_a_wrong_delay_spec_gets_one_line(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_faults(spec)
