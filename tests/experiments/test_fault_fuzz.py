"""The real-process fault fuzz (experiments/fault_fuzz.py): its own checks, three fixed cases in
CI (a loss each protocol family goes on without, and one it cannot), and a drawn set behind
`slow`."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def ff(experiments_on_path):
    return importlib.import_module("fault_fuzz")


def test_cases_replay_from_their_seed(ff) -> None:
    variants = list(ff.VARIANTS)
    assert ff.draw(3, 7, variants) == ff.draw(3, 7, variants)
    cases = [ff.draw(3, i, variants) for i in range(200)]
    assert len({c.variant for c in cases}) == len(variants)
    for case in cases:  # an essential rank is lost only where the protocol has one
        assert case.essential_lost in (None, *ff.cannot_lose(case.variant, case.workers))
    assert {ff.VARIANTS[c.variant].protocol for c in cases if c.essential_lost is not None} == {
        "prague", "ps"}


def test_summary_with_nan_is_not_strict_json(ff, tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text('{"final_loss": NaN}')
    assert "not strict JSON" in ff._strict_json(tmp_path / "summary.json")
    (tmp_path / "summary.json").write_text('{"final_loss": 0.5}')
    assert ff._strict_json(tmp_path / "summary.json") == {"final_loss": 0.5}


def test_leftovers_finds_a_process_of_the_run(ff, tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "HETSYNC_RUN_DIR": str(tmp_path)})
    try:
        assert ff.leftovers(tmp_path) == [child.pid]
        assert ff.leftovers(tmp_path / "other") == []
    finally:
        child.kill()
        child.wait()


def _case(ff, index: int, variant: str, faults: list[str], lost: int,
          essential: bool = False):
    return ff.Case(seed=0, index=index, variant=variant, workers=4, iterations=60, step_ms=10.0,
                   slowdown="none", faults=faults, lost_expected=[lost],
                   essential_lost=lost if essential else None, loss_at_s=1.0)


@pytest.mark.integration
@pytest.mark.parametrize("variant,faults,lost,essential", [
    ("hop-backup1", ["kill:rank=2,at=1s", "delay-messages:p=0.1,ms=20"], 2, False),
    pytest.param("prague-no-overlap", ["stop:rank=3,at=1s", "stop:rank=1,at=0.5s,for=0.5s"],
                 3, False, marks=pytest.mark.slow),  # the stop for good waits out a hang timeout
    pytest.param("ps-async", ["kill:rank=0,at=1s"], 0, True,
                 marks=pytest.mark.slow),  # CI time: tests/launch/test_lost_workers.py kills
    # the async server too (test_losing_the_rank_that_hosts_a_service_still_ends_the_run)
])
def test_fixed_cases_end_as_promised(ff, tmp_path: Path, variant: str, faults: list[str],
                                     lost: int, essential: bool) -> None:
    result = ff.run_case(_case(ff, 0, variant, faults, lost, essential), tmp_path)
    assert result.outcome in ff.OK, (result.problems, result.command, result.last_line)


@pytest.mark.integration
@pytest.mark.slow
def test_drawn_cases(ff, tmp_path: Path) -> None:
    results = ff.fuzz(0, list(range(12)), list(ff.VARIANTS), tmp_path)
    failed = [(r.case.index, r.case.variant, r.problems, r.command) for r in results
              if r.outcome not in ff.OK]
    assert not failed
