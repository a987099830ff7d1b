"""In-process fuzzing: every protocol's cores under random schedules keep their promises, and
the fuzzer does catch a protocol that breaks one."""

from __future__ import annotations

import pytest

from hetsync.simulator import fuzz as fuzzing
from hetsync.simulator.fuzz import VARIANTS, fuzz


@pytest.mark.parametrize("variant", VARIANTS)
def test_random_schedules_keep_every_promise(variant):
    result = fuzz(variant, schedules=40, seed=1)
    assert result.failures == []
    assert result.schedules == 40 and result.events > 1000
    if variant.startswith("prague"):
        assert result.checked["groups"] > 100
    if variant.endswith("-lose1"):  # a worker lost before it finished, in most schedules
        assert result.lost >= 30


def test_the_fuzzer_reports_a_deadlock_with_its_seed(monkeypatch):
    naive = {"protocol": "adpsgd", "adpsgd_mode": "naive", "topology": "complete"}
    monkeypatch.setitem(fuzzing.VARIANTS, "adpsgd-naive", naive)
    result = fuzz("adpsgd-naive", schedules=10)
    assert len(result.failures) >= 5
    assert all(line.startswith("seed ") and "Deadlock" in line for line in result.failures)


def test_the_fuzzer_catches_a_sum_that_is_not_conserved(monkeypatch):
    monkeypatch.setattr(fuzzing, "CONSERVING", fuzzing.CONSERVING | {"ps-sync"})
    result = fuzz("ps-sync", schedules=5)
    assert len(result.failures) == 5 and "drifted" in result.failures[0]


def test_the_fuzzer_checks_each_protocols_own_invariants(monkeypatch):
    """A protocol's promises beyond every protocol's are its package's `invariants.py`."""
    from hetsync.protocols.hop import invariants

    def broken(sim):
        raise AssertionError(f"hop's own check ran on {len(sim.workers)} workers")

    monkeypatch.setattr(invariants, "check", broken)
    result = fuzz("hop", schedules=3)
    assert len(result.failures) == 3 and "hop's own check ran" in result.failures[0]


def test_every_variant_fuzzes_its_own_configuration():
    """Two names for one configuration fuzz it twice (`prague-overlap` was `prague`, since
    overlap is the default), and the paper's loop, between steps, was fuzzed by none."""
    from hetsync.config import RunConfig

    configs = {name: RunConfig(**options).to_dict() for name, options in VARIANTS.items()}
    assert len({repr(sorted(c.items())) for c in configs.values()}) == len(configs)
    paper = {"gg_policy": "random", "group_buffer": True, "overlap": False}
    for name in ("prague-paper", "prague-paper-lose1"):
        assert paper.items() <= configs[name].items()
    assert not configs["prague-between"]["overlap"] and configs["prague-paper-overlap"]["overlap"]
