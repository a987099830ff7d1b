"""How fast the simulator runs: the issue's goals on this machine.

Timing only, 1024 workers x 1000 iterations of every protocol (goal: under 60 s each); 4096
workers x 1000 iterations of hop and prague (goal: under 5 minutes); with `--math` on svm,
1024 workers x 300 iterations (goal: under 10 minutes). Each is one `hetsync simulate` command
(homogeneous, --step-time 50, free network), timed from start to exit of the process, so the
figures include start-up and writing the run directory; simulation.json's own `wall_s` (the
simulation alone) is shown beside. About 15 minutes in all.

    python experiments/sim_speed.py [--only hop,prague] [--out runs/sim-speed]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    *[(p, 1024, 1000, False, 60.0) for p in
      ("allreduce", "ddp", "ps", "dpsgd", "adpsgd", "hop", "prague")],
    ("hop", 4096, 1000, False, 300.0),
    ("prague", 4096, 1000, False, 300.0),
    ("prague", 1024, 300, True, 600.0),
    ("hop", 1024, 300, True, 600.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated protocols")
    parser.add_argument("--out", type=Path, default=Path("runs/sim-speed"))
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    rows = []
    lines = ["| protocol | workers | iterations | math | command s | simulation s | events | "
             "goal s | met |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for protocol, workers, iterations, math, goal in CASES:
        if only and protocol not in only:
            continue
        out = args.out / f"{protocol}-{workers}-{iterations}{'-math' if math else ''}"
        command = [sys.executable, "-m", "hetsync.cli", "simulate", "--protocol", protocol,
                   "--workload", "svm", "--workers", str(workers), "--step-time", "50",
                   "--max-iterations", str(iterations), "--out", str(out), "--overwrite",
                   "--quiet", *(["--math"] if math else [])]
        load = os.getloadavg()[0]
        began = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - began
        sim = json.loads((out / "simulation.json").read_text())
        row = {"protocol": protocol, "workers": workers, "iterations": iterations, "math": math,
               "command_s": round(seconds, 1), "simulation_s": sim["wall_s"],
               "events": sim["events"], "goal_s": goal, "met": seconds < goal,
               "load_before": round(load, 1)}
        rows.append(row)
        line = (f"| {protocol} | {workers} | {iterations} | {'yes' if math else 'no'} | "
                f"{seconds:.1f} | {sim['wall_s']:.1f} | {sim['events']} | {goal:g} | "
                f"{'yes' if row['met'] else 'NO'} |")
        lines.append(line)
        print(line, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "results.md").write_text("# Simulator speed\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
