"""Prague on real processes: conservation and consensus, hundreds of P-Reduces in one global
order under random delays, static schedules stopping together, learning on real workloads."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.metrics.summary import read_jsonl
from hetsync.protocols.prague.options import GROUP_SIZE, group_generator
from hetsync.workloads.datasets import FASHION_MNIST_DIRS

pytestmark = pytest.mark.integration
HAS_FASHION = any(d.is_dir() for d in FASHION_MNIST_DIRS)


BETWEEN = {"overlap": False}  # P-Reduces between steps, as before --overlap


@pytest.mark.parametrize(
    "options", [pytest.param({"gg_policy": "random"}, marks=pytest.mark.slow),
                {"schedule": "static"}, {"group_size": 2},
                {"gg_policy": "random", "group_buffer": True},
                pytest.param({"group_size": 2, **BETWEEN}, marks=pytest.mark.slow),  # CI time
                pytest.param({"gg_policy": "random", **BETWEEN}, marks=pytest.mark.slow)],
    ids=["random groups", "static schedule", "ready groups", "paper", "ready between steps",
         "random between steps"],
)
def test_zero_lr_conserves_the_sum_and_reaches_consensus(options, check_zero_lr_consensus):
    check_zero_lr_consensus(protocol="prague", max_iterations=120, **options)


@pytest.mark.parametrize(
    "options", [pytest.param({"schedule": "static"}, marks=pytest.mark.slow),  # CI time:
                # the static schedule's sum: zero-lr's above; its common stop: below
                {"gg_policy": "random"}, {"group_size": 2},
                pytest.param({"group_size": 2, **BETWEEN}, marks=pytest.mark.slow)],  # CI time
    ids=["static schedule", "random groups", "ready groups", "ready between steps"],
)
def test_max_iterations_is_run_exactly_by_every_worker_and_conserves_the_sum(
    options, check_zero_lr_consensus
):
    """A stop every worker foresees needs no agreement: 3 iterations, not 3 + period x world
    (the static schedule ran 19 with 4 workers). Too few to reach consensus."""
    result = check_zero_lr_consensus(protocol="prague", max_iterations=3, consensus=False,
                                     **options)
    assert result.summary["iterations"] == [3, 3, 3, 3]


def test_a_group_lag_steps_on_past_unfinished_groups_and_conserves_the_sum(
    check_zero_lr_consensus
):
    """Steps far shorter than a group's round trip through the Group Generator: with a lag of
    3 a worker asks for a group about one step in four instead of waiting every step, and the
    merges still conserve the sum of the models (lr 0)."""
    result = check_zero_lr_consensus(protocol="prague", max_iterations=120, group_size=2,
                                     group_lag=3, consensus=False)
    assert result.summary["iterations"] == [120] * 4
    stats = json.loads((result.run_dir / "group_generator.json").read_text())
    assert 120 <= stats["requests"] < 4 * 120 / 2, stats  # at least every 4th step asks


def groups_run(run_dir: Path, workers: int) -> dict[int, list[list[int]]]:
    """Per rank, the groups ([id, *members]) it averaged with, in the order it ran them."""
    return {r: [g for row in read_jsonl(run_dir / "workers" / f"rank{r}.jsonl")
                for g in row.get("groups", [])] for r in range(workers)}


CASES = {  # options, and the fewest distinct groups 8 x 100 requests must have formed
    "size 2": ({"group_size": 2, "gg_policy": "random"}, 770),
    "size 3, group buffer": ({"group_size": 3, "gg_policy": "random", "group_buffer": True}, 230),
    "size 4, division 2": ({"group_size": 4, "gg_policy": "random", "group_division": 2}, 770),
    "size 3, ready": ({"group_size": 3}, 230),
    "size 3, ready between steps": ({"group_size": 3, **BETWEEN}, 230),
    "size 3, paper between steps": ({"group_size": 3, "gg_policy": "random",
                                     "group_buffer": True, **BETWEEN}, 230),
}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.slow) if c in (
        "size 2", "size 3, group buffer", "size 3, paper between steps",
        "size 3, ready between steps", "size 3, ready", "size 4, division 2") else c
    for c in CASES], ids=list(CASES))
def test_hundreds_of_preduces_in_one_order_with_random_delays(case, train_run):
    result = train_run(protocol="prague", workers=8, max_iterations=100, step_time=2.0,
                       slowdown="random:p=0.1,factor=4", stop_at_target=False, eval_every=60,
                       label=case.replace(" ", ""), **CASES[case][0])
    runs = groups_run(result.run_dir, 8)
    members_of: dict[int, tuple[int, ...]] = {}
    ran_by: dict[int, set[int]] = defaultdict(set)
    for rank, groups in runs.items():
        ids = [g[0] for g in groups]
        assert ids == sorted(ids) and len(set(ids)) == len(ids), f"rank {rank} left the order"
        for gid, *members in groups:
            assert members_of.setdefault(gid, tuple(members)) == tuple(members)
            ran_by[gid].add(rank)
    assert all(ran_by[gid] == set(members) for gid, members in members_of.items())
    assert len(members_of) >= CASES[case][1]
    stats = json.loads((result.run_dir / "group_generator.json").read_text())
    assert stats["groups"] == len(members_of)
    if "gg_policy" not in CASES[case][0]:  # ready, the default
        assert stats["conflicts"] == 0


def test_a_slow_worker_is_left_out_once_the_ready_wait_runs_out(train_run):
    """Groups of 3 with rank 2 twenty times slower: the GG's timer groups the two fast ranks
    after `--ready-wait` (no message comes to wake it: only the timer can), so they go on
    in pairs; without it they would wait for rank 2 every step."""
    result = train_run(protocol="prague", workers=3, group_size=3, max_iterations=40,
                       step_time=5.0, slowdown="deterministic:ranks=2,factor=20",
                       ready_wait=20.0, stop_at_target=False, eval_every=60)
    groups = groups_run(result.run_dir, 3)
    pairs = [g for g in groups[0] if g[1:] == [0, 1]]
    assert len(pairs) >= 20, groups[0]
    stats = json.loads((result.run_dir / "group_generator.json").read_text())
    assert stats["undersized"] >= len(pairs) and stats["conflicts"] == 0


def test_static_schedule_workers_stop_after_the_same_step(train_run):
    result = train_run(protocol="prague", schedule="static", workers=4, max_time=3,
                       step_time=2.0, slowdown="random:p=0.2,factor=4", stop_at_target=False,
                       eval_every=60)
    assert len(set(result.summary["iterations"])) == 1
    groups = groups_run(result.run_dir, 4)
    for step in range(len(groups[0])):
        partition = {tuple(g[1:]) for r in range(4) for g in groups[r][step:step + 1]}
        assert sorted(r for part in partition for r in part) == list(range(4))


@pytest.mark.skipif(not HAS_FASHION, reason="Fashion-MNIST not installed (make setup)")
@pytest.mark.slow  # CI time: the zero-lr, invariant and lost-worker runs train too
@pytest.mark.parametrize("workload", ["svm", "cnn"])
def test_loss_falls_on_real_workloads(workload, train_run, loss_fell):
    result = train_run(protocol="prague", workload=workload, workers=8, max_time=7,
                       slowdown="random:p=0.1,factor=4",
                       stop_at_target=False, eval_every=2.0, label=f"prague-{workload}")
    assert loss_fell(result)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"group_size": 9}, "--group-size must be in 1..8"),
     ({"group_division": 3, "group_size": 4}, "divisions"),
     ({"group_buffer": True}, "--group-buffer applies to --gg-policy random"),
     ({"gg_policy": "fastest"}, "--gg-policy must be random or ready"),
     ({"preduce": "tree"}, "--preduce must be auto or mesh or ring or leader or subgroup"),
     ({"schedule": "static", "workers_per_node": 0}, "--workers-per-node must be >= 1"),
     ({"group_lag": 2, "overlap": False}, "--group-lag applies to P-Reduces beside the compute"),
     ({"group_lag": 2, "schedule": "static"}, "--group-lag applies"),
     ({"group_lag": -1}, "--group-lag must not be negative"),
     ({"compress": "bf16", "preduce": "leader"}, "--compress bf16 applies to --preduce mesh")],
)
def test_bad_options_are_refused_before_anything_starts(options, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(protocol="prague", workers=8, **options).validate()


@pytest.mark.parametrize(("workers", "given", "size"),
                         [(2, None, 2), (1, None, 1), (8, None, GROUP_SIZE), (8, 4, 4)])
def test_the_default_group_size_fits_the_workers(workers, given, size):
    """`--workers 2` runs in pairs without `--group-size` (the default is not refused); a
    size given is taken as it is, and refused where too big."""
    config = RunConfig(protocol="prague", workers=workers, group_size=given).validate()
    assert group_generator(config).group_size == size
    with pytest.raises(ConfigError, match=r"--group-size must be in 1\.\.2 \(the number of "
                       r"workers\) \(got 3\)"):
        RunConfig(protocol="prague", workers=2, group_size=3).validate()
