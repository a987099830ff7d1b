from __future__ import annotations

import os
import threading

import pytest

from hetsync.errors import ConfigError
from hetsync.slowdown import ENV_CPU_CGROUP, join_cpu_quota, pacing, parse_slowdown


def test_none_never_slows():
    spec = parse_slowdown("none")
    assert {spec.factor(r, i) for r in range(4) for i in range(1, 50)} == {1.0}


def test_deterministic_slows_exactly_the_named_ranks():
    spec = parse_slowdown("deterministic:ranks=3+5,factor=4")
    assert [spec.factor(r, 7) for r in range(6)] == [1, 1, 1, 4, 1, 4]


def test_random_is_reproducible_and_has_the_requested_rate():
    a = parse_slowdown("random:p=0.1,factor=4", seed=7)
    b = parse_slowdown("random:p=0.1,factor=4", seed=7)
    draws = [a.factor(r, i) for r in range(8) for i in range(1, 2001)]
    assert draws == [b.factor(r, i) for r in range(8) for i in range(1, 2001)]
    assert set(draws) == {1.0, 4.0}
    assert 0.08 < draws.count(4.0) / len(draws) < 0.12
    other_seed = parse_slowdown("random:p=0.1,factor=4", seed=8)
    assert draws != [other_seed.factor(r, i) for r in range(8) for i in range(1, 2001)]


def test_trace_file(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("rank,iteration,factor\n1,3,5\n0,1,2.5\n")
    spec = parse_slowdown(f"trace:{trace}")
    assert spec.factor(1, 3) == 5 and spec.factor(0, 1) == 2.5 and spec.factor(1, 4) == 1


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("sometimes", "expected none"),
        ("deterministic:factor=4", "missing ranks"),
        ("deterministic:ranks=a,factor=4", "rank 'a'"),
        ("deterministic:ranks=1,factor=0.5", "factor must be in [1, 1000]"),
        ("deterministic:ranks=1,factor=1e308", "factor must be in [1, 1000]"),
        ("deterministic:ranks=1,factor=inf", "factor=inf is not a finite number"),
        ("random:p=0.5,factor=nan", "factor=nan is not a finite number"),
        ("random:p=2,factor=4", "p must be in [0, 1]"),
        ("random:p=0.1", "missing factor"),
        ("random:p=0.1,factor=4,q=1", "unknown key 'q'"),
        ("trace:/no/such/file.csv", "not found"),
    ],
)
def test_bad_specs_name_the_problem(text, fragment):
    with pytest.raises(ConfigError, match=None) as error:
        parse_slowdown(text)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_bad_trace_line(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("1,3\n")
    with pytest.raises(ConfigError, match="line 1"):
        parse_slowdown(f"trace:{trace}")


def test_rank_out_of_range():
    with pytest.raises(ConfigError, match="rank 9, but there are only 4 workers"):
        parse_slowdown("deterministic:ranks=9,factor=2").check_ranks(4)


def test_pacing_pads_to_step_time_then_multiplies():
    assert pacing(0.01, 0.05, 1.0) == pytest.approx((0.04, 0.0))
    assert pacing(0.01, 0.05, 4.0) == pytest.approx((0.04, 0.15))
    assert pacing(0.08, 0.05, 2.0) == pytest.approx((0.0, 0.08))  # compute beyond the step


def test_cpu_is_real_so_nothing_is_slept_but_the_simulator_reads_it_as_1_over_share():
    spec = parse_slowdown("cpu:ranks=1+3,share=0.25")
    assert spec.kind == "cpu" and spec.ranks == {1, 3} and spec.share == 0.25
    assert {spec.factor(r, i) for r in range(4) for i in range(1, 20)} == {1.0}
    emulated = spec.emulated()
    assert [emulated.factor(r, 5) for r in range(4)] == [1, 4, 1, 4]
    assert parse_slowdown("deterministic:ranks=1,factor=3").emulated().factor(1, 1) == 3


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cpu:ranks=1,share=0", "share must be in (0, 1]"),
        ("cpu:ranks=1,share=1.5", "share must be in (0, 1]"),
        ("cpu:ranks=1,share=-0.5", "share must be in (0, 1]"),
        ("cpu:ranks=1,share=nan", "share=nan is not a finite number"),
        ("cpu:share=0.5", "missing ranks"),
        ("cpu:ranks=1", "missing share"),
        ("cpu:ranks=1,share=0.5,factor=2", "unknown key 'factor'"),
    ],
)
def test_bad_cpu_specs_name_the_problem(text, fragment):
    with pytest.raises(ConfigError) as error:
        parse_slowdown(text)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_a_cpu_slowdown_of_a_rank_that_does_not_exist_is_refused():
    from hetsync.config import RunConfig

    with pytest.raises(ConfigError, match="names rank 2, but there are only 2 workers"):
        RunConfig(workers=2, slowdown="cpu:ranks=2,share=0.5").validate()


def test_a_cpu_straggler_joins_the_cgroup_the_launcher_names(tmp_path):
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    join_cpu_quota({ENV_CPU_CGROUP: str(procs)})
    assert procs.read_text() == f"{os.getpid()}\n"
    join_cpu_quota({})  # no quota named: nothing to join


def test_a_pinned_straggler_keeps_its_cores_in_every_thread_after_joining(tmp_path):
    """A cgroup with a cpuset may reset the joiners' affinity (kernels before 6.2); the
    worker's threads are put back on its cores, those the main thread had."""
    procs = tmp_path / "cgroup.procs"
    was = os.sched_getaffinity(0)
    core = min(was)
    wide = threading.Event()
    done = threading.Event()
    seen: list[set[int]] = []

    def thread() -> None:  # a gloo thread, say, that the cgroup moved to every core
        os.sched_setaffinity(0, was)
        wide.set()
        done.wait(10)
        seen.append(os.sched_getaffinity(0))

    other = threading.Thread(target=thread)
    try:
        os.sched_setaffinity(0, {core})
        other.start()
        wide.wait(10)
        join_cpu_quota({ENV_CPU_CGROUP: str(procs)})
        done.set()
        other.join(10)
        assert seen == [{core}] and os.sched_getaffinity(0) == {core}
    finally:
        done.set()
        os.sched_setaffinity(0, was)


def test_a_quota_cgroup_that_refuses_the_worker_is_one_line_naming_it(tmp_path):
    gone = tmp_path / "hetsync-1-rank1"
    with pytest.raises(RuntimeError, match=f"could not join the quota cgroup {gone}: No such"):
        join_cpu_quota({ENV_CPU_CGROUP: str(gone / "cgroup.procs")})
