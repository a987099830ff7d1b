"""Why a worker's compute step is slower beside a protocol than alone: each suspect in turn.

Two processes, each pinned to a core of its own with one torch thread, train the same real
workload (no sleep) for `--steps` steps each (the same count, so that lock-step modes end
together); only what surrounds the step changes from mode to mode:

- `solo`: rank 0 alone (rank 1 idles): the unit every ratio is taken against.
- `concurrent`: both compute, nothing exchanged (what two cores sharing an L3 and memory cost).
- `allreduce`: after the backward pass the training thread all-reduces the flat gradients
  (gloo), as hetsync's allreduce does.
- `p2p`: after each step the training thread sends its flat model to the other rank and
  receives the other's (gloo isend/irecv, waited on), then averages: D-PSGD's exchange.
- `p2p-thread`: the same, received by a thread of its own blocked in a receive, as Hop's
  receiver threads do; the training thread waits on a queue.
- `p2p-thread-early`: `p2p-thread`, with the model sent before the forward pass (Hop sends
  x_k at the start of iteration k) and received during the compute.
- `wake` / `copy`: a thread woken once per step that does nothing / copies a model-sized
  buffer (a thread's wake-up and a copy's cache footprint, without gloo).
- `sleep` / `spin`: nothing exchanged, but the training thread sleeps / busy-waits 5 ms
  between steps (does a core left idle for the length of an exchange compute slower after?).

Per mode and rank: steps per second, median wall and CPU (`time.thread_time`) time of the
compute (forward, backward, optimizer step) and the median wall time of the whole step. The
compute's CPU time tells a slower core (caches, memory: CPU time grows) from a core shared with
other threads (wall time grows, CPU time does not). Takes 8 x `--steps` steps plus start-ups
(a minute or two for resnet).
Quoted in docs/notes/real-compute-log.md ("Where the compute inflation came from").
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetsync.workloads import get_workload

MODES = ("solo", "concurrent", "allreduce", "p2p", "p2p-thread", "p2p-thread-early", "wake",
         "copy", "sleep", "spin")
SPIN = ("import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass")
"""`--awake`: a busy loop at SCHED_IDLE on the worker's core, run only when the core would idle."""
IDLE_S = 0.005
"""`sleep` / `spin`: the pause between steps, about what a step's exchange takes."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flat(tensors: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    torch.cat([t.reshape(-1) for t in tensors], out=out)
    return out


def _unflat_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for t, v in zip(tensors, _split(flat, tensors), strict=True):
        t.copy_(v)


class _Receiver:
    """A thread blocked in a receive from `peer`, handing each message over on a queue."""

    def __init__(self, peer: int, numel: int) -> None:
        self.inbox: queue.Queue[torch.Tensor] = queue.Queue()
        self.free: queue.Queue[torch.Tensor] = queue.Queue()
        for _ in range(2):
            self.free.put(torch.empty(numel))
        self.peer = peer
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            buffer = self.free.get()
            dist.recv(buffer, self.peer, tag=7)
            self.inbox.put(buffer)


class _Helper:
    """A thread woken once a step to run `work`."""

    def __init__(self, work: Callable[[], object]) -> None:
        self.work, self.go, self.done = work, threading.Event(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            self.work()
            self.done.set()


def _worker(rank: int, mode: str, workload_name: str, steps: int, port: int,
            out: Any, awake: bool) -> None:
    os.sched_setaffinity(0, {rank})
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(rank)]) if awake else None
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    workload = get_workload(workload_name)
    split = workload.load(None)
    batch = workload.batch_size
    model = workload.build_model()
    params = [p for p in model.parameters()]
    optimizer = torch.optim.SGD(params, lr=workload.lr, momentum=workload.momentum)
    numel = sum(p.numel() for p in params)
    mine, theirs = torch.empty(numel), torch.empty(numel)
    peer = 1 - rank
    exchanging = mode not in ("solo", "concurrent", "wake", "copy")
    if exchanging:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2)
    receiver = _Receiver(peer, numel) if mode.startswith("p2p-thread") else None
    scratch = torch.empty(numel)
    helper = {"wake": _Helper(lambda: None),
              "copy": _Helper(lambda: scratch.copy_(mine))}.get(mode)
    if mode == "solo" and rank == 1:
        out.put((rank, None))
        if spinner is not None:
            spinner.kill()
        return
    rows: list[tuple[float, float, float]] = []
    began = time.perf_counter()
    sent: dist.Work | None = None
    for step in range(steps):
        t0 = time.perf_counter()
        if mode == "p2p-thread-early":
            if sent is not None:
                sent.wait()
            sent = dist.isend(_flat([p.detach() for p in params], mine), peer, tag=7)
        if helper is not None:
            helper.go.set()
        start = (step * batch) % (len(split.train_x) - batch)
        x, y = split.train_x[start:start + batch], split.train_y[start:start + batch]
        c0, w0 = time.thread_time(), time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        loss = workload.loss(model(x), y)
        loss.backward()
        if mode == "allreduce":
            c1, w1 = time.thread_time(), time.perf_counter()
            grads = [p.grad for p in params]
            dist.all_reduce(_flat(grads, mine))
            _unflat_into(mine.div_(2), grads)
            c2, w2 = time.thread_time(), time.perf_counter()
        optimizer.step()
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        if mode == "allreduce":
            cpu, wall = cpu - (c2 - c1), wall - (w2 - w1)
        with torch.no_grad():
            if mode == "p2p":
                flat = _flat([p.detach() for p in params], mine)
                works = [dist.isend(flat, peer, tag=7), dist.irecv(theirs, peer, tag=7)]
                for work in works:
                    work.wait()
                _unflat_into(flat.add_(theirs).div_(2), params)
            elif mode == "p2p-thread":
                if sent is not None:
                    sent.wait()
                sent = dist.isend(_flat([p.detach() for p in params], mine), peer, tag=7)
            if receiver is not None:
                update = receiver.inbox.get()
                for p, u in zip(params, _split(update, params), strict=True):
                    p.mul_(0.5).add_(u, alpha=0.5)
                receiver.free.put(update)
        if helper is not None:
            helper.done.wait()
            helper.done.clear()
        if mode == "sleep":
            time.sleep(IDLE_S)
        elif mode == "spin":
            until = time.perf_counter() + IDLE_S
            while time.perf_counter() < until:
                pass
        rows.append((cpu, wall, time.perf_counter() - t0))
    if sent is not None:
        sent.wait()
    elapsed = time.perf_counter() - began
    if spinner is not None:
        spinner.kill()
    warm = rows[len(rows) // 10:]
    out.put((rank, {"steps_per_s": len(rows) / elapsed,
                    "compute_cpu_ms": 1e3 * statistics.median(r[0] for r in warm),
                    "compute_wall_ms": 1e3 * statistics.median(r[1] for r in warm),
                    "step_ms": 1e3 * statistics.median(r[2] for r in warm)}))
    if exchanging:
        # a receiver thread still waits in a receive: leave without joining it, once the
        # queue's feeder thread has written the result
        out.close()
        out.join_thread()
        os._exit(0)


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    return [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in like]), like,
                                          strict=True)]


def run_mode(mode: str, workload: str, steps: int,
             awake: bool = False) -> dict[int, dict[str, float] | None]:
    context = mp.get_context("spawn")
    out = context.Queue()
    port = _free_port()
    procs = [context.Process(target=_worker, args=(r, mode, workload, steps, port, out, awake))
             for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds through the modes, interleaved (a VM's speed drifts)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--awake", action="store_true",
                        help="keep each worker's core busy when it would idle (see SPIN)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    runs: dict[str, list[dict[int, dict[str, float] | None]]] = {m: [] for m in args.modes}
    for _ in range(args.repeats):
        for mode in args.modes:
            runs[mode].append(run_mode(mode, args.workload, args.steps, args.awake))
    print(f"workload {args.workload}, {args.steps} steps a mode, 2 processes pinned to cores "
          f"0 and 1, one torch thread each{', cores kept awake' if args.awake else ''}; "
          f"median of {args.repeats} interleaved rounds "
          "(min-max of the compute CPU time)")
    print("| mode | rank | steps/s | compute wall ms | compute CPU ms | step ms | "
          "compute CPU vs solo |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    solo: float | None = None
    medians: dict[str, dict[int, dict[str, float]]] = {}
    for mode in args.modes:
        for rank in (0, 1):
            rows = [run[rank] for run in runs[mode] if run.get(rank) is not None]
            if not rows:
                continue
            row = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            medians.setdefault(mode, {})[rank] = row
            cpu = [r["compute_cpu_ms"] for r in rows]
            if mode == "solo":
                solo = row["compute_cpu_ms"]
            ratio = f"{row['compute_cpu_ms'] / solo:.2f}x" if solo else "-"
            print(f"| {mode} | {rank} | {row['steps_per_s']:.2f} | "
                  f"{row['compute_wall_ms']:.1f} | {row['compute_cpu_ms']:.1f} "
                  f"({min(cpu):.0f}-{max(cpu):.0f}) | {row['step_ms']:.1f} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "steps": args.steps, "runs": runs,
                       "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
