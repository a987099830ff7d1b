"""Benchmark: Prague against All-Reduce, DDP, PS and AD-PSGD, homogeneous and with one worker
5x slow, with a group-size sweep.

8 workers, 50 ms emulated steps. Homogeneous: Prague with the static schedule and with random
groups. One worker 5x slow: random groups, ready groups (Hetu-style), Group Buffer, Group
Division. Sweep: random groups with Group Buffer, group sizes 2, 3, 4 and 8, under the same
slowdown. Prints time to target, throughput and the fraction of the ideal throughput with
ratios to allreduce, then Prague's conflict and wait figures. Not part of the tests: about
30 minutes.

    python experiments/prague.py [--workload cnn] [--max-time 180] [--out runs/bench-prague]
"""

from __future__ import annotations

import json
from statistics import mean

from common import parser, run_matrix

from hetsync.metrics.summary import read_jsonl

SLOW = "deterministic:ranks=3,factor=5"
SETTINGS = {"homogeneous": "none", "one 5x slow": SLOW, "sizes 5x slow": SLOW}
BASELINES = [
    ("allreduce", {"protocol": "allreduce"}),
    ("ddp", {"protocol": "ddp"}),
    ("ps-sync", {"protocol": "ps", "ps_mode": "sync"}),
    ("ps-async", {"protocol": "ps", "ps_mode": "async"}),
    ("adpsgd", {"protocol": "adpsgd", "topology": "ring"}),
]
PRAGUE = {"protocol": "prague", "group_size": 3, "gg_policy": "random"}
VARIANTS = {
    "homogeneous": BASELINES + [
        ("prague-static", {**PRAGUE, "schedule": "static"}),
        ("prague-random", PRAGUE),
    ],
    "one 5x slow": BASELINES + [
        ("prague-random", PRAGUE),
        ("prague-ready", {**PRAGUE, "gg_policy": "ready"}),  # the default
        ("prague-buffer", {**PRAGUE, "group_buffer": True}),
        ("prague-division2", {**PRAGUE, "group_division": 2}),
    ],
    "sizes 5x slow": [
        (f"prague-size{k}", {**PRAGUE, "group_size": k, "group_buffer": True}) for k in (2, 3, 4, 8)
    ],
}


def prague_figures(args, results) -> None:
    """Conflicts per group, and the time per iteration spent waiting for the GG and in
    P-Reduce (which includes waiting for the group's members)."""
    print(f"\n{'setting':14s} {'run':18s} {'groups':>7s} {'conflicts/group':>16s} "
          f"{'GG wait ms/it':>14s} {'P-Reduce ms/it':>15s}")
    for setting, label in results:
        if not label.startswith("prague"):
            continue
        run_dir = args.out / f"{label}-{setting.replace(' ', '-')}"
        rows = [row for r in range(args.workers)
                for row in read_jsonl(run_dir / "workers" / f"rank{r}.jsonl")]
        gg_file = run_dir / "group_generator.json"
        stats = json.loads(gg_file.read_text()) if gg_file.is_file() else None
        conflicts = f"{stats['conflicts'] / max(stats['groups'], 1):.2f}" if stats else "-"
        groups = str(stats["groups"]) if stats else "-"
        gg = 1000 * mean(row.get("gg_wait_s", 0.0) for row in rows)
        preduce = 1000 * mean(row.get("preduce_s", 0.0) for row in rows)
        print(f"{setting:14s} {label:18s} {groups:>7s} {conflicts:>16s} {gg:14.1f} "
              f"{preduce:15.1f}")


if __name__ == "__main__":
    arguments = parser(__doc__.splitlines()[0], "runs/bench-prague")
    arguments.set_defaults(max_time=180.0)
    args = arguments.parse_args()
    prague_figures(args, run_matrix(args, SETTINGS, VARIANTS))
