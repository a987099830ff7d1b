"""Benchmark: the simulator's cost constants (hetsync.simulator.costs), measured on this machine.

Three measurements, each of what a real run spends where the simulator charges a constant:

* loopback: two gloo processes on 127.0.0.1 ping-pong a control message (64 B) and an svm
  model (3140 B), sleeping --gap ms between rounds as real workers do between messages (so
  each receive wakes a sleeping process); the one-way latency is half the median round trip.
  A --bulk transfer, answered by 4 bytes, gives the copy bandwidth. -> LOCAL_NETWORK.
* group generator: the per-message cost of rank 0's Group Generator, as its threads spend it
  (`hetsync.protocols.prague.driver.gg_service.GroupGeneratorService`): the thread receiving
  from a worker `recv`s each 4-word message, decodes it and, as the core answers a request,
  `send`s an assignment (one per request; under the `ready` policy a request carries the
  group finished before it, so every message is a request). Here rank 1 sends as fast as it
  can, so rank 0 is saturated and elapsed / messages is its service time; the core's own
  `handle` is timed apart on a replayed run of --workers. -> SERVICE_S["group-generator"].
* from real runs (`--runs DIR`, run directories such as experiments/sim_validation.py's
  real/): an iteration's wall time beyond its compute, injected delay and synchronisation wait
  (the per-iteration overhead) -> ITERATION_OVERHEAD_S; and Prague's measured P-Reduce time.

    .venv/bin/python experiments/sim_calibration.py [--runs runs/bench-sim-validation/real] \\
        [--workers 16] [--out runs/sim-calibration]

Takes about 30 s besides reading the runs. The figures depend on the machine's load, which is
printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetsync.protocols.prague.gg_wire import FROM_GG_TAG, TO_GG_TAG, FromGG, Kind, ToGG
from hetsync.protocols.prague.group_generator import (
    Group,
    GroupFinished,
    GroupGeneratorCore,
    GroupRequested,
    WaitTimedOut,
)

COMMAND = "python experiments/sim_calibration.py"
CONTROL_BYTES, SVM_BYTES = 64, 3140


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- two gloo processes --------------------------------------------------------------------
def _pingpong(rank: int, nbytes: int, rounds: int, gap_s: float) -> list[float]:
    buffer = torch.zeros(max(1, nbytes // 4))
    reply = torch.zeros(1)
    times = []
    for _ in range(rounds):
        if rank == 0:
            time.sleep(gap_s)
            began = time.perf_counter()
            dist.send(buffer, 1)
            dist.recv(reply, 1)
            times.append(time.perf_counter() - began)
        else:
            dist.recv(buffer, 0)
            dist.send(reply, 0)
    return times


def _gg_loop(rank: int, messages: int, world: int) -> tuple[float, float]:
    """Rank 0 serves `messages` requests the way the Group Generator's threads do (on the
    thread that receives them, an assignment sent back for each); returns its (wall, CPU)
    seconds per message (rank 1 returns zeros)."""
    if rank == 1:
        def collect() -> None:
            out = FromGG.empty(world)
            for _ in range(messages):
                dist.recv(out, 0, tag=FROM_GG_TAG)

        thread = threading.Thread(target=collect)
        thread.start()
        message = ToGG(Kind.REQUEST, 2, 0.0, finished=1).encode()
        for _ in range(messages):
            dist.send(message, 0, tag=TO_GG_TAG)
        thread.join()
        return 0.0, 0.0
    timed: list[float] = []

    def receive() -> None:
        for i in range(messages):
            message = ToGG.empty()
            dist.recv(message, 1, tag=TO_GG_TAG)
            request = ToGG.decode(message)
            if not timed:
                timed.extend((time.perf_counter(), time.process_time()))
            answer = FromGG(Group(id=i, members=(0, 1, 2)), True, float(request.flag))
            dist.send(answer.encode(world), 1, tag=FROM_GG_TAG)

    thread = threading.Thread(target=receive)
    thread.start()
    thread.join()
    began, cpu = timed
    return ((time.perf_counter() - began) / (messages - 1),
            (time.process_time() - cpu) / (messages - 1))


def _worker(rank: int, port: int, args: argparse.Namespace, results: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.set_num_threads(1)
    gap = args.gap / 1000
    out: dict[str, Any] = {}
    for name, nbytes in (("control", CONTROL_BYTES), ("svm", SVM_BYTES)):
        _pingpong(rank, nbytes, 10, gap)
        out[name] = _pingpong(rank, nbytes, args.rounds, gap)
    _pingpong(rank, args.bulk, 1, gap)
    out["bulk"] = _pingpong(rank, args.bulk, 5, gap)
    dist.barrier()
    out["gg_loop_s"], out["gg_loop_cpu_s"] = _gg_loop(rank, args.messages, args.workers)
    if rank == 0:
        results.put(out)
    dist.barrier()
    dist.destroy_process_group()


# --- the core alone ------------------------------------------------------------------------
def core_handle_s(world: int, policy: str, events: int, seed: int = 0) -> float:
    """Mean seconds per `GroupGeneratorCore.handle` on a replayed run: every worker requests
    a group after its step, runs each group it is assigned and reports it finished."""
    core = GroupGeneratorCore(world, 3, random.Random(seed), policy=policy)
    rng = random.Random(seed + 1)
    pending: list[deque[object]] = [deque([GroupRequested(rank=r, iteration=1, last=False)])
                                    for r in range(world)]
    iteration = [1] * world
    held: list[list[int]] = [[] for _ in range(world)]
    spent, handled = 0.0, 0
    while handled < events:
        ready = [r for r in range(world) if pending[r]]
        event = pending[rng.choice(ready)].popleft() if ready else WaitTimedOut()
        began = time.perf_counter()
        assignments = core.handle(event)
        spent += time.perf_counter() - began
        handled += 1
        for a in assignments:
            held[a.rank].append(a.group.id)
            if a.answers_request:
                iteration[a.rank] += 1
                pending[a.rank].extend(GroupFinished(group_id=g, rank=a.rank)
                                       for g in held[a.rank])
                pending[a.rank].append(GroupRequested(rank=a.rank, iteration=iteration[a.rank],
                                                      last=False))
                held[a.rank] = []
    return spent / handled


# --- from real runs ------------------------------------------------------------------------
def from_runs(folder: Path) -> dict[str, Any]:
    """Per-iteration overhead (median and mean, per protocol) and Prague's P-Reduce time, from
    the free-network real runs in `folder` (iterations 6 onwards)."""
    overhead: dict[str, list[float]] = {}
    preduce: dict[int, list[float]] = {}
    for run in sorted(p for p in folder.iterdir() if (p / "summary.json").exists()):
        config = json.loads((run / "config.json").read_text())
        if config.get("network", "none") != "none":
            continue
        for path in sorted((run / "workers").glob("rank*.jsonl")):
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for before, this in zip(rows[5:], rows[6:], strict=False):
                rest = (this["t"] - before["t"] - this["compute_s"] - this["injected_delay_s"]
                        - this["sync_wait_s"])
                overhead.setdefault(config["protocol"], []).append(rest)
                if this.get("preduce_s") and this.get("groups"):
                    for group in this["groups"]:
                        preduce.setdefault(len(group) - 1, []).append(
                            this["preduce_s"] / len(this["groups"]))
    every = [x for xs in overhead.values() for x in xs]
    return {
        "overhead_median_s": {p: statistics.median(xs) for p, xs in overhead.items()},
        "overhead_mean_s": {p: statistics.fmean(xs) for p, xs in overhead.items()},
        "overhead_all_median_s": statistics.median(every) if every else None,
        "overhead_all_mean_s": statistics.fmean(every) if every else None,
        "iterations": len(every),
        "preduce_median_s": {k: statistics.median(xs) for k, xs in sorted(preduce.items())},
    }


def _arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, help="a folder of real run directories")
    p.add_argument("--workers", type=int, default=16, help="world of the replayed core")
    p.add_argument("--rounds", type=int, default=300, help="timed ping-pongs per size")
    p.add_argument("--gap", type=float, default=2.0, help="ms of sleep between ping-pongs")
    p.add_argument("--bulk", type=int, default=10_000_000, help="bytes of the bandwidth case")
    p.add_argument("--messages", type=int, default=4000, help="messages to the GG loop")
    p.add_argument("--out", type=Path, default=Path("runs/sim-calibration"))
    return p.parse_args()


def main() -> int:
    args = _arguments()
    load = os.getloadavg()[0]
    results: Any = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_worker, args=(_free_port(), args, results), nprocs=2,
                       start_method="spawn")
    timed = results.get()
    one_way = {k: statistics.median(timed[k]) / 2 for k in ("control", "svm")}
    bulk_s = statistics.median(timed["bulk"]) - one_way["control"] * 2
    handle = {p: core_handle_s(args.workers, p, 20000) for p in ("ready", "random")}
    found: dict[str, Any] = {
        "command": " ".join([COMMAND, *sys.argv[1:]]), "load_average": load,
        "cpus": os.cpu_count(),
        "one_way_latency_s": one_way,
        "one_way_latency_p90_s": {k: statistics.quantiles(timed[k], n=10)[-1] / 2
                                  for k in ("control", "svm")},
        "bandwidth_bit_s": 8 * args.bulk / bulk_s,
        "gg_loop_s_per_message": timed["gg_loop_s"],
        "gg_loop_cpu_s_per_message": timed["gg_loop_cpu_s"],
        "gg_core_handle_s": handle,
        # a message: under `ready` a request and the group finished before it (two events),
        # under `random` either one
        "gg_service_s": {p: timed["gg_loop_cpu_s"] + h * (2 if p == "ready" else 1)
                         for p, h in handle.items()},
    }
    if args.runs is not None:
        found["from_runs"] = from_runs(args.runs)
    print(json.dumps(found, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(found, indent=2) + "\n")
    print(f"written: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
