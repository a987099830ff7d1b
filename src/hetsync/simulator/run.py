"""`hetsync simulate`: a run on the virtual clock, written as a real run's directory.

The run directory has the files of a real run (docs/run-directory.md): `config.json`,
`workers/rank{r}.jsonl`, `eval.jsonl` (with `--math`), `summary.json`, plus
`simulation.json`, which says the run was simulated, what was modelled, and how long the
simulation itself took. `hetsync report` therefore shows simulated and real runs side by side.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hetsync.config import RunConfig, default_out
from hetsync.errors import ConfigError, Deadlock
from hetsync.faults import KINDS, Kill, link_changes, parse_faults
from hetsync.launch.launcher import (
    RunLock,
    RunResult,
    check_capacity,
    prepare_run_dir,
)
from hetsync.metrics import strict_json
from hetsync.metrics.summary import summarize_rows, write_summary
from hetsync.network.emulator import model_bytes
from hetsync.network.spec import parse_payload
from hetsync.protocols.catalog import SIMULATED, essential_ranks
from hetsync.protocols.registry import validated
from hetsync.simulator.costs import LOCAL_NETWORK, SERVICE_S, Costs
from hetsync.simulator.math import MathModel, check_math
from hetsync.simulator.world import Simulation, SimWorker
from hetsync.transport.codec import codec
from hetsync.workloads import get_workload

__all__ = ["SimOptions", "build", "run_events", "simulate", "simulation"]


#: Memory of one simulated worker, timing only: measured about 6 KB at the start (1,000 to
#: 8,000 Prague workers added 40 MB here), and its rows grow by one per iteration.
SIMULATED_WORKER_BYTES = 64 * 2**10


@dataclass(frozen=True)
class SimOptions:
    """What `simulate` adds to a run's options."""

    math: bool = False
    """Run every worker's real numerical updates (`MathModel`), not timing only."""
    gg_service_us: float = SERVICE_S["group-generator"] * 1e6
    ps_service_us: float = SERVICE_S["parameter-server"] * 1e6
    progress: bool = True


def check(config: RunConfig, options: SimOptions = SimOptions()) -> list[tuple[int, float]]:
    """Raise ConfigError where `config` is not one the simulator can run: before its run
    directory is made, so that a refused command leaves nothing that blocks the mended one.
    Returns the kills it models (`_kills`)."""
    if options.math:
        check_math(config)
    if not config.step_time:
        raise ConfigError("hetsync simulate needs --step-time MS: the compute time of one "
                          "iteration is what the simulator charges")
    if config.script:
        raise ConfigError("hetsync simulate runs the built-in workloads, not a script")
    simulation(config.protocol)
    return _kills(config)


def build(config: RunConfig, options: SimOptions = SimOptions()) -> Simulation:
    """A ready-to-run simulation of a validated, resolved `config`."""
    kills = check(config, options)
    declared = parse_payload(config.payload)
    payload = float(declared if declared is not None
                    else model_bytes(get_workload(config.workload).build_model()))
    payload *= codec(config.compress).ratio()  # what a model weighs on the wire
    slowdown = config.slowdown_spec().emulated()  # no kernel here: a cpu share S is 1/S
    costs = Costs.build(config.step_time, slowdown, config.network, config.workers, payload)
    sim = Simulation(config, costs, math=MathModel(config) if options.math else None)
    costs.network.changes = link_changes(parse_faults(config.fault))
    costs.network.now = lambda: sim.clock.now
    sim.service_s = {"group-generator": options.gg_service_us * 1e-6,
                     "parameter-server": options.ps_service_us * 1e-6}
    sim.workers = simulation(config.protocol)(sim)
    for rank, at in kills:
        sim.kill(rank, at)
    return sim


def simulation(protocol: str) -> Callable[[Simulation], list[SimWorker]]:
    """The `build_workers` of `protocol`'s simulation: its package's `simulation.py`, imported
    only here, so that real runs never load the simulator."""
    if protocol not in SIMULATED:
        raise ConfigError(f"hetsync simulate has no simulation of protocol {protocol!r} "
                          f"(simulated: {', '.join(SIMULATED)})")
    module = importlib.import_module(f"hetsync.protocols.{protocol}.simulation")
    return module.build_workers  # type: ignore[no-any-return]


