"""A real suite's second unit: its n workers each alone, all at the same time.

One worker alone on an otherwise idle machine (the `solo` run) is the ideal's unit. n of
them at once, each on the cores its rank has in the protocols' runs and nothing exchanged,
measure what the machine itself lets n computes do: shared caches and memory bandwidth, and
on a virtual machine vCPUs that may be one host core's hyperthreads (on the third lease, 8
alone at once on a 16-vCPU guest took 56-77 ms a step where one alone took 52.6). The real
suites set the protocols' rows against both units (hetsync.bench.results.real_ideals).

Each worker is a run of its own, a world of one (hetsync.launch.launcher.run), in a process
of its own whose affinity is the cores `plan_pinning` gives its rank plus one of the cores
the launcher gets: its own launcher's `--pin` then puts the worker on its rank's cores and
itself on the launcher's, as in the protocols' runs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

from hetsync.config import RunConfig, default_out
from hetsync.errors import WorkerFailed
from hetsync.launch.cpu_placement import plan_pinning
from hetsync.launch.launcher import RunResult
from hetsync.launch.launcher import run as launch
from hetsync.metrics import strict_json

__all__ = ["alone_cores", "combined_summary", "run_side_by_side"]

#: Beyond the run's time cap: each run's start (torch's import, the spawn) and its end.
MARGIN_S = 120.0


def alone_cores(workers: int, per_worker: int, available: set[int]) -> list[set[int]]:
    """Each rank's process's cores: its rank's in the protocols' pinning, and one of their
    launcher's (round robin), unless that launcher shares the last rank's cores."""
    pinning = plan_pinning(workers, per_worker, available)
    spare = [] if pinning.launcher_shares else sorted(pinning.launcher)
    return [set(own) | ({spare[rank % len(spare)]} if spare else set())
            for rank, own in enumerate(pinning.workers)]


def run_side_by_side(config: RunConfig) -> RunResult:
    """Run `config.workers` worlds of one at once, each pinned as its rank would be; their
    runs go to `config.out`/alone/rank<r>, and `config.out`/summary.json sums them up.
    WorkerFailed names the first rank whose run failed or outlived its time."""
    out = Path(config.out) if config.out else default_out(config)
    runs = [out / "alone" / f"rank{rank}" for rank in range(config.workers)]
    cores = alone_cores(config.workers, config.cpus_per_worker, os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")
    processes = []
    for rank, (own, run_dir) in enumerate(zip(cores, runs, strict=True)):
        values = {**config.to_dict(), "workers": 1, "out": run_dir}
        process = context.Process(target=_alone, args=(values, sorted(own)),
                                  name=f"alone-rank{rank}")
        process.start()
        processes.append(process)
    limit = (config.max_time or RunConfig.DEFAULT_MAX_TIME) + MARGIN_S
    deadline = time.monotonic() + limit
    try:
        for rank, process in enumerate(processes):
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                raise WorkerFailed(rank, f"(alone, side by side) was still running {limit:g} s "
                                   f"after its start; its run: {runs[rank]}")
            if process.exitcode != 0:
                raise WorkerFailed(rank, f"(alone, side by side) ended with exit code "
                                   f"{process.exitcode}; its run: {runs[rank]}")
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(10)
    summaries = [json.loads((run_dir / "summary.json").read_text()) for run_dir in runs]
    summary = combined_summary(summaries, config.workers, config.cpus_per_worker)
    (out / "summary.json").write_text(strict_json.dumps(summary, indent=2) + "\n")
    return RunResult(out, summary)


def _alone(values: dict[str, Any], cores: list[int]) -> None:
    """One rank's world of one, on `cores` (its own launcher pins within them)."""
    os.sched_setaffinity(0, cores)
    launch(RunConfig(**values))


def combined_summary(summaries: list[dict[str, Any]], workers: int,
                     cpus_per_worker: int) -> dict[str, Any]:
    """The runs' figures as one run's: samples/s summed, the median of their compute steps,
    each one's iterations; the first one's description (they differ only in their cores)."""
    first = summaries[0]
    computes = [s["compute_ms_median"] for s in summaries if s.get("compute_ms_median")]
    reasons = [s.get("stop_reason") or "" for s in summaries]
    return {
        **{key: first.get(key) for key in ("protocol", "label", "workload", "slowdown",
                                           "network", "payload", "step_time_ms", "batch_size",
                                           "lr", "seed", "target_loss")},
        "workers": workers,
        "side_by_side": True,
        "cpus_per_worker": cpus_per_worker,
        "wall_time_s": max(s["wall_time_s"] for s in summaries),
        "iterations": [s["iterations"][0] for s in summaries],
        "samples_per_s": round(sum(s["samples_per_s"] or 0 for s in summaries), 2),
        "samples_per_s_each": [s["samples_per_s"] for s in summaries],
        "compute_ms_median": round(statistics.median(computes), 3) if computes else None,
        "compute_ms_median_each": [s.get("compute_ms_median") for s in summaries],
        "time_to_target_s": None,  # n separate models: no one run's target
        "final_loss": None,
        "final_accuracy": None,
        "sync_wait_fraction": 0.0,
        "thread_cpu_ms_per_iteration": first.get("thread_cpu_ms_per_iteration"),
        "stop_reason": next((r for r in reasons if r != reasons[0]), reasons[0]),  # any cut
    }
