"""results.md: the headline, one table per setting, and the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetsync.bench.epochs import epoch_lines, goal_lines
from hetsync.bench.plots import plot_speedups
from hetsync.bench.regime_map import plot_regime_map, regime_cells
from hetsync.bench.results import speedup
from hetsync.bench.runner import PlannedRun
from hetsync.bench.scaling import scaling_lines
from hetsync.bench.suites import PAPER_PRAGUES, PAPER_RATIOS
from hetsync.report import write_report
from hetsync.report.plots import slug
from hetsync.report.table import MISSING, iteration_spread, percent, sig, thread_cpu
from hetsync.simulator.run import TIME_TO_ITERATION

__all__ = ["format_speedup", "headline_lines", "setting_table", "write_markdown"]

_COLUMNS = ("protocol", "time to target (s)", "speed-up vs allreduce", "speed-up vs ddp",
            "samples/s", "throughput vs allreduce", "of ideal", "final accuracy", "sync wait")


def format_speedup(ratio: dict[str, Any] | None) -> str:
    if ratio is None:
        return MISSING
    prefix = {"exact": "", "at least": "≥ ", "at most": "≤ "}[ratio["kind"]]
    return f"{prefix}{ratio['value']:.2f}x"


def _time(row: dict[str, Any]) -> str:
    if row["not_applicable"]:
        return f"n/a: {row['not_applicable']}"
    if not row["repeats_done"]:
        return "failed" if row["repeats_failed"] else "not run"
    text = (f"{row['time_to_target_s']:.1f}" if row["time_to_target_s"] is not None
            else f"not reached (> {row['time_to_target_above_s']:.0f})")
    if row["repeats_done"] > 1:
        text += f" ({row['reached_target']}/{row['repeats_done']} reached)"
    return text


def _ratio(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}x"


def setting_table(setting: dict[str, Any]) -> str:
    """A markdown table of one setting's rows."""
    lines = [_COLUMNS, ("---",) * len(_COLUMNS)]
    for row in setting["results"]:
        lines.append((
            row["label"], _time(row), format_speedup(row["speedup_vs_allreduce"]),
            format_speedup(row["speedup_vs_ddp"]), sig(row["samples_per_s"]),
            _ratio(row["throughput_vs_allreduce"]), percent(row["ideal_fraction"]),
            percent(row["final_accuracy"]), percent(row["sync_wait_fraction"]),
        ))
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


_REAL_COLUMNS = ("protocol", "time to target (s)", "samples/s", "of ideal", "of alone at once",
                 "compute step (ms)", "compute inflation", "compute vs alone at once",
                 "iterations (min / median / max)",
                 "CPU ms per iteration, by thread", "final accuracy", "sync wait")


_REAL_UNITS = (
    ", each measured alone (the `solo` runs, pinned the same way); \"compute inflation\" is the "
    "median compute step over the solo one's; \"of alone at once\" and \"compute vs alone at "
    "once\" set them against the n workers each alone at the same time, on the same cores "
    "(the machine's own limit); with repeats, each fraction is the median over the rounds of "
    "a run against its own round's references, the range over the rounds in brackets. Real "
    "compute and real CPU quotas: nothing emulated")
_ALONE = ", each alone (a world of one), all at the same time"


def real_table(setting: dict[str, Any]) -> str:
    """A real suite's table: against one worker alone (the ideal, the compute step), and where
    each worker's CPU went."""
    lines = [_REAL_COLUMNS, ("---",) * len(_REAL_COLUMNS)]
    for row in setting["results"]:
        lines.append((
            row["label"], _time(row), sig(row["samples_per_s"]),
            _with_range(row, "ideal_fraction"), _with_range(row, "alone_at_once_fraction"),
            sig(row["compute_ms_median"]), _ratio(row.get("compute_inflation")),
            _ratio(row.get("alone_at_once_inflation")), iteration_spread(row["iterations"]),
            thread_cpu(row["thread_cpu_ms_per_iteration"]), percent(row["final_accuracy"]),
            percent(row["sync_wait_fraction"]),
        ))
    return "\n".join("| " + " | ".join(line) + " |" for line in lines) + "\n"


def _with_range(row: dict[str, Any], key: str) -> str:
    """A fraction, and with repeats its range over the rounds, and how many rounds it rests
    on where that is fewer than the repeats done: "93.9% (86.9-97.3)", "95.0% (1 of 3
    rounds)"."""
    value, rounds = row.get(key), row.get(f"{key}_rounds")
    notes = []
    if spread := row.get(f"{key}_range"):
        notes.append("-".join(f"{100 * v:.1f}" for v in spread))
    if value is not None and rounds == 0:
        notes.append("no round with its references: of the medians")
    elif value is not None and rounds is not None and rounds < row["repeats_done"]:
        notes.append(f"{rounds} of {row['repeats_done']} rounds")
    return percent(value) + (f" ({'; '.join(notes)})" if notes else "")


