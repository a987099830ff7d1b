"""The `epochs` suite's report: wall time to the end of N epochs against the ideal.

A run of N epochs ends when the data is used (`--epochs`), so its measure is its wall time,
not a time to target. The ideal is N epochs of the data's whole batches at the sum of the
workers' own rates, each computing alone: with emulated compute the rates of the step times
(`--step-time` x each rank's `--slowdown` factor: the issue's 3.25x, what no measurement of
overheads moves), with real compute the solo runs' measured samples/s (one pinned worker
alone, and one alone at the straggler's CPU share). Every row is also set against All-Reduce
with the static sampler (DistributedSampler's shares, the setting's baseline) and, for a
dynamic row, against its own protocol with the static sampler (what dealing costs where it
cannot gain: homogeneous workers).

A script's setting (`Setting.script`, the language model of `epochs-lm`) counts batches, not
samples: its ideal is the epochs' batches (those its dynamic rows were dealt, every batch
once) at the step times' rates, and its final held-out loss the mean of its workers' own
test losses (their `result.json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

from hetsync.bench.runner import PlannedRun
from hetsync.bench.suites import Setting, Suite
from hetsync.report.colours import protocol_colour, rank_shades
from hetsync.report.plots import plt, slug
from hetsync.report.table import MISSING, percent, sig
from hetsync.slowdown import parse_slowdown
from hetsync.workloads import get_workload

__all__ = ["BASELINE", "epoch_figures", "epoch_lines", "epoch_table", "goal_lines",
           "plot_dealt"]

#: The row every speed-up is over: All-Reduce with DistributedSampler's fixed shares.
BASELINE = "allreduce static"
_COLUMNS = ("protocol", "wall time (s)", "ideal (s)", "of ideal", "speed-up vs "
            f"{BASELINE}", "time vs its static", "final held-out loss", "final accuracy",
            "samples per worker")


def epoch_figures(suite: Suite, settings: list[dict[str, Any]], runs: list[PlannedRun]) -> None:
    """Set each non-reference row's ideal, fraction of it and speed-ups, and the ranges over
    repeats of its wall time and final loss, in place."""
    assert suite.epochs is not None
    solo = {(s.workload, _kind(s)): out["results"][0]["samples_per_s"]
            for s, out in zip(suite.settings, settings, strict=True) if s.reference}
    for setting, out in zip(suite.settings, settings, strict=True):
        out["epochs"] = setting.options.get("epochs", suite.epochs)
        out["script"] = list(setting.script)
        if setting.reference:
            continue
        if setting.script:
            _script_losses(out["results"], [r for r in runs if r.setting == setting])
        ideal = ideal_seconds(setting, out["workers"], out["epochs"],
                              {kind: rate for (workload, kind), rate in solo.items()
                               if workload == setting.workload},
                              _dealt_batches(out["results"]) if setting.script else None)
        by_label = {row["label"]: row for row in out["results"]}
        base = by_label.get(BASELINE)
        out["ideal_s"], out["ideal_from"] = ideal
        for row in out["results"]:
            mine = [r for r in runs if r.setting == setting and r.variant.label == row["label"]]
            summaries = [json.loads((r.run_dir / "summary.json").read_text())
                         for r in mine if r.done]
            row["wall_time_range_s"] = _spread([s["wall_time_s"] for s in summaries])
            if not setting.script:
                row["final_loss_range"] = _spread([s["final_loss"] for s in summaries])
            wall = row["wall_time_s"]
            row["ideal_s"] = ideal[0]
            row["epoch_ideal_fraction"] = _ratio(ideal[0], wall)
            row["speedup_vs_baseline"] = _ratio(base and base["wall_time_s"], wall)
            static = by_label.get(row["label"].replace(" dynamic", " static"))
            row["time_vs_static"] = (_ratio(wall, static["wall_time_s"])
                                     if static is not row and static else None)
            batch = 1 if setting.script else summaries[0]["batch_size"] if summaries else None
            row["samples_per_worker"] = ([batch * i for i in row["iterations"]]
                                         if batch and row["iterations"] else None)


def ideal_seconds(setting: Setting, workers: int, epochs: int, solo: dict[str, float | None],
                  script_batches: int | None = None) -> tuple[float | None, str]:
    """N epochs of the data's whole batches at the sum of the workers' rates alone, and
    where the rates came from; a script's setting: its `script_batches` (all its epochs')."""
    if setting.script:
        if not script_batches or not setting.step_time:
            return None, "the step times and the dealt batches (no dynamic row done)"
        spec = parse_slowdown(setting.slowdown)
        total = sum(1000.0 / setting.step_time / spec.mean_factor(rank)
                    for rank in range(workers))
        return round(script_batches / total, 3), "the emulated step times"
    workload = get_workload(setting.workload or "digits")
    samples = epochs * (len(workload.load(None).train_y) // workload.batch_size
                        * workload.batch_size)
    spec = parse_slowdown(setting.slowdown)
    if setting.step_time:
        rate = 1000.0 * workload.batch_size / setting.step_time
        total = sum(rate / spec.mean_factor(rank) for rank in range(workers))
        return round(samples / total, 3), "the emulated step times"
    slowed = len(spec.ranks) if spec.kind == "cpu" else 0
    alone, at_share = solo.get("solo"), solo.get("share")
    if not alone or (slowed and not at_share):
        return None, "the solo runs (not all done)"
    total = (workers - slowed) * alone + slowed * (at_share or 0.0)
    return round(samples / total, 3), "the solo runs' samples/s"


#: The issue's goals (52): beside a straggler the dynamic sampler makes these families finish
#: at least 2.5x sooner than All-Reduce with DistributedSampler, within 10 % of the ideal;
#: homogeneous, no protocol more than 3 % slower with it than with DistributedSampler.
GAINING = ("adpsgd", "hop", "prague")
MIN_SPEEDUP, MIN_OF_IDEAL, MAX_HOMOGENEOUS_COST = 2.5, 0.9, 1.03


def goal_lines(results: dict[str, Any]) -> list[str]:
    """One line per setting against the goals, with the figures."""
    lines = []
    for setting in results["settings"]:
        if setting["reference"]:
            continue
        rows = [r for r in setting["results"] if r["repeats_done"]]
        base = next((r for r in rows if r["label"] == BASELINE), None)
        if setting["slowdown"] == "none":
            costs = [(r["time_vs_static"], r["label"]) for r in rows if r.get("time_vs_static")]
            if not costs:
                continue
            worst, label = max(costs)
            met = "met" if worst <= MAX_HOMOGENEOUS_COST else "not met"
            lines.append(f"- **{setting['name']}**: {met}: the dynamic sampler costs at most "
                         f"{100 * (worst - 1):+.1f} % of its protocol's static time ({label}; "
                         f"goal: at most +{100 * (MAX_HOMOGENEOUS_COST - 1):.0f} %).")
            continue
        for row in rows:
            family = row["label"].split("-")[0].split(" ")[0]
            if family not in GAINING or not row["label"].endswith(" dynamic"):
                continue
            speedup, of_ideal = row.get("speedup_vs_baseline"), row.get("epoch_ideal_fraction")
            # the 2.5x holds where the ideal is 3.25x (4 workers); elsewhere 10 % of the ideal
            floor = MIN_SPEEDUP if setting["workers"] >= 4 else 0.0
            met = ("met" if speedup and of_ideal and of_ideal >= MIN_OF_IDEAL
                   and speedup >= floor else "not met")
            lines.append(
                f"- **{setting['name']}**, {row['label']}: {met}: {_times(speedup)} sooner than "
                f"{BASELINE} (at the ideal: "
                f"{_times(_ratio(base and base['wall_time_s'], row['ideal_s']))}), "
                f"{percent(of_ideal)} of the ideal, "
                f"final held-out loss {_loss(row['final_loss'])} against "
                f"{_loss(base and base['final_loss'])}.")
    return lines


def epoch_table(setting: dict[str, Any]) -> str:
    columns = (*_COLUMNS[:-1], "batches per worker") if setting.get("script") else _COLUMNS
    lines = [columns, ("---",) * len(columns)]
    for row in setting["results"]:
        lines.append((
            row["label"],
            _with_range(row["wall_time_s"], row.get("wall_time_range_s"), _seconds),
            _seconds(row.get("ideal_s")), percent(row.get("epoch_ideal_fraction")),
            _times(row.get("speedup_vs_baseline")), _times(row.get("time_vs_static")),
            _with_range(row["final_loss"], row.get("final_loss_range"), _loss),
            percent(row["final_accuracy"]),
            ", ".join(map(str, row["samples_per_worker"])) if row.get("samples_per_worker")
            else MISSING,
        ))
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def epoch_lines(results: dict[str, Any], runs: list[PlannedRun], out: Path) -> list[str]:
    """results.md's sections after the headline: one table and one figure per setting."""
    sections = []
    for setting in results["settings"]:
        slowdown = setting["slowdown"]
        compute = (f"{setting['step_time']:g} ms emulated compute per iteration"
                   if setting["step_time"] else "real compute, workers pinned")
        if setting.get("script"):
            compute += f", the script `{' '.join(setting['script'])}` under hetsync launch"
        sections += [f"## {setting['name']}\n",
                     f"{setting['workers']} worker(s), {setting['epochs']} epochs, {compute}, "
                     f"slowdown `{slowdown}`."
                     + (f" Ideal from {setting['ideal_from']}." if "ideal_from" in setting
                        else "") + "\n"]
        if setting["reference"]:
            row = setting["results"][0]
            sections.append(f"Alone: {sig(row['samples_per_s'])} samples/s, "
                            f"{sig(row['wall_time_s'])} s.\n")
            continue
        sections.append(epoch_table(setting))
        figure = plot_dealt(setting, [r for r in runs if r.setting.name == setting["name"]],
                            out / "plots")
        if figure is not None:
            sections.append(f"![{setting['name']}: samples dealt per worker]"
                            f"(plots/{figure.name})\n")
    return sections


