"""What a protocol costs the training thread, per iteration, at N workers (issue 22).

At 8 workers on 16 cores Hop's training threads spent about 3 points more of the run outside the
compute step than AD-PSGD's (docs/notes/real-compute-log.md, "The `real` suite at 8 workers").
This measures that cost where a 2-core machine can: N gloo processes run the real drivers of the
named variants on a workload's real tensors, with the compute replaced by a sleep (so that the
receivers work while the training thread "computes", as with real compute, and N processes fit
on 2 cores). The model is laid out in one buffer, as `hetsync.SyncOptimizer` lays it out
(hetsync.transport.contiguous), or with `--per-tensor` also left as separate tensors, each
variant both ways in the same round. The training thread's CPU time (`time.thread_time`) inside
the protocol's hooks (`begin_iteration`, `before_optimizer_step`, `after_optimizer_step`) is
what the protocol takes from the compute; CPU time, unlike wall time, does not count waiting for
a neighbour nor another process holding the core. The other threads' CPU (gloo's, the protocol's
receivers) is reported beside it, per iteration.

    .venv/bin/python experiments/protocol_hook_cost.py [--workers 8] [--workload resnet] \\
        [--variants hop,hop-stale-skip,adpsgd,dpsgd,allreduce] [--iterations 60] \\
        [--compute-ms 40] [--repeats 3] [--per-tensor]

Each variant runs --repeats times, in rounds (every variant once, then again), so that a slow
spell of the machine falls on all of them; each cell is the median over rounds of the median
over ranks of the per-iteration median. Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from local_gloo import TIMEOUT, free_port, join, runtime

from hetsync.config import RunConfig
from hetsync.metrics.thread_cpu import TRAINING, ThreadCpu
from hetsync.protocols.catalog import all_variants
from hetsync.protocols.registry import get_protocol
from hetsync.step import Step
from hetsync.transport.contiguous import lay_out
from hetsync.transport.flat import model_tensors
from hetsync.workloads import get_workload


def _measure(rank: int, world: int, options: dict[str, Any], laid_out: bool,
             store: dist.Store, args: argparse.Namespace) -> dict[str, float]:
    """One variant on this rank: per-iteration medians of the hooks' CPU and wall ms, and
    the other threads' CPU ms per iteration."""
    torch.manual_seed(0)
    model = get_workload(args.workload).build_model()
    if laid_out:
        lay_out(model_tensors(model))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    config = RunConfig(**{**options, "workers": world, "hang_timeout": TIMEOUT.total_seconds()})
    driver = get_protocol(options["protocol"])(runtime(rank, config, store), model, optimizer)
    cpu, wall = [], []
    dist.barrier()
    threads = ThreadCpu()
    for i in range(1, 2 * args.iterations):  # until the workers agree to stop
        step = Step(iteration=i, wants_stop=i >= args.iterations)
        for p in model.parameters():  # what a backward pass leaves (All-Reduce moves them)
            p.grad = torch.zeros_like(p)
        began_cpu, began = time.thread_time(), time.perf_counter()
        driver.begin_iteration(step)
        spent_cpu, spent = time.thread_time() - began_cpu, time.perf_counter() - began
        time.sleep(args.compute_ms / 1e3)  # the compute, done elsewhere
        began_cpu, began = time.thread_time(), time.perf_counter()
        driver.before_optimizer_step(step)
        driver.after_optimizer_step(step)
        spent_cpu += time.thread_time() - began_cpu
        spent += time.perf_counter() - began - step.sync_wait_s
        if i > 5:  # past the warm-up
            cpu.append(spent_cpu * 1e3)
            wall.append(spent * 1e3)
        if step.stop:
            break
    others = threads.sample(force=True) or {}
    driver.close()
    dist.barrier()
    other_cpu = sum(s for role, s in others.items() if role != TRAINING)
    return {"hook cpu ms": statistics.median(cpu), "hook ms (not waiting)": statistics.median(wall),
            "other threads cpu ms": other_cpu * 1e3 / args.iterations}


def _worker(rank: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    world = args.workers
    store = join(rank, world, port)
    variants = {v.label: dict(v.run_options) for v in all_variants()}
    layouts = (True, False) if args.per_tensor else (True,)
    for round_ in range(args.repeats):
        for label in args.variants:
            for laid_out in layouts:
                row = label if laid_out else f"{label} (per tensor)"
                own = dist.PrefixStore(f"{round_}/{row}/", store)  # Prague's P-Reduce keys
                queue.put((round_, row, rank,
                           _measure(rank, world, variants[label], laid_out, own, args)))
    dist.barrier()
    os._exit(0)  # as transport_bandwidth.py: no teardown racing the drivers' daemon threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--workload", default="resnet")
    parser.add_argument("--variants", default="hop,hop-stale-skip,adpsgd,dpsgd,allreduce")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--compute-ms", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-tensor", action="store_true",
                        help="also run each variant on a model not laid out in one buffer")
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    known = {v.label for v in all_variants()}
    if unknown := [label for label in args.variants if label not in known]:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    port = free_port()
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_worker, args=(port, args, queue), nprocs=args.workers,
                       start_method="spawn")
    cells: dict[str, dict[str, list[float]]] = {}
    per_round: dict[tuple[int, str], list[dict[str, float]]] = {}
    while not queue.empty():
        round_, label, _, figures = queue.get()
        per_round.setdefault((round_, label), []).append(figures)
    for (_, label), ranks in sorted(per_round.items()):
        for key in dict.fromkeys(key for r in ranks for key in r):
            cells.setdefault(label, {}).setdefault(key, []).append(
                statistics.median(r.get(key, 0.0) for r in ranks))
    keys = list(dict.fromkeys(key for row in cells.values() for key in row))
    print(f"{args.workers} workers, {args.workload}, compute {args.compute_ms:g} ms (a sleep), "
          f"{args.iterations} iterations, median of {args.repeats} rounds "
          "(of the ranks' medians); min-max over rounds in brackets")
    print("| variant | " + " | ".join(keys) + " |")
    print("| --- |" + " --- |" * len(keys))
    for label in sorted(cells, key=lambda row: (args.variants.index(row.split(" (")[0]), row)):
        row = cells[label]
        print(f"| {label} | " + " | ".join(
            f"{statistics.median(row[k]):.2f} ({min(row[k]):.2f}-{max(row[k]):.2f})"
            if k in row else "-" for k in keys) + " |")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
