"""Benchmark: hetsync's allreduce against PyTorch DDP, homogeneous and with one slow worker.

8 workers, 50 ms emulated steps; each run stops at the workload's target loss (or --max-time).
Prints throughput and time to target side by side with their ratios, and writes the report
(plots + table) to OUT/plots. Not part of the tests: it takes several minutes.

    python bench/allreduce_vs_ddp.py [--workload cnn] [--out runs/bench-ar-ddp]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.report import write_report

SETTINGS = {"homogeneous": "none", "one 4x slow": "deterministic:ranks=3,factor=4"}
PROTOCOLS = ("allreduce", "ddp")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--step-time", type=float, default=50.0)
    parser.add_argument("--max-time", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-ar-ddp"))
    args = parser.parse_args()

    results: dict[tuple[str, str], dict] = {}
    dirs = []
    for setting, slowdown in SETTINGS.items():
        for protocol in PROTOCOLS:
            label = f"{protocol}-{setting.replace(' ', '-')}"
            result = run(RunConfig(
                protocol=protocol, workload=args.workload, workers=args.workers,
                step_time=args.step_time, slowdown=slowdown, max_time=args.max_time,
                out=args.out / label, label=label, quiet=True,
            ))
            results[(setting, protocol)] = result.summary
            dirs.append(result.run_dir)
            s = result.summary
            print(f"done {label}: {s['samples_per_s']:.0f} samples/s, "
                  f"time to target {s['time_to_target_s']}")

    base = results[("homogeneous", "allreduce")]
    print(f"\n{args.workload}, {args.workers} workers, step {args.step_time:g} ms, "
          f"target loss {base['target_loss']}")
    print(f"{'setting':14s} {'protocol':10s} {'samples/s':>10s} {'to target (s)':>14s} "
          f"{'thr. vs AR homog.':>18s} {'speed-up vs AR homog.':>22s} {'sync wait':>10s}")
    for (setting, protocol), s in results.items():
        ttt = s["time_to_target_s"]
        print(f"{setting:14s} {protocol:10s} {s['samples_per_s']:10.0f} "
              f"{(f'{ttt:.1f}' if ttt else 'not reached'):>14s} "
              f"{_ratio(s['samples_per_s'], base['samples_per_s']):>18s} "
              f"{_ratio(base['time_to_target_s'], ttt):>22s} "
              f"{100 * s['sync_wait_fraction']:9.0f}%")
    for setting in SETTINGS:
        ar, ddp = results[(setting, "allreduce")], results[(setting, "ddp")]
        print(f"{setting}: ddp/allreduce throughput "
              f"{_ratio(ddp['samples_per_s'], ar['samples_per_s'])}, time to target "
              f"{_ratio(ddp['time_to_target_s'], ar['time_to_target_s'])}")
    print(f"\nreport: {write_report(dirs, args.out / 'plots')}")


if __name__ == "__main__":
    main()
