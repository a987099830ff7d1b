"""A suite's figures: per setting and variant, the median over repeats, and ratios to the
All-Reduce and DDP rows of the same setting.

Ratios are of medians (a real suite's fractions of its ideal excepted: taken round by round
against the same round's references, then the median, `real_ideals`). A run that stopped at
its time cap without reaching the target has an unknown time to target above its run time,
so a speed-up against it is a bound ("at least" or "at most"), never a made-up number.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from statistics import median
from typing import Any

from hetsync.bench.epochs import epoch_figures
from hetsync.bench.runner import FAILED_FILE, BenchOptions, PlannedRun
from hetsync.bench.suites import Setting, Suite, Variant
from hetsync.metrics import strict_json
from hetsync.slowdown import parse_slowdown

__all__ = ["BASELINES", "collect", "headline", "speedup", "write_results"]

BASELINES = ("allreduce", "ddp")
_MEDIANS = ("samples_per_s", "ideal_samples_per_s", "ideal_fraction", "final_accuracy",
            "final_loss", "sync_wait_fraction", "wall_time_s", "compute_ms_median")


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(median(present), 4) if present else None


def aggregate(variant: Variant, runs: list[PlannedRun], root: Path) -> dict[str, Any]:
    """One row: the medians of the variant's finished repeats in one setting."""
    by_repeat = {r.repeat: json.loads((r.run_dir / "summary.json").read_text())
                 for r in runs if r.done}
    summaries = list(by_repeat.values())
    failed = [r for r in runs if not r.done and (r.run_dir / FAILED_FILE).is_file()]
    row: dict[str, Any] = {
        "label": variant.label,
        "options": dict(variant.options),
        "runs": [str(r.run_dir.relative_to(root)) for r in runs],
        "repeats_done": len(summaries),
        "repeats_failed": len(failed),
        "errors": [(r.run_dir / FAILED_FILE).read_text().strip() for r in failed],
        "not_applicable": next((r.not_applicable for r in runs if r.not_applicable), None),
    }
    times = [s["time_to_target_s"] if s["time_to_target_s"] is not None else math.inf
             for s in summaries]
    ttt = median(times) if times else math.inf
    row["reached_target"] = sum(t < math.inf for t in times)
    row["time_to_target_s"] = round(ttt, 3) if ttt < math.inf else None
    # Not reached: the target lies beyond the time these runs trained for.
    row["time_to_target_above_s"] = (
        _median([s["wall_time_s"] for s in summaries]) if summaries and ttt == math.inf else None
    )
    for key in _MEDIANS:
        row[key] = _median([s.get(key) for s in summaries])
    row["target_loss"] = summaries[0]["target_loss"] if summaries else None
    # Shown as measured in the first repeat: how even the workers' iterations were (a starved
    # worker shows here), and what each thread cost.
    row["iterations"] = summaries[0].get("iterations") if summaries else None
    row["thread_cpu_ms_per_iteration"] = (summaries[0].get("thread_cpu_ms_per_iteration")
                                          if summaries else None)
    row["time_to_iteration_s"] = _median([(s.get("time_to_iteration_s") or {}).get("median_s")
                                          for s in summaries])  # simulated runs only
    # Round by round (a repeat's runs all ran in one round: runner.in_rounds), for the real
    # suites' ratios to the references of the same round.
    row["by_round"] = {"samples_per_s": {str(r): s.get("samples_per_s")
                                         for r, s in sorted(by_repeat.items())}}
    return row