def _kills(config: RunConfig) -> list[tuple[int, float]]:
    """(rank, seconds) of each `--fault kill`: a worker lost under `--on-failure continue`
    (whose protocol and ranks real runs' check allows). `slow-link` is simulated too: the
    network model applies it (`build`)."""
    faults = parse_faults(config.fault)
    for fault in faults:
        if not fault.SIMULATED:
            modelled = ", ".join(kind.NAME for kind in KINDS.values() if kind.SIMULATED)
            raise ConfigError(f"hetsync simulate models --fault {modelled} only: "
                              f"--fault {fault.kind} applies to real runs (hetsync train)")
    kills = [fault for fault in faults if isinstance(fault, Kill)]
    if kills and config.on_failure != "continue":
        raise ConfigError("hetsync simulate models a killed worker under --on-failure "
                          "continue only (without it a kill ends the run): add it")
    essential = essential_ranks(config) if kills else frozenset()
    for fault in kills:
        if fault.rank in essential:
            raise ConfigError(f"--fault kill:rank={fault.rank}: rank {fault.rank} hosts "
                              f"{config.protocol}'s central service, whose loss ends a real "
                              "run; hetsync simulate models the losses a run goes on without")
    return [(f.rank, f.at_s) for f in kills if f.at_s is not None]  # a kill is at a time


def simulate(config: RunConfig, options: SimOptions = SimOptions()) -> RunResult:
    """Simulate `config`; raise ConfigError before starting, `Deadlock` if it cannot finish.
    The run directory gets its summary however the simulation ends."""
    per_worker = SIMULATED_WORKER_BYTES
    if options.math:  # each worker's model, momentum and gradient (MathModel), with room
        per_worker += 4 * model_bytes(get_workload(config.workload).build_model())
    # Before validate(), which builds structures as large as the run (Prague's GG).
    check_capacity(config.workers, per_worker=per_worker, what="simulated workers")
    config = validated(config).resolved()
    check(config, options)
    run_dir = Path(config.out) if config.out else default_out(config)
    with RunLock(run_dir):
        prepare_run_dir(config, run_dir)
        began = time.perf_counter()
        sim = build(config, options)
        evals: list[dict[str, Any]] = []
        stop_reason = None
        try:
            stop_reason = run_events(sim, evals, options.progress)
        except Deadlock as error:
            stop_reason = f"failed: {error}"
            raise
        finally:
            if sim.math is not None:
                evals.append(_evaluation(sim, "final"))
            elapsed = time.perf_counter() - began
            _write(run_dir, sim, evals, stop_reason, elapsed, options)
            for worker in sim.workers:  # the workers reference each other: free the rows now
                worker.rows = []        # rather than in a collection over millions of them
    return RunResult(run_dir, json.loads((run_dir / "summary.json").read_text()))


def run_events(sim: Simulation, evals: list[dict[str, Any]], progress: bool) -> str | None:
    """Run a built simulation to its end (`evals` collects the --math evaluations); raise
    `Deadlock` if the events run out with workers waiting. A run still going `--hang-timeout`
    simulated seconds after `--max-time` (an iteration longer than that: a parameter server
    whose link takes minutes per round at 1024 workers) is cut there: the reason is returned,
    and what it measured so far is summarised as for any run."""
    config, clock = sim.config, sim.clock
    for worker in sim.workers:
        sim.at(worker.rank, 0.0, worker.start)
    if sim.math is not None:
        clock.at(0.0, _evaluate, sim, evals)
    horizon = (config.max_time or math.inf) + config.hang_timeout
    total = config.max_time if config.max_time is not None else float(config.max_iterations or 1)
    bar = tqdm(total=total, unit="s" if config.max_time is not None else "it",
               desc=f"simulating {config.label}", leave=False, disable=not progress,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit}")
    gc.disable()  # millions of short-lived events: the cyclic collector would rescan them all
    step = (config.max_time or (config.max_iterations or 1) * config.step_time / 1000) / 100
    until = 0.0
    try:
        while True:
            until = min(until + step, horizon)
            if clock.run(until=until):
                break
            done = until if config.max_time is not None else min(
                w.iteration for w in sim.survivors)
            bar.update(done - bar.n)
            if until >= horizon:
                return (f"cut: not ended {config.hang_timeout:g} simulated s after --max-time "
                        f"({sim.stuck()})")
    finally:
        gc.enable()
        bar.close()
    sim.check_finished()
    return None


