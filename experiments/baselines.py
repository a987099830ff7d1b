"""Benchmark: the baselines Hop and Prague are judged against, side by side.

allreduce, ps (sync and async), dpsgd and adpsgd; 8 workers, 50 ms emulated steps,
homogeneous and with one worker 4x slow; time to target loss and aggregate throughput, with
ratios to allreduce. Not part of the tests: it takes about 15 minutes.

    python experiments/baselines.py [--workload cnn] [--max-time 150] [--out runs/bench-baselines]
"""

from __future__ import annotations

from common import parser, run_matrix

SETTINGS = {"homogeneous": "none", "one 4x slow": "deterministic:ranks=3,factor=4"}
VARIANTS = [
    ("allreduce", {"protocol": "allreduce"}),
    ("ps-sync", {"protocol": "ps", "ps_mode": "sync"}),
    ("ps-async", {"protocol": "ps", "ps_mode": "async"}),
    ("dpsgd", {"protocol": "dpsgd", "topology": "ring"}),
    ("adpsgd", {"protocol": "adpsgd", "topology": "ring"}),
]

if __name__ == "__main__":
    run_matrix(parser(__doc__.splitlines()[0], "runs/bench-baselines").parse_args(), SETTINGS,
               VARIANTS)
