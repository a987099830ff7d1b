"""Fuzzing every protocol's cores in one process: the simulator under random schedules.

Each schedule is a small simulated run (4 to 8 workers, a random slowdown) in which every
compute takes a random fraction more or less and every message a random extra delay, keeping
each channel's order (`Jitter`), with every worker starting from its own random model and a
learning rate of 0, so that only averaging moves the models (`--math`). The cores decide as
in real runs; a schedule fails if any of the protocol's promises breaks:

- it ends: no deadlock, no protocol error (the cores check their own invariants as they go:
  Hop's gap bound on every update, the Group Generator's global order, a round's members);
- every worker completes its iterations;
- the sum of the models is conserved where the protocol promises it (the averaging
  protocols: every weighted average is doubly stochastic);
- the protocol's own, in its package's `invariants.py` (catalog's `CHECKED`), so that a new
  protocol brings its own: `check(sim)` asserts them after the run and returns what it
  counted (Prague: `{"groups": n}`); `completed(sim, iterations)`, where the protocol
  promises other iteration counts than every survivor's `iterations` (the parameter
  server's backups). Hop: no update older than `--staleness` is used (without skipping);
  Prague: every group is run by all of its members, each worker runs its groups in id order
  (the Group Generator's global order), and members agree on who is in a group.

The `-lose1` variants lose one random worker (never one that hosts a service) at a random
time, declared lost after a random delay (`Simulation.detection_s`: from at once to the real
launcher's), and check the same over the survivors: no deadlock or protocol error, every
survivor completes its iterations, Hop's staleness bound, Prague's global order and agreed
members, every group run by all its members but the lost one (who it averaged over may
differ, `average_surviving`). The sum is not checked: the lost worker's model leaves, and
what of it the survivors had already mixed in stays.

`fuzz(variant, schedules)` returns the counts; tests run a few dozen schedules per variant,
`experiments/fuzz_protocols.py` a thousand and more (docs/failures.md has the counts).
"""

from __future__ import annotations

import importlib
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import torch

from hetsync.config import RunConfig
from hetsync.cores.errors import ProtocolError
from hetsync.errors import Deadlock
from hetsync.protocols.catalog import CHECKED, SIMULATED, all_variants, essential_ranks
from hetsync.simulator.jitter import Jitter
from hetsync.simulator.run import SimOptions, build, run_events
from hetsync.simulator.world import DETECTION_S, Simulation

__all__ = ["CONSERVING", "VARIANTS", "FuzzResult", "fuzz"]

#: The variants fuzzed, from each protocol package's `variants.py` (those marked `fuzz`, of the
#: protocols that have a simulation): every protocol, and every option that changes who waits
#: for whom.
VARIANTS: dict[str, dict[str, Any]] = {variant.label: dict(variant.run_options)
                                       for variant in all_variants()
                                       if variant.fuzz and variant.protocol in SIMULATED}
#: Variants whose averaging conserves the sum of the models (with lr 0); the others replace
#: models by a server's (ps), drop late updates (backup) or merge unequally (skipping).
CONSERVING = frozenset(variant.label for variant in all_variants()
                       if variant.label in VARIANTS and variant.conserving)
_ITERATIONS = 12


@dataclass
class FuzzResult:
    variant: str
    schedules: int = 0
    events: int = 0
    checked: Counter[str] = field(default_factory=Counter)
    """What the protocol's own invariants counted, by name (Prague: the groups)."""
    lost: int = 0
    """Schedules that lost a worker before it finished (the `-lose1` variants)."""
    failures: list[str] = field(default_factory=list)
    """One line per failed schedule: its seed and what broke."""


def fuzz(variant: str, schedules: int, seed: int = 0, math: bool = True) -> FuzzResult:
    """Run `schedules` random schedules of `variant` (a key of `VARIANTS`)."""
    result = FuzzResult(variant)
    for k in range(schedules):
        schedule_seed = seed * 1_000_003 + k
        try:
            _schedule(variant, schedule_seed, math, result)
        except (Deadlock, ProtocolError, AssertionError, RuntimeError, ValueError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            result.failures.append(f"seed {schedule_seed}: {type(error).__name__}: {first}")
        result.schedules += 1
    return result


def _invariants(protocol: str) -> ModuleType | None:
    """`protocol`'s own promises (its package's `invariants.py`), imported only here."""
    if protocol not in CHECKED:
        return None
    return importlib.import_module(f"hetsync.protocols.{protocol}.invariants")


def _completed(sim: Simulation, iterations: int) -> None:
    done = [len(worker.rows) for worker in sim.survivors]
    assert done == [iterations] * len(done), f"iterations completed: {done}"


def _schedule(variant: str, seed: int, math: bool, result: FuzzResult) -> None:
    rng = random.Random(seed)
    options = VARIANTS[variant]
    workers = rng.choice((4, 6, 8))  # even: AD-PSGD's ring must be bipartite
    slow = rng.choice(("none", f"random:p=0.3,factor={rng.choice((2, 5))}",
                       f"deterministic:ranks={rng.randrange(workers)},factor=4"))
    config = RunConfig(workload="svm", workers=workers, step_time=50.0, slowdown=slow,
                       max_iterations=_ITERATIONS, seed=seed % 2**31, lr=0.0, quiet=True,
                       **options).validate()
    if config.on_failure == "continue":  # lose one worker during the run: --fault kill
        victim = rng.choice([r for r in range(workers) if r not in essential_ranks(config)])
        at_ms = rng.uniform(0.0, _ITERATIONS * config.step_time)
        config = replace(config, fault=f"kill:rank={victim},at={at_ms:.3f}ms").validate()
    config = config.resolved()
    sim = build(config, SimOptions(math=math, progress=False))
    sim.jitter = Jitter(seed, message_s=rng.choice((1e-4, 5e-3, 0.03)))
    sim.detection_s = rng.choice((0.0, 0.01, 0.1, DETECTION_S))
    before = None
    if sim.math is not None:
        sim.math.gradients = False  # lr 0: only averaging moves the models
        generator = torch.Generator().manual_seed(seed)
        sim.math.x += torch.randn(sim.math.x.shape, generator=generator)
        before = sim.math.x.sum(0)
    run_events(sim, [], progress=False)
    result.lost += bool(sim.lost)
    own = _invariants(options["protocol"])
    getattr(own, "completed", _completed)(sim, _ITERATIONS)  # (None has none: the default)
    counted = own.check(sim) if hasattr(own, "check") else {}
    if before is not None and variant in CONSERVING:
        assert sim.math is not None
        drift = float((sim.math.x.sum(0) - before).abs().max())
        assert drift < 1e-3, f"the sum of the models drifted by {drift:.2g}"
    result.events += sim.clock.events
    result.checked.update(counted)