def speedup(base: dict[str, Any], row: dict[str, Any]) -> dict[str, Any] | None:
    """Time to target of `base` over that of `row`, as {"value", "kind"}: kind "exact",
    "at least" (base never reached it) or "at most" (row never reached it)."""
    b, t = base["time_to_target_s"], row["time_to_target_s"]
    if b and t:
        return {"value": round(b / t, 3), "kind": "exact"}
    if t and base["time_to_target_above_s"]:
        return {"value": round(base["time_to_target_above_s"] / t, 3), "kind": "at least"}
    if b and row["time_to_target_above_s"]:
        return {"value": round(b / row["time_to_target_above_s"], 3), "kind": "at most"}
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def collect_setting(setting: Setting, suite: Suite, runs: list[PlannedRun],
                    root: Path) -> dict[str, Any]:
    rows = [aggregate(v, [r for r in runs if r.setting == setting and r.variant == v], root)
            for v in suite.variants_of(setting)]
    by_label = {row["label"]: row for row in rows}
    for row in rows:
        for name in BASELINES:
            base = by_label.get(name)
            row[f"speedup_vs_{name}"] = speedup(base, row) if base else None
            row[f"throughput_vs_{name}"] = (
                _ratio(row["samples_per_s"], base["samples_per_s"]) if base else None
            )
    first = runs[0].config if runs else None
    return {
        "name": setting.name,
        "workload": first.workload if first else setting.workload,
        "reference": setting.reference,
        "side_by_side": setting.side_by_side,
        "step_time": first.step_time if first else setting.step_time,
        "slowdown": setting.slowdown,
        "network": first.network if first else setting.network,
        "payload": first.payload if first else setting.payload,
        "regime": list(setting.regime),
        "workers": first.workers if first else setting.workers,
        "results": rows,
    }


def headline(setting: dict[str, Any]) -> dict[str, Any] | None:
    """The winner of a setting: first to the target (ties: higher throughput), or, if nobody
    reached it, the highest throughput."""
    rows = [row for row in setting["results"] if row["repeats_done"]]
    if not rows:
        return None
    reached = [row for row in rows if row["time_to_target_s"] is not None]
    if reached:
        best = min(reached, key=lambda r: (r["time_to_target_s"], -(r["samples_per_s"] or 0)))
        by = "time to target"
    else:
        best = max(rows, key=lambda r: r["samples_per_s"] or 0)
        by = "throughput"
    return {"setting": setting["name"], "winner": best["label"], "by": by,
            "time_to_target_s": best["time_to_target_s"], "samples_per_s": best["samples_per_s"],
            **{f"speedup_vs_{b}": best[f"speedup_vs_{b}"] for b in BASELINES},
            **{f"throughput_vs_{b}": best[f"throughput_vs_{b}"] for b in BASELINES}}


def real_ideals(suite: Suite, settings: list[dict[str, Any]]) -> None:
    """A real suite's ideal, from its reference runs: each worker computing alone, so n times
    one worker's throughput alone, with a worker at a CPU share counted at its own measured
    alone at that share; and each row's compute inflation, its median compute step over one
    worker's alone. Where the suite ran its n workers alone at once (`Setting.side_by_side`),
    each row is also set against that, the machine's own limit: n times their mean rate (a
    worker at a share again counted at its own alone), and their median compute step. With
    repeats, each fraction is taken round by round against that round's references, then
    the median (`_fractions`). Set in place on the rows of the non-reference settings."""
    alone = {(s.workload, _reference_kind(s)): out
             for s, out in zip(suite.settings, settings, strict=True) if s.reference}
    for setting, out in zip(suite.settings, settings, strict=True):
        if setting.reference:
            continue
        n = out["workers"]
        refs = [alone.get((setting.workload, kind)) for kind in ("solo", "share", "side")]
        if refs[2] is not None and refs[2]["workers"] != n:
            refs[2] = None  # n alone at once is the unit of n workers only
        solo, slow, side = (ref["results"][0] if ref else None for ref in refs)
        slowed = len(parse_slowdown(setting.slowdown).ranks)
        ideal = _ideals(n, slowed, solo, slow, None)
        at_once = _ideals(n, slowed, side, slow, n)
        for row in out["results"]:
            row["ideal_samples_per_s"] = _rounded(ideal["median"])
            row.update(_fractions("ideal_fraction", row, ideal))
            row["compute_inflation"] = _ratio(row["compute_ms_median"],
                                              solo and solo["compute_ms_median"])
            row["alone_at_once_samples_per_s"] = _rounded(at_once["median"])
            row.update(_fractions("alone_at_once_fraction", row, at_once))
            row["alone_at_once_inflation"] = _ratio(row["compute_ms_median"],
                                                    side and side["compute_ms_median"])


