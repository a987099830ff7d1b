"""`--fault`: parsing, one clear line for a wrong spec, and when each fault is due."""

from __future__ import annotations

import signal

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.faults import KINDS, DelayMessages, FaultPlan, Hang, Kill, Raise, Stop, parse_faults
from hetsync.network.model import LinkChange, Message, NetworkModel
from hetsync.network.spec import parse_network
from hetsync.simulator.run import _kills


def test_parses_every_kind():
    assert parse_faults("none") == []
    assert parse_faults("kill:rank=3,at=20s; stop:rank=2,at=500ms,for=5s;raise:rank=1,at=40") == [
        Kill(3, at_s=20.0), Stop(2, at_s=0.5, for_s=5.0), Raise(1, at_iteration=40)]
    assert parse_faults("hang:rank=0,at=2s") == [Hang(0, at_s=2.0)]


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
    assert plan.signals_due(0.5) == []
    assert plan.signals_due(1.0) == [(signal.SIGSTOP, 1)]
    assert plan.signals_due(2.5) == [(signal.SIGKILL, 3)]
    assert plan.signals_due(2.9) == []
    assert plan.signals_due(3.0) == [(signal.SIGCONT, 1)]
    assert plan.inside_due(2, 4, 10.0) is None
    assert plan.inside_due(1, 5, 10.0) is None
    assert plan.inside_due(2, 5, 10.0) == Raise(2, at_iteration=5)
    assert plan.inside_due(2, 6, 10.0) is None


def test_message_delays_parse_and_replay_from_the_seed():
    [fault] = parse_faults("delay-messages:p=0.25,ms=200")
    assert fault == DelayMessages(-1, p=0.25, delay_s=0.2)
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


def test_each_kind_carries_where_and_how_it_acts():
    # A kind is one class: the launcher sends its signals, the loop calls act(), the sender
    # asks for its delay; nothing else knows a kind by name.
    assert {name: kind.WHERE for name, kind in KINDS.items()} == {
        "kill": "launcher", "stop": "launcher", "raise": "loop", "hang": "loop",
        "delay-messages": "sender", "slow-link": "network"}
    assert Stop(1, at_s=1.0).signals() == [(1.0, signal.SIGSTOP)]  # no for=: stays stopped
    with pytest.raises(RuntimeError, match="injected fault"):
        Raise(0, at_iteration=1).act()
    with pytest.raises(ConfigError, match="simulate models --fault kill, slow-link only"):
        _kills(RunConfig(workload="svm", workers=4, fault="stop:rank=1,at=1s",
                         on_failure="continue", protocol="hop"))


def test_a_slow_link_parses_and_needs_an_emulated_network():
    (fault,) = parse_faults("slow-link:ranks=2+5,at=20s,bandwidth=100Mbit")
    assert fault.change() == LinkChange((2, 5), 20.0, 100e6 / 8)
    for spec, error in [("slow-link:ranks=2,at=3,bandwidth=1Gbit", "at a time"),
                        ("slow-link:ranks=x,at=1s,bandwidth=1Gbit", "is not ranks"),
                        ("slow-link:ranks=2,at=1s", "needs ranks=, at= and bandwidth="),
                        ("slow-link:ranks=2,at=1s,bandwidth=fast", "cannot read rate")]:
        with pytest.raises(ConfigError, match=error):
            parse_faults(spec)
    with pytest.raises(ConfigError, match="give --network"):
        RunConfig(workers=4, fault="slow-link:ranks=2,at=1s,bandwidth=1Gbit").validate()
    with pytest.raises(ConfigError, match="only 4 workers"):
        RunConfig(workers=4, network="bandwidth=1Gbit",
                  fault="slow-link:ranks=1+4,at=1s,bandwidth=1Gbit").validate()


def test_a_slow_link_charges_every_message_of_its_ranks_from_its_time_on():
    spec = parse_network("bandwidth=8Gbit,latency=0s")
    now = [0.0]
    model = NetworkModel(spec, 4, [LinkChange((2,), 10.0, 1e8 / 8)], now=lambda: now[0])
    before = [model.transfer_time(0, 2, 1e9), model.transfer_time(0, 1, 1e9)]
    now[0] = 10.0
    after = [model.transfer_time(0, 2, 1e9), model.transfer_time(2, 3, 1e9),
             model.transfer_time(0, 1, 1e9)]
    assert before == [1.0, 1.0]
    assert after == [80.0, 80.0, 1.0]
    assert model.duration([Message(1, 2, 1e9)]) == 80.0
