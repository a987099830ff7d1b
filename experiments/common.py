"""Shared harness of the experiment scripts: run a matrix of (setting, protocol) side by side
in one session, print throughput and time to target with ratios, and write the report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.report import write_report

Variant = tuple[str, dict[str, Any]]  # (label, RunConfig options)


def parser(description: str, out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workload", default="cnn")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--step-time", type=float, default=50.0)
    p.add_argument("--max-time", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=Path(out))
    return p


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _percent(fraction: float | None) -> str:
    return f"{100 * fraction:.0f}%" if fraction is not None else "-"


def run_matrix(
    args: argparse.Namespace,
    settings: dict[str, str],
    variants: list[Variant] | dict[str, list[Variant]],
) -> dict[tuple[str, str], dict[str, Any]]:
    """Run every variant under every slowdown setting (or the setting's own list of variants);
    print the table; write the report.

    Ratios are to the first variant of the same setting (speed-up = its time to target over
    this one's; throughput = this one's samples/s over its)."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    dirs = []
    for setting, slowdown in settings.items():
        for label, options in variants[setting] if isinstance(variants, dict) else variants:
            name = f"{label}-{setting.replace(' ', '-')}"
            config = RunConfig(**{
                "workload": args.workload, "workers": args.workers, "step_time": args.step_time,
                "max_time": args.max_time, "slowdown": slowdown, "out": args.out / name,
                "label": name, "quiet": True, **options,
            })
            summary = run(config).summary
            results[(setting, label)] = summary
            dirs.append(args.out / name)
            print(f"done {name}: {summary['samples_per_s']:.0f} samples/s, "
                  f"time to target {summary['time_to_target_s']}", flush=True)
    firsts = {setting: label for setting, label in reversed(results)}
    target = next(iter(results.values()))["target_loss"]
    print(f"\n{args.workload}, {args.workers} workers, step {args.step_time:g} ms, target loss "
          f"{target}; ratios to the first protocol of the same setting")
    print(f"{'setting':14s} {'protocol':18s} {'samples/s':>10s} {'to target (s)':>14s} "
          f"{'throughput':>11s} {'speed-up':>9s} {'of ideal':>9s} {'sync wait':>10s} "
          f"{'final acc':>10s}")
    for (setting, label), s in results.items():
        base = results[(setting, firsts[setting])]
        ttt = s["time_to_target_s"]
        print(f"{setting:14s} {label:18s} {s['samples_per_s']:10.0f} "
              f"{(f'{ttt:.1f}' if ttt else 'not reached'):>14s} "
              f"{_ratio(s['samples_per_s'], base['samples_per_s']):>11s} "
              f"{_ratio(base['time_to_target_s'], ttt):>9s} "
              f"{_percent(s.get('ideal_fraction')):>9s} "
              f"{100 * s['sync_wait_fraction']:9.0f}% {100 * (s['final_accuracy'] or 0):9.1f}%")
    print(f"\nreport: {write_report(dirs, args.out / 'plots')}")
    return results
