"""Benchmark: Hop against D-PSGD on a ring, homogeneous and under random and deterministic
slowdown.

8 workers on a ring, 50 ms emulated steps; D-PSGD, notify-ack, Hop standard, Hop with one
backup worker, Hop with staleness 2, and Hop with skipping (on top of one backup worker: on
an undirected ring with no backup and no staleness nobody can fall behind, so there is nothing
to skip). Prints time to target, throughput and the fraction of the ideal throughput (the sum
of the workers' own speeds), with ratios to D-PSGD in the same setting, and writes the report
with per-worker iterations against time. Not part of the tests: about 25 minutes.

    python experiments/hop.py [--workload cnn] [--max-time 120] [--out runs/bench-hop]
"""

from __future__ import annotations

from common import parser, run_matrix

SETTINGS = {
    "homogeneous": "none",
    "random": "random:p=0.1,factor=4",
    "one 5x slow": "deterministic:ranks=3,factor=5",
}
RING = {"topology": "ring"}
#: The paper's Hop, each option that Hop's defaults would resolve from the graph set.
PAPER = {"protocol": "hop", "backup": 0, "staleness": 0, "skip": False, "max_gap": 8,
         "send_ahead": 0, "average_once": False, **RING}
VARIANTS = [
    ("dpsgd", {"protocol": "dpsgd", **RING}),
    ("notify-ack", {**PAPER, "hop_mode": "notify-ack"}),
    ("hop", PAPER),
    ("hop-backup1", {**PAPER, "backup": 1}),
    ("hop-staleness2", {**PAPER, "staleness": 2}),
    ("hop-skip", {**PAPER, "backup": 1, "skip": True}),
]

if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0], "runs/bench-hop")
    args.set_defaults(max_time=120.0)
    run_matrix(args.parse_args(), SETTINGS, VARIANTS)