def headline_lines(results: dict[str, Any]) -> list[str]:
    """One sentence per setting: who wins, and by how much over All-Reduce and DDP."""
    lines = []
    for h in results["headline"]:
        if h["by"] == "time to target":
            what = f"reaches the target first, in {h['time_to_target_s']:.1f} s"
            ratios = [f"{format_speedup(h[f'speedup_vs_{b}'])} {b}" for b in ("allreduce", "ddp")
                      if h[f"speedup_vs_{b}"]]
        else:
            what = f"has the highest throughput ({h['samples_per_s']:.0f} samples/s; nobody " \
                   "reached the target)"
            ratios = [f"{_ratio(h[f'throughput_vs_{b}'])} {b}" for b in ("allreduce", "ddp")
                      if h[f"throughput_vs_{b}"]]
        lines.append(f"- **{h['setting']}**: {h['winner']} {what}"
                     + (f" ({', '.join(ratios)})" if ratios else "") + ".")
    return lines


def _run_figures(setting: dict[str, Any], runs: list[PlannedRun], out: Path) -> list[str]:
    """The first repeat of each variant, plotted together; markdown lines that show them."""
    done = [r for r in runs if r.repeat == 0 and r.done and r.setting.name == setting["name"]]
    if not done:
        return []
    folder = out / "plots" / slug(setting["name"])
    write_report([r.run_dir for r in done], folder)
    rel = folder.relative_to(out)
    lines = []
    for stem, caption in (("loss_vs_time", "consensus test loss"),
                          ("iterations_vs_time", "iterations per worker (band: slowest to "
                           "fastest worker)"),
                          ("consensus_distance_vs_time", "consensus distance")):
        if (folder / f"{stem}.png").is_file():
            lines.append(f"![{setting['name']}: {caption}]({rel}/{stem}.png)\n")
    per_worker = sorted(folder.glob("iterations_per_worker_*.png"))
    if per_worker:
        links = ", ".join(f"[{p.stem.removeprefix('iterations_per_worker_')}]({rel}/{p.name})"
                          for p in per_worker)
        lines.append(f"Iterations of each worker, per run: {links}. All runs' figures and "
                     f"their full table: [{rel}/report.md]({rel}/report.md).\n")
    return lines


def regime_lines(results: dict[str, Any], out: Path) -> list[str]:
    """The regime map (figure and tables) of a regime suite; nothing for other suites."""
    path = plot_regime_map(results, out / "plots")
    if path is None:
        return []
    lines = ["## Regime map\n", "Per cell the winner (first to the target, else the highest "
             "throughput) and its speed-up over allreduce (\"thr.\": in throughput).\n",
             f"![regime map](plots/{path.name})\n"]
    for (het, workers), cells in regime_cells(results).items():
        payloads = list(dict.fromkeys(c["payload"] for c in cells))
        lines.append(f"**{het}, {workers}**\n")
        rows = ["| network \\ payload | " + " | ".join(payloads) + " |",
                "| --- |" + " --- |" * len(payloads)]
        for network in dict.fromkeys(c["network"] for c in cells):
            by_payload = {c["payload"]: c for c in cells if c["network"] == network}
            rows.append(f"| {network} | " + " | ".join(
                f"{by_payload[p]['winner']} {by_payload[p]['text']}" if p in by_payload
                else MISSING for p in payloads) + " |")
        lines.append("\n".join(rows) + "\n")
    return lines


