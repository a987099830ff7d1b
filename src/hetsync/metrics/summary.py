"""The figures of a finished run, computed from its logs (docs/run-directory.md)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from hetsync.config import RunConfig
from hetsync.metrics import strict_json
from hetsync.metrics.atomic import write_text

__all__ = ["read_jsonl", "summarize", "summarize_rows", "thread_cpu_per_iteration",
           "time_to_target", "write_summary"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a torn last line (a killed writer) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def summarize(run_dir: Path, config: RunConfig, stop_reason: str | None) -> dict[str, Any]:
    """Build summary.json's content from the worker logs and eval.jsonl."""
    workers = [read_jsonl(run_dir / "workers" / f"rank{r}.jsonl") for r in range(config.workers)]
    return summarize_rows(workers, read_jsonl(run_dir / "eval.jsonl"), config, stop_reason)


def summarize_rows(workers: list[list[dict[str, Any]]], evals: list[dict[str, Any]],
                   config: RunConfig, stop_reason: str | None) -> dict[str, Any]:
    """`summarize` from rows already in memory (the simulator's, which never reads them back)."""
    iterations = [rows[-1]["iteration"] if rows else 0 for rows in workers]
    ends = [rows[-1]["t"] for rows in workers if rows]
    wall = max(ends) if ends else 0.0
    batch = config.batch_size or 0
    sync_wait = sum(row["sync_wait_s"] for rows in workers for row in rows)
    busy = sum(ends)
    crossing = time_to_target(evals, config.target_loss)
    final = next((row for row in reversed(evals) if row["model"] == "final"), None)
    measured = final if final is not None and final.get("loss") is not None else None
    samples_per_s = round(sum(iterations) * batch / wall, 2) if wall > 0 and batch else None
    ideal = ideal_samples_per_s(config)
    dropped = [row["dropped"] for rows in workers for row in rows if "dropped" in row]
    return {
        "protocol": config.protocol,
        "label": config.label or config.protocol,
        "workload": config.workload if not config.script else Path(config.script[0]).name,
        "workers": config.workers,
        "slowdown": config.slowdown,
        "network": config.network,
        "payload": config.payload,
        "step_time_ms": config.step_time,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "seed": config.seed,
        "wall_time_s": round(wall, 3),
        "iterations": iterations,
        "samples_per_s": samples_per_s,
        "ideal_samples_per_s": ideal,
        "ideal_fraction": round(samples_per_s / ideal, 4) if samples_per_s and ideal else None,
        "iterations_per_s": round(sum(iterations) / wall, 2) if wall > 0 else 0.0,
        "time_to_target_s": crossing[0] if crossing else None,
        "time_to_target_bracket_s": list(crossing[1:]) if crossing else None,
        "target_loss": config.target_loss,
        "final_loss": measured["loss"] if measured else _last_train_loss(workers),
        "final_accuracy": measured["accuracy"] if measured else None,
        "final_consensus_distance": final.get("consensus_distance") if final else None,
        "sync_wait_fraction": round(sync_wait / busy, 4) if busy > 0 else 0.0,
        "compute_ms_median": _compute_ms_median(workers),
        "dropped_gradients": int(sum(dropped)) if dropped else None,
        "thread_cpu_ms_per_iteration": thread_cpu_per_iteration(workers),
        "stop_reason": stop_reason,
    }


def time_to_target(
    evals: list[dict[str, Any]], target: float | None
) -> tuple[float, float, float] | None:
    """When the consensus loss first reached `target`, linearly interpolated between the last
    evaluation above it and the first at or below it, with those two times (the bracket: the
    crossing is known to lie between them). None if never reached; a target met by the first
    evaluation has the bracket [0, its time] and that time. A NaN loss (a diverged model) is
    no measurement: it never reaches the target."""
    if target is None:
        return None
    rows = sorted((row for row in evals if row["model"] in ("consensus", "final")
                   and strict_json.finite(row.get("loss")) is not None), key=lambda row: row["t"])
    above: dict[str, Any] | None = None
    for row in rows:
        if row["loss"] > target:
            above = row
            continue
        if above is None:
            return round(row["t"], 3), 0.0, round(row["t"], 3)
        fraction = (above["loss"] - target) / (above["loss"] - row["loss"])
        t = above["t"] + fraction * (row["t"] - above["t"])
        return round(t, 3), round(above["t"], 3), round(row["t"], 3)
    return None


def ideal_samples_per_s(config: RunConfig) -> float | None:
    """The sum of the workers' own speeds (emulated step time x mean slowdown): what a run
    would reach if no worker ever waited for another. None without an emulated step time, or
    under a `cpu:` slowdown: how fast the kernel's quota lets a worker go is not known here."""
    spec = config.slowdown_spec()
    if not config.step_time or not config.batch_size or spec.kind == "cpu":
        return None
    step_s = config.step_time / 1000.0
    speeds = [config.batch_size / (step_s * spec.mean_factor(r)) for r in range(config.workers)]
    return round(sum(speeds), 2)


def thread_cpu_per_iteration(workers: list[list[dict[str, Any]]]) -> dict[str, float] | None:
    """CPU milliseconds per iteration by thread role (the rows' `cpu_s` samples summed over
    the workers, over all their iterations): what each of a protocol's threads costs. None
    where no row carries a sample (the simulator, a run too short for one)."""
    spent: dict[str, float] = {}
    for rows in workers:
        for row in rows:
            for role, seconds in (row.get("cpu_s") or {}).items():
                spent[role] = spent.get(role, 0.0) + seconds
    iterations = sum(rows[-1]["iteration"] - rows[0]["iteration"] + 1 for rows in workers if rows)
    if not spent or not iterations:
        return None
    return {role: round(1000 * s / iterations, 3) for role, s in sorted(spent.items())}


def _compute_ms_median(workers: list[list[dict[str, Any]]]) -> float | None:
    """The median compute step over every worker's rows, in ms: with real compute, against
    one worker's alone, how much a protocol's own threads slow the training thread down."""
    steps = [row["compute_s"] for rows in workers for row in rows if "compute_s" in row]
    return round(1000 * statistics.median(steps), 3) if steps else None


def _last_train_loss(workers: list[list[dict[str, Any]]]) -> float | None:
    """Without an evaluation (a user's script), the mean of the workers' recent train losses."""
    tails = [row["loss"] for rows in workers for row in rows[-20:] if row.get("loss") is not None]
    return sum(tails) / len(tails) if tails else None


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    """Write summary.json atomically: a reader (report, bench --resume) never sees half."""
    path = run_dir / "summary.json"
    write_text(path, strict_json.dumps(summary, indent=2) + "\n")
    return path
