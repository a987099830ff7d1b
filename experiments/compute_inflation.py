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

Per mode and rank: steps per second, median wall and CPU (`time.thread_time`) time of the
compute (forward, backward, optimizer step) and the median wall time of the whole step. The
compute's CPU time tells a slower core (caches, memory: CPU time grows) from a core shared with
other threads (wall time grows, CPU time does not). Takes 8 x `--steps` steps plus start-ups
(a minute or two for resnet).
Quoted in docs/benchmarks.md ("Real compute").
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetsync.workloads import get_workload

MODES = ("solo", "concurrent", "allreduce", "p2p", "p2p-thread", "p2p-thread-early", "wake",
         "copy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flat(tensors: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    torch.cat([t.reshape(-1) for t in tensors], out=out)
    return out


def _unflat_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


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
            out: Any) -> None:
    os.sched_setaffinity(0, {rank})
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
        rows.append((cpu, wall, time.perf_counter() - t0))
    if sent is not None:
        sent.wait()
    elapsed = time.perf_counter() - began
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
    views, offset = [], 0
    for t in like:
        views.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return views


def run_mode(mode: str, workload: str, steps: int) -> dict[int, dict[str, float] | None]:
    context = mp.get_context("spawn")
    out = context.Queue()
    port = _free_port()
    procs = [context.Process(target=_worker, args=(r, mode, workload, steps, port, out))
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
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    solo: dict[str, float] | None = None
    print(f"workload {args.workload}, {args.steps} steps a mode, 2 processes pinned to cores "
          "0 and 1, one torch thread each")
    print("| mode | rank | steps/s | compute wall ms | compute CPU ms | step ms | "
          "compute CPU vs solo |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode in args.modes:
        results[mode] = run_mode(mode, args.workload, args.steps)
        for rank, row in sorted(results[mode].items()):
            if row is None:
                continue
            if mode == "solo":
                solo = row
            ratio = (f"{row['compute_cpu_ms'] / solo['compute_cpu_ms']:.2f}x" if solo
                     else "-")
            print(f"| {mode} | {rank} | {row['steps_per_s']:.2f} | "
                  f"{row['compute_wall_ms']:.1f} | {row['compute_cpu_ms']:.1f} | "
                  f"{row['step_ms']:.1f} | {ratio} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "steps": args.steps, "modes": results},
                      f, indent=2)


if __name__ == "__main__":
    main()