def paper_lines(results: dict[str, Any]) -> list[str]:
    """The Prague paper's four headline ratios beside the measured ones (suite `paper`)."""
    if results["suite"] != "paper":
        return []
    settings = {s["name"]: {r["label"]: r for r in s["results"]} for s in results["settings"]}
    rows = ["| setting | Prague over | paper | prague-paper (the paper's loop) | prague (default: "
            "ready groups, overlapped) | prague-paper-overlap (paper's groups, overlapped) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for setting, baseline, paper in PAPER_RATIOS:
        by_label = settings.get(setting, {})
        base = by_label.get(baseline)
        cells = []
        for label in PAPER_PRAGUES:
            row = by_label.get(label)
            ratio = speedup(base, row) if base and row else None
            throughput = (row["samples_per_s"] / base["samples_per_s"]) if (
                base and row and base["samples_per_s"] and row["samples_per_s"]) else None
            cells.append(f"{format_speedup(ratio)} (throughput {_ratio(throughput)})")
        rows.append(f"| {setting} | {baseline} | {paper:.1f}x | " + " | ".join(cells) + " |")
    return ["## The paper's ratios\n", "Time-to-target speed-ups (throughput ratios in "
            "brackets) against the Prague paper's headline figures; the setting is "
            "reconstructed, see the suite's description. The paper's figures compare with "
            "`prague-paper`, its own loop; the overlapped variants make D-PSGD's "
            "combine-then-adapt update on one-step-stale averages.\n", "\n".join(rows) + "\n"]


def legend_lines(runs: list[PlannedRun]) -> list[str]:
    """What each variant whose label could mislead is (overlapped Prague is not the paper's)."""
    about = {r.variant.label: r.variant.about for r in runs if r.variant.about}
    if not about:
        return []
    return ["## Variants\n", "\n".join(f"- `{label}`: {text}" for label, text in about.items())
            + "\n"]


def _compute(step_time: float | None, options: dict[str, Any]) -> str:
    step_time = options["step_time"] if step_time is None else step_time
    return f"{step_time:g} ms emulated compute per iteration" if step_time else "real compute"


def workloads_line(results: dict[str, Any], targets: dict[str, float]) -> str:
    """The settings' workloads with their target losses ("target" unset where none ran)."""
    names = list(dict.fromkeys(s["workload"] for s in results["settings"]))
    parts = [f"{name} (target loss {targets[name]:g})" if name in targets else name
             for name in names]
    return ("Workload " if len(parts) == 1 else "Workloads ") + ", ".join(parts)


def write_markdown(results: dict[str, Any], runs: list[PlannedRun], out: Path,
                   command: str) -> Path:
    """Write out/results.md (and its plots under out/plots/); return its path."""
    (out / "plots").mkdir(parents=True, exist_ok=True)
    if results.get("epochs"):
        return _write_epochs(results, runs, out, command)
    o = results["options"]
    targets = {s["workload"]: row["target_loss"] for s in results["settings"]
               for row in s["results"] if row["target_loss"] is not None}
    sections = [
        f"# hetsync bench: suite `{results['suite']}`\n",
        f"Suite: {results['description']}. Regenerate with `{command}`.\n",
        f"{workloads_line(results, targets)}, at most {results['max_time_s']:g} s per run, "
        f"{o['repeats']} repeat(s) (seeds {o['seed']}..{o['seed'] + o['repeats'] - 1}; medians "
        f"shown), {results['runs_done']} of {results['runs_total']} runs done. Speed-ups are "
        "ratios of time to target; \"≥\" marks a bound where the baseline never reached the "
        "target in its run; \"of ideal\" is the throughput over the sum of the workers' own "
        "speeds" + (_REAL_UNITS if results.get("real") else "") + ".\n",
        *(["Simulated (`hetsync simulate`, docs/simulator.md): times are simulated seconds, "
           "compute is the step time x slowdown, every message is charged by the network "
           "model (the machine's loopback where no network is emulated), and the protocols' "
           "own cores decide.\n"] if results.get("simulated") else []),
        "## Headline\n",
        "\n".join(headline_lines(results)) + "\n",
        *legend_lines(runs),
    ]
    sections += regime_lines(results, out)
    if results.get("simulated"):
        sections += scaling_lines(results, out, TIME_TO_ITERATION)
    sections += paper_lines(results)
    bars = plot_speedups(results, out / "plots")
    if bars is not None:
        sections.append(f"![speed-up over allreduce](plots/{bars.name})\n")
    for setting in results["settings"]:
        network = setting.get("network", "none")
        emulated = (f" Emulated network `{network}`, messages charged as a "
                    f"`{setting.get('payload', 'none')}` model (times from the declared size, "
                    "loss from the workload's real model)." if network != "none" else "")
        if results.get("real"):
            sections += [
                f"## {setting['name']}\n",
                f"{setting['workers']} worker(s) pinned to cores of their own"
                f"{_ALONE if setting.get('side_by_side') else ''}, real compute (no emulated "
                f"step), slowdown `{setting['slowdown']}` (a real CPU quota).\n",
                real_table(setting),
                *([] if setting["reference"] else _run_figures(setting, runs, out)),
            ]
            continue
        sections += [
            f"## {setting['name']}\n",
            f"{setting['workers']} workers, {_compute(setting.get('step_time'), o)}, slowdown "
            f"`{setting['slowdown']}`.{emulated}\n",
            setting_table(setting),
            # A simulated suite's runs have up to thousands of workers: its scaling figure
            # says what per-run figures would, which would take minutes to draw.
            *([] if results.get("simulated") else _run_figures(setting, runs, out)),
        ]
    path = out / "results.md"
    path.write_text("\n".join(sections), encoding="utf-8")
    return path


def _write_epochs(results: dict[str, Any], runs: list[PlannedRun], out: Path,
                  command: str) -> Path:
    """An epochs suite's results.md: the goals, then per setting its table and figure."""
    o = results["options"]
    sections = [
        f"# hetsync bench: suite `{results['suite']}`\n",
        f"Suite: {results['description']}. Regenerate with `{command}`.\n",
        f"Each run trains the epochs its setting says (at most {results['max_time_s']:g} s), "
        f"{o['repeats']} repeat(s) (seeds {o['seed']}..{o['seed'] + o['repeats'] - 1}; medians "
        f"shown, the range over repeats in brackets), {results['runs_done']} of "
        f"{results['runs_total']} runs done. Wall time: the run's, to the end of its epochs "
        "(summary.json `wall_time_s`); the ideal: the epochs' whole batches at the sum of the "
        "workers' rates alone; speed-ups: wall-time ratios; \"time vs its static\": a "
        "dynamic row's wall time over its protocol's with the static sampler.\n",
        "## Goals\n", "\n".join(goal_lines(results)) + "\n",
        *legend_lines(runs),
        *epoch_lines(results, runs, out),
    ]
    path = out / "results.md"
    path.write_text("\n".join(sections), encoding="utf-8")
    return path
