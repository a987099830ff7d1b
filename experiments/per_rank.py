"""Each rank of each run of a bench folder, second by second: who computed slower, and when.

    python experiments/per_rank.py BENCH_OUT [--json FILE]

Reads the workers' rows (`runs/<setting>/<variant>/r<k>/workers/rank*.jsonl`) and prints,
per run and rank: iterations, the median compute step, the sync wait and the time in
compute in all, the iterations Hop skipped and what Hop's iterations waited for (the three
longest causes); then each rank's median compute step in each second of the run, and the sync
wait in each second of the ranks that waited. A compute step raised on one rank for a few
seconds and then on another points at the machine (a busy hyperthread sibling, a host's
steal), one raised on every rank all the run at the protocol; a wait that comes in every
second at a neighbour of the straggler, at the protocol. Beside them, each second's CPU of the
training thread and of the rank's other threads (protocol threads, gloo's), as a percentage
of a core, from the rows that count it (`cpu_s`, about one a second): a slow second whose
training thread had the whole core and whose other threads next to none is the core's speed,
not a thread of the protocol's taking it (docs/notes/real-compute-log.md, real-small-14). Quoted in
docs/notes/real-compute-log.md (the leases' sections).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from hetsync.metrics.summary import read_jsonl

#: A rank's waits are shown second by second from this much in all: when its neighbours or
#: partners held it up, not where each of its iterations waited a few microseconds.
_SHOWN_WAIT_S = 0.1


def rank_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's totals and its median compute step (ms) in each whole second."""
    by_second: dict[int, list[float]] = {}
    synced: dict[int, float] = {}
    waited: dict[str, float] = {}
    cpu: dict[int, tuple[int, int]] = {}  # second: (training, the others), % of a core
    counted_since = 0.0  # a `cpu_s` row counts the CPU since the previous one (or the clock)
    for row in rows:
        second = int(row["t"])
        by_second.setdefault(second, []).append(row["compute_s"])
        if (spent := row.get("cpu_s")) and row["t"] > counted_since:
            span = row["t"] - counted_since
            training = spent.get("training", 0.0)
            others = sum(spent.values()) - training
            middle = int(counted_since + span / 2)  # the second it mostly covers
            cpu[middle] = (round(100 * training / span), round(100 * others / span))
            counted_since = row["t"]
        synced[second] = synced.get(second, 0.0) + row.get("sync_wait_s", 0.0)
        for key, value in row.items():
            if key.startswith("wait_"):  # Hop's: what the iteration waited for
                cause = key.removeprefix("wait_").removesuffix("_s")
                waited[cause] = waited.get(cause, 0.0) + value
    return {
        "iterations": len(rows),
        "compute_ms_median": round(1000 * statistics.median(r["compute_s"] for r in rows), 1),
        "sync_wait_s": round(sum(r.get("sync_wait_s", 0.0) for r in rows), 3),
        "compute_s": round(sum(r["compute_s"] for r in rows), 2),
        "skipped": sum(int(r.get("skipped", 0)) for r in rows),
        "per_second_ms": [round(1000 * statistics.median(by_second[s]))
                          for s in sorted(by_second)],
        "per_second_sync_ms": [round(1000 * synced[s]) for s in sorted(by_second)],
        "per_second_cpu_percent": [cpu.get(s) for s in sorted(by_second)],
        "waited_s": {cause: round(seconds, 3) for cause, seconds
                     in sorted(waited.items(), key=lambda item: -item[1])},
    }


def rank_line(rank: str, f: dict[str, Any]) -> str:
    """One rank's totals on a line, with the three longest causes of its waits."""
    return (f"  {rank:6} {f['iterations']:4} it  compute med {f['compute_ms_median']:6.1f} ms"
            f"  sync {1000 * f['sync_wait_s']:6.0f} ms  skipped {f['skipped']:3}"
            f"  compute sum {f['compute_s']:5.2f} s"
            + "".join(f"  {cause} {1000 * sec:.0f} ms"
                      for cause, sec in list(f["waited_s"].items())[:3]))


def run_figures(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every rank of one run that wrote rows."""
    figures = {}
    for path in sorted((run_dir / "workers").glob("rank*.jsonl"),
                       key=lambda p: int(p.stem.removeprefix("rank"))):
        if rows := read_jsonl(path):
            figures[path.stem] = rank_figures(rows)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_out", type=Path, help="a `hetsync bench --out` folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    every = {}
    for run_dir in sorted(args.bench_out.glob("runs/*/*/r*")):
        name = "/".join(run_dir.parts[-3:])
        figures = run_figures(run_dir)
        if not figures:
            continue
        every[name] = figures
        print(f"\n{name}")
        for rank, f in figures.items():
            print(rank_line(rank, f))
        print("  per second (median compute step, ms):")
        for rank, f in figures.items():
            print(f"  {rank:6} " + " ".join(f"{ms:4}" for ms in f["per_second_ms"]))
        if any(any(f["per_second_cpu_percent"]) for f in figures.values()):
            for i, whose in enumerate(("the training thread", "the other threads")):
                print(f"  per second (CPU of {whose}, % of a core):")
                for rank, f in figures.items():
                    print(f"  {rank:6} " + " ".join(f"{c[i]:4}" if c else "   -"
                                                  for c in f["per_second_cpu_percent"]))
        waiting = {rank: f for rank, f in figures.items() if f["sync_wait_s"] >= _SHOWN_WAIT_S}
        if waiting:
            print("  per second (sync wait, ms), the ranks that waited:")
            for rank, f in waiting.items():
                print(f"  {rank:6} " + " ".join(f"{ms:4}" for ms in f["per_second_sync_ms"]))
    if args.json:
        args.json.write_text(json.dumps(every, indent=1) + "\n")


if __name__ == "__main__":
    main()