def _ideals(workers: int, slowed: int, unit: dict[str, Any] | None,
            slow: dict[str, Any] | None, of: int | None) -> dict[str, Any]:
    """The ideal from the `unit` reference row (one worker alone; or, with `of`, that many
    alone at once, whose rate is shared among them) and the `slow` one (alone at the
    straggler's share): from the references' medians ("median"), and from each round's own
    references ("rounds": {repeat: ideal or None})."""
    def ideal(unit_rate: float | None, slow_rate: float | None) -> float | None:
        each = unit_rate / of if unit_rate and of else unit_rate
        return _ideal(workers, slowed, each, slow_rate)

    def rate(row: dict[str, Any] | None, repeat: str) -> float | None:
        return row["by_round"]["samples_per_s"].get(repeat) if row else None

    rounds = {repeat: ideal(rate(unit, repeat), rate(slow, repeat))
              for repeat in (unit["by_round"]["samples_per_s"] if unit else {})}
    return {"median": ideal(unit and unit["samples_per_s"], slow and slow["samples_per_s"]),
            "rounds": rounds}


def _fractions(key: str, row: dict[str, Any], ideal: dict[str, Any]) -> dict[str, Any]:
    """A row's fraction of `ideal`: each round's samples/s over that round's own ideal, then
    the median over rounds, so that a machine whose speed drifts between rounds slows a
    protocol and its references alike; with the range over rounds beside it (a spread wider
    than the distance between two rows says the machine, not the protocols, set it), and
    how many rounds it rests on (`<key>_rounds`: a round whose reference failed drops out; 0:
    no round had its references, and the ratio of the medians stands in). A repeat that
    `--resume` ran later is paired with its round's references all the same."""
    fractions = [_ratio(samples, ideal["rounds"].get(repeat))
                 for repeat, samples in row["by_round"]["samples_per_s"].items()]
    present = [f for f in fractions if f is not None]
    if not present:
        return {key: _ratio(row["samples_per_s"], ideal["median"]), f"{key}_range": None,
                f"{key}_rounds": 0}
    spread = [min(present), max(present)] if len(present) > 1 else None
    return {key: round(median(present), 3), f"{key}_range": spread,
            f"{key}_rounds": len(present)}


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value else None


def _reference_kind(setting: Setting) -> str:
    return "side" if setting.side_by_side else "share" if setting.slowdown != "none" else "solo"


def _ideal(workers: int, slowed: int, rate: float | None, slow_rate: float | None) -> float | None:
    """`workers` at `rate` each, `slowed` of them at `slow_rate` instead; None if unknown."""
    if not rate or (slowed and not slow_rate):
        return None
    return (workers - slowed) * rate + slowed * (slow_rate or 0)


def collect(suite: Suite, options: BenchOptions, runs: list[PlannedRun],
            root: Path) -> dict[str, Any]:
    settings = [collect_setting(s, suite, [r for r in runs if r.setting == s], root)
                for s in suite.settings]
    if suite.real:
        real_ideals(suite, settings)
    if suite.epochs is not None:
        epoch_figures(suite, settings, runs)
    return {
        "suite": suite.name,
        "description": suite.description,
        "options": asdict(options),
        "max_time_s": runs[0].config.max_time if runs else None,
        "simulated": options.simulate or suite.simulated,
        "real": suite.real,
        "epochs": suite.epochs,
        "runs_done": sum(r.done for r in runs),
        "runs_total": len(runs),
        "headline": [h for h in map(headline, (s for s in settings if not s["reference"]))
                     if h is not None],
        "settings": settings,
    }


def write_results(results: dict[str, Any], out: Path) -> Path:
    path = out / "results.json"
    path.write_text(strict_json.dumps(results, indent=2) + "\n")
    return path
