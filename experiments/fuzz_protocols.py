"""Fuzzing: every protocol's cores through 1000 random schedules (or --schedules), in one process.

Each schedule is a small simulated run (4-8 workers, 12 iterations, a random slowdown) with a
random extra time on every compute and every message (channels stay FIFO), each worker from
its own random model with lr 0; the promises checked are listed in
src/hetsync/simulator/fuzz.py. Prints and writes the counts per variant (schedules, events,
what the protocol's own invariants counted (Prague: its groups), schedules that lost a worker
before it finished (the `-lose1` variants), failures with the seed that replays each). About
15 s per variant per 1000 schedules on this machine.

    python experiments/fuzz_protocols.py [--schedules 1000] [--seed 0] [--out runs/fuzz]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hetsync.simulator.fuzz import CONSERVING, VARIANTS, fuzz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000, help="per variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=Path("runs/fuzz"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    lines = ["| variant | schedules | events | own checks | sum conserved checked | "
             "worker lost | failures | seconds |", "| --- " * 8 + "|"]
    for variant in args.variants.split(","):
        began = time.perf_counter()
        result = fuzz(variant, args.schedules, args.seed)
        seconds = time.perf_counter() - began
        rows.append({"variant": variant, "schedules": result.schedules, "events": result.events,
                     "checked": dict(result.checked), "conserving": variant in CONSERVING,
                     "lost": result.lost, "failures": result.failures,
                     "seconds": round(seconds, 1)})
        own = ", ".join(f"{count} {name}" for name, count in result.checked.items()) or "-"
        line = (f"| {variant} | {result.schedules} | {result.events} | {own} | "
                f"{'yes' if variant in CONSERVING else 'no'} | {result.lost or '-'} | "
                f"{len(result.failures)} | "
                f"{seconds:.1f} |")
        lines.append(line)
        print(line, flush=True)
        for failure in result.failures[:5]:
            print(f"    {failure}")
    command = (f"python experiments/fuzz_protocols.py --schedules {args.schedules} "
               f"--seed {args.seed}" + ("" if args.variants == ",".join(VARIANTS)
                                        else f" --variants {args.variants}"))
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "results.md").write_text(f"# Fuzzing the protocols' cores\n\n`{command}`\n\n"
                                         + "\n".join(lines) + "\n")
    print(f"results: {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
