"""Markdown summary table comparing runs side by side."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

from hetsync.report.runs import Run

MISSING = "-"


def sig(x: float | None) -> str:
    """Three significant digits, but never scientific notation for large values."""
    if x is None:
        return MISSING
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def seconds(x: float | None) -> str:
    return MISSING if x is None else f"{x:.1f}"


def percent(fraction: float | None) -> str:
    return MISSING if fraction is None else f"{100 * fraction:.1f}%"


def ratio(numerator: float | None, denominator: float | None) -> str:
    """`numerator / denominator` as "1.23x", or "-" when either side is missing or zero."""
    if not numerator or not denominator:
        return MISSING
    return f"{numerator / denominator:.2f}x"


def setting(value: Any) -> str:
    """Render a configuration value (number, string or structure) compactly."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        return sig(value)
    if isinstance(value, int | str):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def iteration_spread(iterations: list[int] | None) -> str:
    """min / median / max iterations over workers: the gap shows how unequal they were."""
    if not iterations:
        return MISSING
    return f"{min(iterations)} / {statistics.median(iterations):g} / {max(iterations)}"


def thread_cpu(per_thread: dict[str, float] | None) -> str:
    """"training 52, hop-updates 4.1, other 9.3": each thread role's CPU ms per iteration."""
    if not per_thread:
        return MISSING
    return ", ".join(f"{role} {sig(ms)}" for role, ms in per_thread.items())


def time_to_target(x: float | None) -> str:
    return "not reached" if x is None else seconds(x)


_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("protocol", lambda s: setting(s.get("protocol"))),
    ("workload", lambda s: setting(s.get("workload"))),
    ("workers", lambda s: setting(s.get("workers"))),
    ("slowdown", lambda s: setting(s.get("slowdown"))),
    ("network (emulated)", lambda s: setting(s.get("network", "none"))
     + ("" if s.get("payload", "none") == "none" else f", payload {s['payload']}")),
    ("stopped by", lambda s: setting(s.get("stop_reason"))),
    ("workers lost", lambda s: ", ".join(f"rank {w['rank']} at {seconds(w.get('at_s'))} s"
                                         for w in s.get("lost_workers") or []) or "-"),
    ("wall time (s)", lambda s: seconds(s.get("wall_time_s"))),
    ("samples/s", lambda s: sig(s.get("samples_per_s"))),
    ("time to target (s)", lambda s: time_to_target(s.get("time_to_target_s"))),
    ("target loss", lambda s: sig(s.get("target_loss"))),
    ("final loss", lambda s: sig(s.get("final_loss"))),
    ("final accuracy", lambda s: percent(s.get("final_accuracy"))),
    ("final consensus distance", lambda s: sig(s.get("final_consensus_distance"))),
    ("sync wait (%)", lambda s: percent(s.get("sync_wait_fraction"))),
    ("iterations (min / median / max)", lambda s: iteration_spread(s.get("iterations"))),
    ("CPU ms per iteration, by thread", lambda s: thread_cpu(s.get("thread_cpu_ms_per_iteration"))),
]


def _cell(text: str) -> str:
    """Keep a value from breaking the markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def summary_table(runs: list[Run]) -> str:
    """A markdown table with one row per run; with several runs, ratios to the first one."""
    header = ["run"] + [name for name, _ in _COLUMNS]
    rows = [[run.label] + [render(run.summary) for _, render in _COLUMNS] for run in runs]
    if len(runs) > 1:
        base = runs[0].summary
        header += [f"speedup vs {runs[0].label}", f"throughput vs {runs[0].label}"]
        for row, run in zip(rows, runs, strict=True):
            row += [
                ratio(base.get("time_to_target_s"), run.summary.get("time_to_target_s")),
                ratio(run.summary.get("samples_per_s"), base.get("samples_per_s")),
            ]
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(_cell(c) for c in line) + " |" for line in lines) + "\n"
