"""Hop on real processes: D-PSGD's iterates when nothing is relaxed, invariants checked from
the logs under random delays, and learning on the real workloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.metrics.summary import read_jsonl
from hetsync.topology import build
from hetsync.workloads.datasets import FASHION_MNIST_DIRS

pytestmark = pytest.mark.integration
HAS_FASHION = any(d.is_dir() for d in FASHION_MNIST_DIRS)


def _rows(run_dir: Path, rank: int) -> list[dict]:
    return read_jsonl(run_dir / "workers" / f"rank{rank}.jsonl")


@pytest.mark.parametrize("mode", ["queues", pytest.param("notify-ack",
                                                            marks=pytest.mark.slow)])
def test_with_nothing_relaxed_hop_computes_dpsgds_iterates(mode, train_run):
    common = {"workers": 4, "max_iterations": 40, "stop_at_target": False, "seed": 3}
    dpsgd = train_run(protocol="dpsgd", label="dpsgd", **common)
    paper = {"backup": 0, "skip": False} if mode == "queues" else {}  # not the defaults
    hop = train_run(protocol="hop", hop_mode=mode, label=mode, **paper, **common)
    for rank in range(4):
        expected = [r["loss"] for r in _rows(dpsgd.run_dir, rank)]
        assert len(expected) == 40
        assert [r["loss"] for r in _rows(hop.run_dir, rank)] == pytest.approx(
            expected, rel=1e-5, abs=1e-6)


@pytest.mark.slow  # CI time: Hop computes D-PSGD's iterates (above), and D-PSGD's conserve
def test_zero_lr_conserves_the_sum_and_reaches_consensus(check_zero_lr_consensus):
    check_zero_lr_consensus(protocol="hop", max_iterations=150)


def check_invariants_from_logs(run_dir: Path, config: RunConfig) -> None:
    """On every edge i->j, when i started iteration k, j had completed k - max_gap (its token
    was sent after that); every update used was within the staleness bound."""
    topology = build(config.topology, config.workers)
    hop = config.hop_config(topology)  # the options as the run resolved them
    gap = hop.tokens
    rows = {r: _rows(run_dir, r) for r in range(config.workers)}
    for i, mine in rows.items():
        for row in mine:
            assert row["staleness"] <= hop.staleness, f"rank {i} used a stale update: {row}"
        for j in topology.out_peers(i):
            completions = sorted(
                [(r["done_at"], r["tag"]) for r in rows[j]]
                + [(r["started_at"], r["tag"] - 1) for r in rows[j] if r.get("skipped")]
            )
            last_done = completions[-1][0]
            for row in mine:
                if row["started_at"] > last_done:
                    break  # j has left; nobody waits for its tokens any more
                done = max((tag for at, tag in completions if at <= row["started_at"]), default=0)
                assert row["tag"] - done <= gap, f"edge {i}->{j}: {i} started {row['tag']} " \
                                                 f"when {j} had completed {done}"


VARIANTS = {
    "standard": {"backup": 0, "skip": False, "max_gap": 2},
    "backup": {"backup": 1, "skip": False, "max_gap": 3},
    "staleness": {"backup": 0, "staleness": 2, "skip": False, "max_gap": 3},
    "backup+skip": {"backup": 1, "skip": True, "max_gap": 4},
    "directed+skip": {"topology": "directed-ring", "backup": 0, "staleness": 0, "skip": True,
                      "max_gap": 3},
    "exponential+backup+skip": {"topology": "exponential", "backup": 2, "skip": True,
                                "max_gap": 3, "slowdown": "deterministic:ranks=0,factor=5"},
}


@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.slow)
    if v in ("standard", "staleness", "backup", "directed+skip", "backup+skip",
             "exponential+backup+skip") else v
    for v in VARIANTS], ids=list(VARIANTS))
def test_six_workers_with_random_delays_keep_hops_invariants(variant, train_run):
    options = {"workers": 6, "max_time": 4, "step_time": 4.0, "stop_at_target": False,
               "eval_every": 60, "slowdown": "random:p=0.2,factor=5", **VARIANTS[variant],
               "label": variant}
    result = train_run(protocol="hop", **options)
    config = RunConfig.read(result.run_dir / "config.json")
    check_invariants_from_logs(result.run_dir, config)
    assert min(result.summary["iterations"]) >= 25
    first = [r["loss"] for r in _rows(result.run_dir, 0)[:15]]
    last = [r["loss"] for r in _rows(result.run_dir, 0)[-15:]]
    assert sum(last) < 0.7 * sum(first)


def test_a_persistently_slow_worker_skips_and_no_longer_holds_back_the_ring(train_run):
    result = train_run(protocol="hop", workers=6, max_time=6, step_time=10.0, backup=1,
                       max_gap=6, skip=True, slowdown="deterministic:ranks=2,factor=6",
                       stop_at_target=False, eval_every=60)
    rows = _rows(result.run_dir, 2)
    assert any(r.get("skipped") for r in rows)
    assert rows[-1]["tag"] > 2 * len(rows), "the slow worker covers iterations it never computes"
    # Without skipping the token bound keeps everyone within max_gap of the slow worker.
    fast = [n for r, n in enumerate(result.summary["iterations"]) if r != 2]
    assert min(fast) > 2.5 * len(rows) and min(fast) > len(rows) + 6


def test_deferred_updates_spare_a_slow_receiver_and_every_worker_still_stops(train_run):
    """`--send-ahead 1`: the fast worker sends the 6x slow one about one update per iteration
    it completes (a finish and a skip each return tokens: at most two), not one per its own
    iteration; the run ends cleanly (a deferred last update goes before the end marker)."""
    result = train_run(protocol="hop", workers=2, max_time=4, step_time=10.0, staleness=3,
                       max_gap=4, skip=True, send_ahead=1, average_once=False,
                       stop_at_target=False,
                       slowdown="deterministic:ranks=1,factor=6", eval_every=60)
    check_invariants_from_logs(result.run_dir, RunConfig.read(result.run_dir / "config.json"))
    fast, slow = _rows(result.run_dir, 0), _rows(result.run_dir, 1)
    updates = sum(r["bytes_sent"] > 1000 for r in fast)  # a token message is 8 bytes
    assert any(r.get("skipped") for r in slow)
    assert updates <= 2 * len(slow) + 2 and 2 * updates < len(fast), (updates, len(slow))
    # Each row says what it waited for: the slow worker's tokens, 4 iterations ahead of it
    assert sum(r.get("wait_token_from_1_s", 0) for r in fast) > 0.1
    for row in fast:  # waits are sync time; on a ring of 2 each waits for one cause at a time
        assert sum(v for k, v in row.items() if k.startswith("wait_")) <= row["sync_wait_s"] + 1e-3


@pytest.mark.skipif(not HAS_FASHION, reason="Fashion-MNIST not installed (make setup)")
@pytest.mark.slow  # CI time: the zero-lr, invariant and lost-worker runs train too
@pytest.mark.parametrize("workload", ["svm", "cnn"])
def test_loss_falls_on_real_workloads(workload, train_run, loss_fell):
    result = train_run(protocol="hop", workload=workload, workers=8, max_time=7, backup=1,
                       skip=True, slowdown="random:p=0.1,factor=4", stop_at_target=False,
                       eval_every=2.0, label=f"hop-{workload}")
    assert loss_fell(result)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"backup": 2}, "--backup must be < the in-degree 2 of rank 0"),
     ({"staleness": 3, "max_gap": 3}, "--max-gap must be > --staleness 3"),
     ({"hop_mode": "notify-ack", "backup": 1}, "notify-ack cannot express"),
     ({"topology": "one-peer-exponential"}, "fixed graph")],
)
def test_bad_options_are_refused_before_anything_starts(options, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(protocol="hop", workers=4, **options).validate()


def test_skip_that_cannot_take_effect_warns():
    with pytest.warns(UserWarning, match="--skip has no effect"):
        RunConfig(protocol="hop", workers=4, backup=0, skip=True).validate()