def plot_dealt(setting: dict[str, Any], runs: list[PlannedRun], out: Path) -> Path | None:
    """Samples taken per worker over time, one panel per protocol: the static sampler dashed,
    the dynamic one solid, each rank a shade of the protocol's colour (the first repeat of
    each)."""
    done = [r for r in runs if r.repeat == 0 and r.done]
    families = list(dict.fromkeys(r.variant.label.rsplit(" ", 1)[0] for r in done))
    if not families:
        return None
    columns = min(4, len(families))
    rows = -(-len(families) // columns)
    fig, axes = plt.subplots(rows, columns, squeeze=False, sharex=True, sharey=True,
                             figsize=(3.2 * columns, 2.6 * rows + 0.8))
    try:
        for ax, family in zip(axes.flat, families, strict=False):
            for run in done:
                name, sampler = run.variant.label.rsplit(" ", 1)
                if name != family:
                    continue
                batch = 1 if run.setting.script else (
                    run.config.batch_size or get_workload(run.config.workload).batch_size)
                workers = _worker_rows(run.run_dir)
                shades = rank_shades(protocol_colour(family, run.config.protocol), len(workers))
                for (rank, worker), colour in zip(workers, shades, strict=True):
                    ax.plot([0.0] + [r["t"] for r in worker],
                            [0] + [batch * r["iteration"] for r in worker],
                            drawstyle="steps-post", color=colour,
                            linestyle="-" if sampler == "dynamic" else "--",
                            label=f"rank {rank} {sampler}")
            ax.set_title(family, fontsize="medium")
            ax.grid(True, alpha=0.3)
        for ax in axes.flat[len(families):]:
            ax.set_visible(False)
        axes[0, 0].legend(fontsize="x-small")
        fig.supxlabel("wall-clock time (s)")
        taken = "batches" if setting.get("script") else "samples"
        fig.supylabel(f"{taken} taken")
        fig.suptitle(f"{setting['name']}: {taken} per worker (dashed: static, solid: dynamic)",
                     fontsize="medium")
        fig.tight_layout()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"dealt_{slug(setting['name'])}.png"
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _script_losses(rows: list[dict[str, Any]], runs: list[PlannedRun]) -> None:
    """A script's rows' final held-out loss: per run the mean of its workers' `value` in
    `result.json` (each worker's own model), the median over repeats and their range; no
    accuracy."""
    for row in rows:
        losses = [mean for mean in (_result_mean(r.run_dir / "script") for r in runs
                                    if r.variant.label == row["label"] and r.done)
                  if mean is not None]
        row["final_loss"] = round(median(losses), 4) if losses else None
        row["final_loss_range"] = _spread(losses)
        row["final_accuracy"] = None


def _result_mean(folder: Path) -> float | None:
    values = [json.loads(p.read_text())["value"] for p in sorted(folder.glob("rank*/result.json"))]
    return sum(values) / len(values) if values else None


def _dealt_batches(rows: list[dict[str, Any]]) -> int | None:
    """All the epochs' batches of a script, as its dynamic rows were dealt them: the fewest
    (each batch once where dealt; a lock-step protocol's equal shares pad the last)."""
    dealt = [sum(r["iterations"]) for r in rows
             if r["label"].endswith(" dynamic") and r["repeats_done"] and r["iterations"]]
    return min(dealt) if dealt else None


def _worker_rows(run_dir: Path) -> list[tuple[int, list[dict[str, Any]]]]:
    """Each rank's per-iteration rows (`workers/rank{r}.jsonl`: iteration and time), in time
    order."""
    ranks = []
    for path in sorted((run_dir / "workers").glob("rank*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        ranks.append((int(path.stem.removeprefix("rank")), sorted(rows, key=lambda r: r["t"])))
    return sorted(ranks)


def _kind(setting: Setting) -> str:
    return "share" if setting.slowdown != "none" else "solo"


def _spread(values: list[float | None]) -> list[float] | None:
    present = [v for v in values if v is not None]
    return [round(min(present), 4), round(max(present), 4)] if len(present) > 1 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _times(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def _loss(value: float | None) -> str:
    return MISSING if value is None else f"{value:.3f}"


def _with_range(value: float | None, spread: list[float] | None, show: Any) -> str:
    text = show(value)
    return text + (f" ({show(spread[0])}-{show(spread[1])})" if spread else "")