def _evaluate(sim: Simulation, evals: list[dict[str, Any]]) -> None:
    """The consensus model every `--eval-every` simulated seconds, while anything else runs."""
    row = _evaluation(sim, "consensus")
    evals.append(row)
    config = sim.config
    if config.target_loss is not None and row["loss"] <= config.target_loss and (
            config.stop_at_target):
        sim.target_reached = True
    if sim.clock.pending:
        sim.clock.after(config.eval_every, _evaluate, sim, evals)


def _evaluation(sim: Simulation, model: str) -> dict[str, Any]:
    assert sim.math is not None
    ranks = [w.rank for w in sim.workers if w.rank not in sim.declared]
    rows = ranks if sim.declared else None  # the survivors' consensus, as the evaluator's
    loss, accuracy = sim.math.evaluate(rows)
    row = {"t": sim.clock.now, "model": model, "loss": loss, "accuracy": accuracy,
           "iterations": [sim.workers[r].iteration for r in ranks],
           "consensus_distance": sim.math.consensus_distance(rows)}
    if rows is not None:
        row["ranks"] = ranks
    return row


#: The iteration `time_to_iteration` reports in simulated summaries (the scaling study's K).
TIME_TO_ITERATION = 100


def time_to_iteration(sim: Simulation, k: int) -> dict[str, Any]:
    """When the median and the last worker completed iteration `k` (None: not reached)."""
    survivors = sim.survivors
    times = sorted(w.rows[k - 1]["t"] for w in survivors if len(w.rows) >= k)
    reached = len(times) == len(survivors)
    return {"k": k, "median_s": round(times[len(times) // 2], 4) if 2 * len(times) > len(
        survivors) else None, "last_s": round(times[-1], 4) if reached else None}


def _write(run_dir: Path, sim: Simulation, evals: list[dict[str, Any]],
           stop_reason: str | None, elapsed: float, options: SimOptions) -> None:
    workers_dir = run_dir / "workers"
    workers_dir.mkdir(exist_ok=True)
    for worker in sim.workers:
        lines = [strict_json.dumps(row) for row in worker.rows]
        (workers_dir / f"rank{worker.rank}.jsonl").write_text(
            "\n".join(lines) + ("\n" if lines else ""))
    if evals:
        (run_dir / "eval.jsonl").write_text("".join(strict_json.dumps(e) + "\n" for e in evals))
    config = sim.config
    summary = summarize_rows([w.rows for w in sim.workers], evals, config, stop_reason)
    summary["engine"] = "simulator" + (" (math)" if sim.math is not None else "")
    summary["time_to_iteration_s"] = time_to_iteration(sim, TIME_TO_ITERATION)
    summary["lost_workers"] = sim.lost
    write_summary(run_dir, summary)
    services = {name: {"served": s.served, "busy_fraction": round(
        s.busy_s / sim.clock.now, 4) if sim.clock.now else 0.0, "service_s": s.service_s}
        for name, s in sim.services.items() if hasattr(s, "served")}
    simulation = {
        "engine": "simulator", "math": options.math,
        "modelled": {"compute": f"--step-time {config.step_time} ms x --slowdown "
                                f"{config.slowdown} + {sim.costs.overhead_s * 1e3:g} ms",
                     "network": config.network if config.network != "none" else
                     f"{LOCAL_NETWORK} (this machine's loopback)",
                     "payload_bytes": sim.costs.payload_bytes, "services": services},
        "simulated_s": sim.clock.now, "events": sim.clock.events,
        "wall_s": round(elapsed, 3),
    }
    (run_dir / "simulation.json").write_text(strict_json.dumps(simulation, indent=2) + "\n")
