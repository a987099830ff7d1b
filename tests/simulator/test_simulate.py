"""The simulator end to end: every protocol through its cores, determinism, the cost model's
charges, conservation under --math, deadlocks and bad input. No processes: fast."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from hetsync.cli import main
from hetsync.config import RunConfig
from hetsync.errors import ConfigError, Deadlock
from hetsync.network.model import NetworkModel
from hetsync.network.patterns import ring_allreduce
from hetsync.network.spec import parse_network
from hetsync.protocols.catalog import SIMULATED, all_variants
from hetsync.report import write_report
from hetsync.simulator.run import SimOptions, build, run_events, simulate

#: Every protocol's default variant, as the bench suites run them (labels start with the
#: protocol), and a few more.
VARIANTS = {variant.label: dict(variant.options) for variant in all_variants() if variant.default}
VARIANTS |= {
    "ps-async": {"ps_mode": "async"}, "ps-backup": {"ps_backup": 1}, "hop": {},
    "prague-paper": {"gg_policy": "random", "group_buffer": True},
    "prague-static": {"schedule": "static", "max_iterations": 15},
}
QUIET = SimOptions(progress=False)


def config(tmp_path: Path, protocol: str, **options: object) -> RunConfig:
    values: dict[str, object] = {"workload": "svm", "workers": 8, "step_time": 50.0,
                                 "max_iterations": 30, "out": tmp_path / "run", "quiet": True}
    return RunConfig(protocol=protocol, **{**values, **options})  # type: ignore[arg-type]


def rows(run_dir: Path, rank: int) -> list[dict[str, object]]:
    lines = (run_dir / "workers" / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_protocol_simulates_64_workers_in_seconds(tmp_path, variant):
    protocol = variant.split("-")[0]
    slow = "deterministic:ranks=3,factor=5"
    began = time.perf_counter()
    options = {"max_time": 3.0, "max_iterations": None, **VARIANTS[variant]}
    result = simulate(config(tmp_path, protocol, workers=64, slowdown=slow, **options), QUIET)
    assert time.perf_counter() - began < 30
    summary = result.summary
    assert summary["engine"] == "simulator"
    assert min(summary["iterations"]) >= 8  # the 5x slow worker: 3 s / 0.25 s
    assert summary["stop_reason"] is None
    assert (result.run_dir / "workers" / "rank63.jsonl").is_file()


def test_the_same_seed_gives_the_same_run(tmp_path):
    options = {"slowdown": "random:p=0.2,factor=4", "gg_policy": "random",
               "group_buffer": True, "seed": 3}
    first = simulate(config(tmp_path, "prague", out=tmp_path / "a", **options), QUIET)
    second = simulate(config(tmp_path, "prague", out=tmp_path / "b", **options), QUIET)
    third = simulate(config(tmp_path, "prague", out=tmp_path / "c", **{**options, "seed": 4}),
                     QUIET)
    assert rows(first.run_dir, 5) == rows(second.run_dir, 5)
    assert rows(first.run_dir, 5) != rows(third.run_dir, 5)


def test_an_iteration_costs_its_compute_and_the_modelled_collective(tmp_path):
    network = "bandwidth=1Gbit,latency=50us"
    sim = build(config(tmp_path, "allreduce", network=network, payload="10MB").resolved())
    period = rows_period(simulate(config(tmp_path, "allreduce", network=network,
                                         payload="10MB"), QUIET).run_dir)
    spec = parse_network(network)
    assert spec is not None
    collective = NetworkModel(spec, 8).duration(ring_allreduce(range(8), 10e6))
    assert period == pytest.approx(0.050 + sim.costs.overhead_s + collective, rel=1e-6)


def rows_period(run_dir: Path) -> float:
    ts = [row["t"] for row in rows(run_dir, 0)]
    return (ts[-1] - ts[0]) / (len(ts) - 1)  # type: ignore[operator]


def test_hop_on_a_free_network_runs_at_the_speed_of_its_compute(tmp_path):
    run_dir = simulate(config(tmp_path, "hop"), QUIET).run_dir
    sim = build(config(tmp_path, "hop").resolved())
    assert rows_period(run_dir) == pytest.approx(0.050 + sim.costs.overhead_s, rel=1e-3)


@pytest.mark.parametrize("protocol,options", [
    ("prague", {}), ("prague", {"gg_policy": "random", "group_buffer": True}),
    ("prague", {"schedule": "static"}), ("prague", {"overlap": True}),
    ("prague", {"gg_policy": "random", "group_buffer": True, "overlap": True}),
    ("adpsgd", {}), ("dpsgd", {}),
])
def test_averaging_conserves_the_sum_of_the_models_with_lr_0(tmp_path, protocol, options):
    cfg = config(tmp_path, protocol, lr=0.0, slowdown="random:p=0.3,factor=3",
                 **options).validate().resolved()
    sim = build(cfg, SimOptions(math=True, progress=False))
    assert sim.math is not None
    sim.math.x += torch.randn(sim.math.x.shape, generator=torch.Generator().manual_seed(0))
    before = sim.math.x.sum(0).clone()
    spread = (sim.math.x - sim.math.x.mean(0)).abs().max()
    run_events(sim, [], progress=False)
    assert torch.allclose(sim.math.x.sum(0), before, atol=1e-4)
    assert (sim.math.x - sim.math.x.mean(0)).abs().max() < 0.5 * spread  # they mixed


def test_math_learns_and_reaches_the_target(tmp_path):
    cfg = config(tmp_path, "prague", max_iterations=None, max_time=30.0, eval_every=0.5)
    summary = simulate(cfg, SimOptions(math=True, progress=False)).summary
    assert summary["time_to_target_s"] is not None
    assert summary["final_loss"] <= cfg.resolved().target_loss + 0.01
    evals = (Path(summary_dir(tmp_path)) / "eval.jsonl").read_text().splitlines()
    assert json.loads(evals[-1])["model"] == "final"


def summary_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def test_a_naive_adpsgd_cycle_is_reported_as_a_deadlock_naming_the_waiters(tmp_path):
    cfg = config(tmp_path, "adpsgd", adpsgd_mode="naive", workers=4, topology="complete",
                 max_iterations=200)
    with pytest.raises(Deadlock, match=r"rank \d+ at iteration \d+ waits for"):
        simulate(cfg, QUIET)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"].startswith("failed: deadlock")


def test_a_simulated_run_is_reported_beside_a_real_one(tmp_path):
    first = simulate(config(tmp_path, "hop", out=tmp_path / "hop"), QUIET).run_dir
    second = simulate(config(tmp_path, "prague", out=tmp_path / "prague"), QUIET).run_dir
    report = write_report([first, second], tmp_path / "report")
    assert "prague" in report.read_text()


@pytest.mark.parametrize("argv,message", [
    (["--protocol", "hop"], "needs --step-time"),
    (["--protocol", "hop", "--step-time", "50", "--workload", "cnn", "--math"],
     "--math supports --workload svm"),
    (["--protocol", "nosuch", "--step-time", "50"], "unknown protocol"),
    (["--protocol", "prague", "--step-time", "50", "--group-size", "9"], "group"),
    (["--protocol", "hop", "--step-time", "50", "--gg-service-us", "nan"], "--gg-service-us"),
])
def test_bad_input_gets_one_line(tmp_path, capsys, argv, message):
    code = main(["simulate", "--workload", "svm", "--workers", "8", "--max-iterations", "5",
                 "--out", str(tmp_path / "bad"), "--quiet", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()  # nothing left that blocks the mended command


def test_every_protocol_has_a_simulation():
    from hetsync.protocols.registry import available_protocols

    assert set(available_protocols()) == set(SIMULATED)


def test_simulate_refuses_a_script(tmp_path):
    with pytest.raises(ConfigError, match="built-in workloads"):
        build(config(tmp_path, "hop", script=["x.py"]).resolved())


def test_a_real_cpu_share_is_simulated_as_its_factor(tmp_path):
    """The simulator has no kernel: a quarter of a core costs 4x the step, as factor 4 does."""
    cpu = build(config(tmp_path, "adpsgd", slowdown="cpu:ranks=3,share=0.25").resolved())
    emulated = build(config(tmp_path, "adpsgd",
                            slowdown="deterministic:ranks=3,factor=4").resolved())
    assert [cpu.costs.compute(r, 7) for r in range(8)] == \
        [emulated.costs.compute(r, 7) for r in range(8)]
    assert cpu.costs.compute(3, 7)[1] == pytest.approx(3 * 0.050)  # (4 - 1) x the step
