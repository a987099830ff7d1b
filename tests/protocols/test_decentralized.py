"""D-PSGD and AD-PSGD on real processes: invariants, no deadlock; every baseline learns."""

from __future__ import annotations

import time

import pytest

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl
from hetsync.workloads.datasets import FASHION_MNIST_DIRS

pytestmark = pytest.mark.integration
HAS_FASHION = any(d.is_dir() for d in FASHION_MNIST_DIRS)


@pytest.mark.parametrize(
    ("protocol", "topology"), [pytest.param("dpsgd", "ring", marks=pytest.mark.slow),
                               ("dpsgd", "exponential"), ("adpsgd", "ring")]
)
def test_zero_lr_conserves_the_sum_and_reaches_consensus(
    protocol, topology, check_zero_lr_consensus
):
    check_zero_lr_consensus(protocol=protocol, topology=topology, max_iterations=150,
                            late_even_ranks=True)


@pytest.mark.parametrize(
    ("protocol", "topology", "ending"),
    [("dpsgd", "ring", "stop"), ("adpsgd", "ring", "stop"),
     # CI time: AD-PSGD's loop end is also tests/api/test_loop_ends.py's
     pytest.param("adpsgd", "ring", "loop", marks=pytest.mark.slow),
     # CI time: as the cases above
     pytest.param("dpsgd", "ring", "loop", marks=pytest.mark.slow),
     pytest.param("dpsgd", "exponential", "stop", marks=pytest.mark.slow),
     pytest.param("dpsgd", "exponential", "loop", marks=pytest.mark.slow)],
)
def test_zero_lr_conserves_the_sum_in_a_few_iterations(
    protocol, topology, ending, check_zero_lr_consensus
):
    """Too short to mix, so an average half applied at the end shows: AD-PSGD's next request
    used to be served by the partner and never loaded by the asker. `loop`: the script's own
    loop ends after 3 iterations, with no stop condition met."""
    if ending == "stop":
        check_zero_lr_consensus(protocol=protocol, topology=topology, max_iterations=3,
                                consensus=False)
    else:
        check_zero_lr_consensus(protocol=protocol, topology=topology, max_time=60,
                                consensus=False, script_args=("steps=3",))


@pytest.mark.slow  # CI time; D-PSGD's agreed stop is also checked by its zero-lr runs
def test_dpsgd_stops_together_under_random_slowdown(train_run):
    result = train_run(protocol="dpsgd", workers=5, max_time=4, step_time=5.0,
                       slowdown="random:p=0.2,factor=4", stop_at_target=False)
    assert len(set(result.summary["iterations"])) == 1
    assert result.summary["stop_reason"] == "max_time"


@pytest.mark.slow  # CI time; the fault fuzz's AD-PSGD cases run its threads too
def test_adpsgd_a_thousand_averages_with_random_delays_no_deadlock(train_run):
    result = train_run(protocol="adpsgd", workers=8, max_iterations=260, step_time=2.0,
                       slowdown="random:p=0.1,factor=4", stop_at_target=False)
    averages = sum(
        1 for r in range(1, 8, 2)
        for row in read_jsonl(result.run_dir / "workers" / f"rank{r}.jsonl") if "partner" in row
    )
    assert averages >= 1000
    assert result.summary["iterations"] == [260] * 8


@pytest.mark.slow  # CI time: the launcher's deadlock detection has its own tests (launch/)
def test_naive_adpsgd_deadlocks_and_is_caught(tmp_path):
    started = time.monotonic()
    with pytest.raises(WorkerFailed, match="deadlock"):
        run(RunConfig(protocol="adpsgd", adpsgd_mode="naive", workload="digits", workers=4,
                      max_time=60, hang_timeout=4.0, out=tmp_path / "naive", quiet=True))
    assert time.monotonic() - started < 30


@pytest.mark.skipif(not HAS_FASHION, reason="Fashion-MNIST not installed (make setup)")
@pytest.mark.parametrize(
    ("protocol", "options"),
    # Behind slow, for CI time: D-PSGD's iterates are Hop's with nothing relaxed
    # (tests/protocols/hop, which learns), PS learns in tests/protocols/ps, AD-PSGD in the
    # bench tests' runs.
    [pytest.param("dpsgd", {}, marks=pytest.mark.slow),
     pytest.param("adpsgd", {}, marks=pytest.mark.slow),
     pytest.param("ps", {"ps_mode": "sync"}, marks=pytest.mark.slow),
     pytest.param("ps", {"ps_mode": "async"}, marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("workload", ["svm", pytest.param("cnn", marks=pytest.mark.slow)])
def test_loss_falls_on_real_workloads(protocol, options, workload, train_run, loss_fell):
    result = train_run(protocol=protocol, workload=workload, workers=4, max_time=8,
                       stop_at_target=False, eval_every=2.0, label=f"{protocol}-{workload}",
                       **options)
    assert loss_fell(result)
