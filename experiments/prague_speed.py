"""Benchmark: where Prague's time goes, with and without `--overlap`, for the default (ready
groups) and the paper's variant (random groups + Group Buffer), beside All-Reduce and
AD-PSGD.

svm, 50 ms emulated steps, homogeneous and with rank 3 5x slow, 20 s per run (issue 15's
setting). Prints the run table (fraction of the ideal throughput), then per run the mean
milliseconds per iteration of a worker: compute, the waits on the training thread (for the
Group Generator, of which it held the request for a group to form; the answer's hand-over
to the training thread; P-Reduce with the members' waits; with overlap the wait for the
previous request's group) and the rest (the loop's own work, the sleep's late wake-ups).
`--network`/`--payload` give the papers' regime (docs/network.md). About 6 minutes at 8
workers (ratios are to All-Reduce).

    python experiments/prague_speed.py [--workers 16] [--network bandwidth=10Gbit,latency=50us
        --payload 100MB] [--out runs/bench-prague-speed]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from common import parser, run_matrix

from hetsync.metrics.summary import read_jsonl

SETTINGS = {"homogeneous": "none", "one 5x slow": "deterministic:ranks=3,factor=5"}
PAPER = {"protocol": "prague", "gg_policy": "random", "group_buffer": True}
VARIANTS = [
    ("allreduce", {"protocol": "allreduce"}),
    ("adpsgd", {"protocol": "adpsgd"}),
    ("prague", {"protocol": "prague"}),
    ("prague-between", {"protocol": "prague", "overlap": False}),
    ("prague-size2", {"protocol": "prague", "group_size": 2}),
    ("prague-paper", {**PAPER}),
    ("prague-paper-between", {**PAPER, "overlap": False}),
]
PARTS = ("gg_wait_s", "gg_hold_s", "wake_s", "preduce_s", "overlap_wait_s")


def breakdown(run_dir: Path, workers: int) -> dict[str, float]:
    """Mean ms per iteration over every worker's rows but the first (startup)."""
    rows = [row for r in range(workers)
            for row in read_jsonl(run_dir / "workers" / f"rank{r}.jsonl")[1:]]
    spans = []
    for r in range(workers):
        times = [row["t"] for row in read_jsonl(run_dir / "workers" / f"rank{r}.jsonl")]
        spans += [b - a for a, b in zip(times, times[1:], strict=False)]

    def mean(values: list[float]) -> float:
        return 1000 * sum(values) / max(len(values), 1)

    parts = {"iteration": mean(spans),
             "compute": mean([row["compute_s"] + row["injected_delay_s"] for row in rows]),
             "sync wait": mean([row["sync_wait_s"] for row in rows])}
    parts |= {key: mean([float(row.get(key, 0.0)) for row in rows]) for key in PARTS}
    parts["rest"] = parts["iteration"] - parts["compute"] - parts["sync wait"]
    return parts


def print_breakdowns(args: argparse.Namespace, results: dict[tuple[str, str], Any]) -> None:
    print(f"\nms per iteration (mean over workers): {'setting':14s} {'run':22s} "
          + " ".join(f"{k:>10s}" for k in ("iteration", "compute", "sync wait", *PARTS, "rest")))
    for setting, label in results:
        if not label.startswith("prague"):
            continue
        parts = breakdown(args.out / f"{label}-{setting.replace(' ', '-')}", args.workers)
        print(f"{setting:14s} {label:22s} " + " ".join(f"{v:10.1f}" for v in parts.values()))


if __name__ == "__main__":
    arguments = parser(__doc__.splitlines()[0], "runs/bench-prague-speed")
    arguments.set_defaults(workload="svm", max_time=20.0)
    arguments.add_argument("--network", default="none")
    arguments.add_argument("--payload", default="none")
    args = arguments.parse_args()
    extra = {"network": args.network, "payload": args.payload}
    variants = [(label, {**options, **extra}) for label, options in VARIANTS]
    print_breakdowns(args, run_matrix(args, SETTINGS, variants))
