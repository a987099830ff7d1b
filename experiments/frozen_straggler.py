"""A straggler frozen as a CPU quota freezes it, at 8 workers on a 2-core machine: who waits
for it, and for what.

    python experiments/frozen_straggler.py [--variants hop-stale-skip,adpsgd] [--rounds 2]

On a 16-core lease, Hop's two neighbours of a quarter-core straggler (`--slowdown
cpu:ranks=3,share=0.25`) waited for it all through the run (1.77 s of 10, in pieces of about
20 ms), where the same run with the straggler slowed by a sleep waited only for its first
update. The quota does more than slow the straggler's compute: once the worker has used its
quarter of a 100-ms period, the kernel stops every thread of it (receivers, gloo's, senders)
until the next, so a neighbour's send or request to it sits for up to 75 ms.

This reproduces that without 16 cores: the workers compute by sleeping (`--step-time`), and
this script stops rank 3's process (SIGSTOP) for the last (1 - share) of every period and
lets it go on (SIGCONT) for the first share of it: what the quota does to a worker whose
compute uses its whole share. The freezing alone makes rank 3 about 1.8x slower with the
`svm` workload (its steps end only when it runs again); `--factor F` also slows its steps
F times (`--slowdown deterministic`), of a step that already counts its time frozen, so the
two compound: `--factor 5 --workload cnn` made it about 12x slower. Every rank's row says
what it waited for (Hop: `wait_update_from_<j>_s`, `wait_token_from_<j>_s`,
`wait_send_to_<j>_s`); printed per rank, with `--freeze 1` for the same run unfrozen.
Emulated: the compute (sleeps) and the freezing (signals, not a cgroup); real: the processes,
their threads, gloo over loopback. About 25 s a run.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

from per_rank import rank_line, run_figures

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.protocols.catalog import all_variants


def _child_with_rank(rank: int) -> int | None:
    """The pid of this process's child whose environment says RANK=`rank` (a worker)."""
    me, wanted = os.getpid(), f"RANK={rank}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == me and wanted in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except (OSError, IndexError, ValueError):
            continue  # gone, or not ours to read
    return None


def freeze(rank: int, share: float, period: float, done: threading.Event,
           first_row: Path) -> None:
    """Stop `rank`'s worker for the last 1 - `share` of every `period` once it has written its
    first row (its start-up runs free, as a `cpu:` straggler joins its cgroup only then)."""
    pid = None
    while not done.is_set() and (pid is None or not first_row.exists()):
        pid = pid or _child_with_rank(rank)
        time.sleep(0.01)
    started = time.perf_counter()
    while not done.is_set():
        phase = (time.perf_counter() - started) % period
        if phase < share * period:
            time.sleep(share * period - phase)
            continue
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(period - phase)
        except ProcessLookupError:
            return
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                return


def run_one(label: str, options: dict, args: argparse.Namespace, out: Path,
            share: float) -> dict:
    """One run of `label`, rank `args.rank` frozen to `share` (1: not frozen)."""
    config = RunConfig(**{
        "workload": args.workload, "workers": args.workers, "step_time": args.step_time,
        "slowdown": f"deterministic:ranks={args.rank},factor={args.factor}",
        "max_time": args.max_time, "stop_at_target": False, "out": out, "label": label,
        "quiet": True, "overwrite": True, **options})
    done = threading.Event()
    freezer = threading.Thread(target=freeze, daemon=True, args=(
        args.rank, share, args.period, done, out / "workers" / f"rank{args.rank}.jsonl"))
    if share < 1:
        freezer.start()
    try:
        summary = run(config).summary
    finally:
        done.set()
        if freezer.is_alive():
            freezer.join()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="hop-stale-skip,hop-skip,adpsgd")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--workload", default="svm")
    parser.add_argument("--rank", type=int, default=3, help="the straggler")
    parser.add_argument("--factor", type=float, default=1.0,
                        help="its steps' slowdown beside the freezing (compounds with it)")
    parser.add_argument("--freeze", type=float, default=0.25,
                        help="the share of each period it runs (1: never frozen)")
    parser.add_argument("--period", type=float, default=0.1, help="the kernel's: 100 ms")
    parser.add_argument("--step-time", type=float, default=50.0)
    parser.add_argument("--max-time", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/frozen-straggler"))
    args = parser.parse_args()
    if not 0 < args.freeze <= 1:
        parser.error(f"--freeze is the share of each period the straggler runs: in (0, 1] "
                     f"(got {args.freeze:g})")
    variants = {v.label: dict(v.options, protocol=v.protocol) for v in all_variants()}
    for r in range(1, args.rounds + 1):
        for label in args.variants.split(","):
            out = args.out / "runs" / f"freeze-{args.freeze:g}" / label / f"r{r}"
            summary = run_one(label, variants[label], args, out, args.freeze)
            print(f"\n{label} round {r}: {summary['samples_per_s']:.0f} samples/s, "
                  f"{100 * summary['ideal_fraction']:.1f} % of ideal", flush=True)
            for rank, f in run_figures(out).items():
                print(rank_line(rank, f), flush=True)


if __name__ == "__main__":
    main()
