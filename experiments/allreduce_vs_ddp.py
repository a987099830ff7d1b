"""Benchmark: hetsync's allreduce against PyTorch DDP, homogeneous and with one slow worker.

8 workers, 50 ms emulated steps; each run stops at the workload's target loss (or --max-time).
Not part of the tests: it takes several minutes.

    python experiments/allreduce_vs_ddp.py [--workload cnn] [--out runs/bench-ar-ddp]
"""

from __future__ import annotations

from common import parser, run_matrix

SETTINGS = {"homogeneous": "none", "one 4x slow": "deterministic:ranks=3,factor=4"}
VARIANTS = [("allreduce", {"protocol": "allreduce"}), ("ddp", {"protocol": "ddp"})]

if __name__ == "__main__":
    run_matrix(parser(__doc__.splitlines()[0], "runs/bench-ar-ddp").parse_args(), SETTINGS,
               VARIANTS)
