"""Local SGD and DiLoCo on the simulator: they learn, stop together at a round, and (lr 0,
jittered schedules, every worker from its own model) conserve the sum of the models. No
processes: fast."""

from __future__ import annotations

import pytest
import torch

from hetsync.config import RunConfig
from hetsync.protocols.localsgd.variants import VARIANTS
from hetsync.simulator.jitter import Jitter
from hetsync.simulator.run import SimOptions, build, run_events
from hetsync.simulator.world import Simulation

OPTIONS = {variant.label: dict(variant.options) for variant in VARIANTS}


def simulation(math: bool = True, **options: object) -> Simulation:
    values: dict[str, object] = {"protocol": "localsgd", "workload": "svm", "workers": 8,
                                 "step_time": 10.0, "max_iterations": 64, "quiet": True,
                                 "stop_at_target": False}
    config = RunConfig(**{**values, **options}).validate().resolved()  # type: ignore[arg-type]
    return build(config, SimOptions(math=math, progress=False))


@pytest.mark.parametrize("variant", OPTIONS)
def test_the_loss_falls_and_the_models_agree(variant):
    sim = simulation(slowdown="deterministic:ranks=2,factor=3", **OPTIONS[variant])
    assert sim.math is not None
    before, _ = sim.math.evaluate()
    run_events(sim, [], progress=False)
    after, _ = sim.math.evaluate()
    assert after < 0.5 * before
    assert [len(w.rows) for w in sim.workers] == [64] * 8
    assert sim.math.consensus_distance() < 1e-9  # the last iteration ended with a round


def test_a_time_stop_lands_on_a_round():
    """Rank 0, 4x slower, reaches max_time many steps after the others: all stop together."""
    sim = simulation(math=False, max_iterations=None, max_time=2.0, local_steps=5,
                     slowdown="deterministic:ranks=0,factor=4")
    run_events(sim, [], progress=False)
    done = {len(w.rows) for w in sim.workers}
    assert len(done) == 1 and done.pop() % 5 == 0


@pytest.mark.parametrize("variant", OPTIONS)
@pytest.mark.parametrize("seed", range(6))
def test_jittered_rounds_end_and_conserve_the_sum(variant, seed):
    sim = simulation(lr=0.0, workers=5, max_iterations=11, local_steps=3, seed=seed,
                     slowdown="random:p=0.3,factor=5", **OPTIONS[variant])
    assert sim.math is not None
    sim.jitter = Jitter(seed, message_s=5e-3)
    sim.math.gradients = False
    sim.math.x += torch.randn(sim.math.x.shape, generator=torch.Generator().manual_seed(seed))
    before = sim.math.x.sum(0)
    run_events(sim, [], progress=False)
    assert [len(w.rows) for w in sim.workers] == [11] * 5
    assert float((sim.math.x.sum(0) - before).abs().max()) < 1e-3
