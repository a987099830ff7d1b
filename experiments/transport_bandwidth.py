"""Transport bandwidth against raw gloo (issue 22): what hetsync's data paths move per second
beside gloo's own point-to-point and all-reduce, in one run, on one machine.

N gloo processes (default 2) on 127.0.0.1, one torch thread each (as hetsync's launcher gives
workers sharing a machine), move one model-sized payload: full-width ResNet-18's tensors
(`--workload resnet-wide`, 44.7 MB in fp32), or with `--mb P` a model of P MB in 64 tensors,
laid out in one buffer as `SyncOptimizer` lays a run's model out.
Each row: --repeats timed iterations after `WARM_UP` untimed ones. A row's time is the slowest
rank's mean iteration: bytes over the time they took, a sustained rate. Ranks of the drivers
that do not move in lockstep (Hop, AD-PSGD, Prague, the parameter server) drift apart by an
iteration, so iteration i of one rank is not set against iteration i of another (that pairing,
the median of each index's slowest, counted a rank's long iteration and not the short one that
followed it: Hop's rate read 10 points low). A median per rank hid real time the other way:
Prague's few long iterations.

* raw send: `dist.send` of one preallocated buffer, ranks 0->1, 2->3, ..., answered by 4 bytes
* raw exchange: simultaneous exchange on the ring (isend to the right, recv from the left)
* raw all-reduce: `dist.all_reduce` of the same bytes
* link exchange: hetsync's transport alone, as the drivers use it: `Link.pack` a header and
  the model into a reused message, `Link.isend` it to the right, receive from the left on
  `PeerStreams`' thread, hand it to the training thread, `Link.unpack_into` the model
* allreduce: iterations of the real All-Reduce driver (no compute: fresh zero gradients made
  before each iteration's clock starts, as a backward pass leaves them) through an
  instrumented link: flatten, divide, all-reduce, unpack the buffers (the reduced gradients
  stay in the flat buffer)
* hop: iterations of the real Hop driver (no compute) on the ring through the instrumented
  link: pack, send, receive on threads, average into the model
* adpsgd: iterations of the real AD-PSGD driver: odd (active) ranks request an average from
  an even (passive) neighbour, which serves it on its receiver thread and replies
* dpsgd: iterations of the real D-PSGD driver on the ring: pack, exchange with both
  neighbours, average into the model
* prague: iterations of the real Prague driver (its default: overlapped, `ready` groups, here
  of 2): merge the averaged copy into the model, ask rank 0's Group Generator, P-Reduce the
  copy on the communication thread
* localsgd: iterations of the real Local SGD driver averaging every step (`--local-steps 1`):
  flatten, all-reduce, unpack
* ps: iterations of the real parameter server driver (`--ps-mode sync`; the server is a thread
  on rank 0): push the gradient, the server's optimizer step on the mean, pull the model

Every driver runs as in a run: the last iteration says it wants to stop, and the loop goes on
until the driver stops it (a Prague worker that just closes, with no last request, left its
partner waiting for a group once in five runs). The stopping iterations are not timed: they
agree on a stop, which a run does once.

GB/s is the payload's bytes over the row's time, times the payloads the row's busiest rank
moves in an iteration (`copies`): on a ring of more than 2, Hop and D-PSGD send to 2
neighbours; AD-PSGD's request and reply count twice, and a passive rank serves 2 active ones
beyond 2 workers; the parameter server takes a push from each worker and replies to each.
Each row is set against the raw row that moves bytes the same way (`pattern`): Prague's
groups of 2 against gloo's all-reduce at 2 workers (the same pair), against the exchange
beyond (a buffer each way, where an all-reduce of n moves 2(n-1)/n). The hetsync rows are
also broken down into their link calls (median ms per iteration, on the rank's threads), so
the slow stage shows.

    .venv/bin/python experiments/transport_bandwidth.py [--workers 2] [--mb 45] \\
        [--repeats 20] [--out runs/transport-bandwidth]

Takes about a minute for 2 workers at 45 MB on an idle 2-core machine. Prints the tables;
writes results.json and bandwidth.png under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from local_gloo import TIMEOUT, free_port, join, runtime
from torch import nn

from hetsync.config import RunConfig
from hetsync.protocols.adpsgd.driver import ADPSGD
from hetsync.protocols.allreduce.driver import AllReduce
from hetsync.protocols.base import Protocol
from hetsync.protocols.dpsgd.driver import DPSGD
from hetsync.protocols.hop.driver import Hop
from hetsync.protocols.localsgd.driver import LocalSGD
from hetsync.protocols.prague.driver import Prague
from hetsync.protocols.ps.driver import ParameterServer
from hetsync.step import Step
from hetsync.transport.contiguous import lay_out
from hetsync.transport.flat import model_tensors
from hetsync.transport.header import Frame
from hetsync.transport.links import Link, Links
from hetsync.transport.peer_streams import PeerStreams
from hetsync.workloads import get_workload

ROWS = ("raw send", "raw exchange", "raw all-reduce", "link exchange", "allreduce", "hop",
        "adpsgd", "dpsgd", "prague", "localsgd", "ps")
PATTERN = {"link exchange": "raw exchange", "allreduce": "raw all-reduce",
           "hop": "raw exchange", "adpsgd": "raw send", "dpsgd": "raw exchange",
           "prague": "raw all-reduce", "localsgd": "raw all-reduce", "ps": "raw send"}
"""The raw row each hetsync row moves its bytes like: both ways at once, or one way at a time
(`pattern`: Prague's beyond 2 workers)."""


def pattern(row: str, workers: int) -> str | None:
    """The raw row `row` is set against (None: a raw row)."""
    if row == "prague" and workers > 2:
        return "raw exchange"  # its pairs: a buffer each way, not an all-reduce of n
    return PATTERN.get(row)


def copies(row: str, workers: int) -> int:
    """Payloads the busiest rank moves in one iteration of `row` (see the module doc)."""
    neighbours = 1 if workers == 2 else 2  # the ring's
    return {"hop": neighbours, "dpsgd": neighbours, "adpsgd": 2 * neighbours,
            "ps": 2 * (workers - 1)}.get(row, 1)
_TAG = 7
WARM_UP = 2
"""Untimed iterations first: the first moves faults in pages and starts every thread, the
second meets a neighbour's first, which came later."""
Span = tuple[str, str, float, float]
"""(thread, link call, start, end), perf_counter seconds."""


class TimedLink(Link):
    """The host link, recording when each of its calls (and each send's wait) began and ended,
    on which thread: the drivers run unchanged through it."""

    def __init__(self) -> None:
        super().__init__("host", None, torch.device("cpu"))
        self.spans: list[Span] = []

    def _time(self, op: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            if args and _small(args[0]):
                op += " (small)"  # a header-only message: Hop's tokens, the end markers
            self.spans.append((threading.current_thread().name, op, began, time.perf_counter()))

    def flat(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._time("flat", super().flat, *args, **kwargs)

    def pack(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._time("pack", super().pack, *args, **kwargs)

    def empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._time("empty", super().empty, *args, **kwargs)

    def unpack_into(self, *args: Any, **kwargs: Any) -> None:
        self._time("unpack", super().unpack_into, *args, **kwargs)

    def mix_into(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        return self._time("average", super().mix_into, *args, **kwargs)

    def all_reduce(self, *args: Any, **kwargs: Any) -> Any:
        return self._time("all-reduce", super().all_reduce, *args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> None:
        self._time("send", super().send, *args, **kwargs)

    def exchange(self, *args: Any, **kwargs: Any) -> None:
        """Timed as one call (a P-Reduce's round: its sends and receives, posted together)."""
        self._time("exchange", super().exchange, *args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> None:
        self._time("recv", super().recv, *args, **kwargs)

    def isend(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> _TimedWork:
        work = self._time("isend", super().isend, tensor, *args, **kwargs)
        return _TimedWork(self, "send wait" + " (small)" * _small(tensor), work)

    def irecv(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> _TimedWork:
        work = self._time("irecv", super().irecv, tensor, *args, **kwargs)
        return _TimedWork(self, "recv wait" + " (small)" * _small(tensor), work)


def _small(message: object) -> bool:
    """Whether `message` (a tensor or a Frame) is a few bytes, not a model."""
    return getattr(message, "nbytes", 2**16) < 2**16


class _TimedWork:
    """A Work whose wait() is timed."""

    def __init__(self, link: TimedLink, op: str, work: dist.Work) -> None:
        self.link, self.op, self.work = link, op, work

    def wait(self) -> bool:
        return self.link._time(self.op, self.work.wait)


# --- the rows, on each rank ------------------------------------------------------------------
def _rounds(repeats: int, round_: Callable[[], None]) -> list[tuple[float, float]]:
    """(start, end) of this rank's rounds after the warm-up, every round begun by a barrier."""
    windows = []
    for i in range(WARM_UP + repeats):
        dist.barrier()
        began = time.perf_counter()
        round_()
        if i >= WARM_UP:
            windows.append((began, time.perf_counter()))
    return windows


def _raw(rank: int, world: int, nbytes: int, repeats: int
         ) -> dict[str, list[tuple[float, float]]]:
    buffer, other = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    ack = torch.zeros(1)
    right, left = (rank + 1) % world, (rank - 1) % world
    partner = rank ^ 1 if (rank ^ 1) < world else None

    def send() -> None:
        if partner is None:
            return
        if rank % 2 == 0:
            dist.send(buffer, partner)
            dist.recv(ack, partner)
        else:
            dist.recv(other, partner)
            dist.send(ack, partner)

    def exchange() -> None:
        work = dist.isend(buffer, right)
        dist.recv(other, left)
        work.wait()

    return {"raw send": _rounds(repeats, send), "raw exchange": _rounds(repeats, exchange),
            "raw all-reduce": _rounds(repeats, lambda: dist.all_reduce(buffer))}


def _link_exchange(rank: int, world: int, tensors: Sequence[torch.Tensor], repeats: int,
                   link: TimedLink) -> list[tuple[float, float]]:
    """The transport alone: a reused message out, `PeerStreams` in, unpacked into the model."""
    frame = Frame.of(tensors, words=2)
    right, left = (rank + 1) % world, (rank - 1) % world
    rounds = WARM_UP + repeats
    streams = PeerStreams(link, [left], _TAG, lambda: link.empty(frame),
                          lambda m: frame.header(m)[0] == rounds - 1, reuse=True,
                          name="bench")
    messages = iter(streams)
    out: torch.Tensor | None = None
    count = 0

    def round_() -> None:
        nonlocal out, count
        out = link.pack(frame, (count, 0), tensors, out=out)
        work = link.isend(out, right, _TAG)
        _, message = next(messages)
        with torch.no_grad():
            link.unpack_into(frame.payload(message), tensors)
        work.wait()
        count += 1

    windows = _rounds(repeats, round_)
    for _ in messages:  # the last message ends the stream
        pass
    return windows


def _driver(rank: int, world: int, model: nn.Module, repeats: int, link: TimedLink,
            protocol: type[Protocol], runs: bool, gradients: bool = False,
            **options: Any) -> list[tuple[float, float]]:
    """(start, end) of each iteration after a warm-up of the real `protocol` driver, without
    compute or optimizer step (the model is what moves); `runs`: whether this rank iterates
    (AD-PSGD's passive ranks only serve); `gradients`: whether each iteration begins with
    fresh gradients, as after a backward pass (what All-Reduce moves)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    config = RunConfig(protocol=protocol.name, workers=world, topology="ring",
                       hang_timeout=TIMEOUT.total_seconds(), **options)
    driver = protocol(runtime(rank, config, dist.HashStore(), Links(direct=link, host=link)),
                      model, optimizer)
    spans = []
    dist.barrier()
    timed = range(WARM_UP + 1, WARM_UP + repeats + 1)
    i, stopped = 0, not runs
    while not stopped:  # as a run's loop: on until the driver stops it
        i += 1
        if i > timed.stop + 50:
            raise RuntimeError(f"{protocol.name} did not stop after {i - 1} iterations")
        if gradients:  # what a backward pass leaves, made before the iteration's clock starts
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        step = Step(iteration=i)
        driver.begin_iteration(step)
        step.wants_stop = i >= timed.stop  # as a run's last step says (Prague's GG needs it)
        driver.before_optimizer_step(step)
        driver.after_optimizer_step(step)
        if i in timed:
            spans.append((step.start, time.perf_counter()))
        stopped = step.stop
    driver.close()
    dist.barrier()
    return spans


def _model(args: argparse.Namespace) -> nn.Module:
    if args.mb is None:
        return get_workload("resnet-wide").build_model()
    numel = int(args.mb * 1e6 / 4 / 64)
    return nn.ParameterList([nn.Parameter(torch.randn(numel)) for _ in range(64)])


def _worker(rank: int, port: int, args: argparse.Namespace, out: Path) -> None:
    world = args.workers
    join(rank, world, port)
    torch.manual_seed(0)
    model = _model(args)
    tensors = model_tensors(model)
    lay_out(tensors)  # as SyncOptimizer lays a run's model out
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    result: dict[str, Any] = {"rank": rank, "bytes": nbytes, "spans": {},
                              "iterations": _raw(rank, world, nbytes, args.repeats)}
    for row, measure in (
        ("link exchange", lambda link: _link_exchange(rank, world, tensors, args.repeats, link)),
        ("allreduce", lambda link: _driver(rank, world, model, args.repeats, link, AllReduce,
                                           True, gradients=True)),
        ("hop", lambda link: _driver(rank, world, model, args.repeats, link, Hop, True)),
        ("adpsgd", lambda link: _driver(rank, world, model, args.repeats, link, ADPSGD,
                                        rank % 2 == 1)),
        ("dpsgd", lambda link: _driver(rank, world, model, args.repeats, link, DPSGD, True)),
        ("prague", lambda link: _driver(rank, world, model, args.repeats, link, Prague, True,
                                        group_size=2)),
        ("localsgd", lambda link: _driver(rank, world, model, args.repeats, link, LocalSGD,
                                          True, local_steps=1)),
        ("ps", lambda link: _driver(rank, world, model, args.repeats, link, ParameterServer,
                                    True, gradients=True)),
    ):
        link = TimedLink()
        result["iterations"][row] = measure(link)
        result["spans"][row] = link.spans
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    # Leave without tearing gloo down: an exit racing the drivers' finished daemon threads
    # aborted now and then ("terminate called without an active exception").
    os._exit(0)


# --- the report, in the parent ---------------------------------------------------------------
def _stages(spans: Sequence[Span], iterations: Sequence[tuple[float, float]]
            ) -> dict[str, float]:
    """Median ms per iteration in each (thread, link call) ending in it, over `iterations`
    (a receive's time is mostly waiting: it is posted long before its message comes), and the
    hand-off: from a receive's end to the next call on another thread (the consumer taking
    the message, unless that thread was busy)."""
    per: dict[str, list[float]] = {}
    for began, ended in iterations:
        totals: dict[str, float] = {}
        inside = [span for span in spans if began <= span[3] < ended]  # by when it ended
        for thread, op, start, end in inside:
            key = f"{_thread(thread)}: {op}"
            totals[key] = totals.get(key, 0.0) + (end - start) * 1e3
            if op == "recv":
                after = [s for t, _, s, _ in inside if t != thread and s >= end]
                if after:
                    totals["hand-off"] = totals.get("hand-off", 0.0) + (min(after) - end) * 1e3
        for key, ms in totals.items():
            per.setdefault(key, []).append(ms)
    return {key: statistics.median(ms) for key, ms in sorted(per.items())}


def _thread(name: str) -> str:
    """A thread's role: the training thread, a receiver (`...-from-j`), or a driver's own."""
    if name == "MainThread":
        return "main"
    return "peer recv" if "-from-" in name else name


def _report(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    nbytes = results[0]["bytes"]
    rows: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        seconds = max(statistics.fmean(end - start for start, end in rank["iterations"][row])
                      for rank in results if rank["iterations"][row])  # AD-PSGD: active ranks
        moved = copies(row, args.workers) * nbytes
        rows[row] = {"ms": seconds * 1e3, "gb_per_s": moved / seconds / 1e9}
    for name, row in rows.items():
        row["ratio_to_send"] = row["gb_per_s"] / rows["raw send"]["gb_per_s"]
        if (like := pattern(name, args.workers)) is not None:
            row["pattern"] = like
            row["ratio_to_pattern"] = row["gb_per_s"] / rows[like]["gb_per_s"]
    print(f"{args.workers} workers, payload {nbytes / 1e6:.1f} MB, {args.repeats} iterations "
          "a row: the slowest rank's mean")
    print("| path | ms | GB/s | / raw send | / raw, same pattern |")
    print("| --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        same = (f"{row['ratio_to_pattern']:.2f}x of {row['pattern']}" if "pattern" in row
                else "-")
        print(f"| {name} | {row['ms']:.1f} | {row['gb_per_s']:.2f} | "
              f"{row['ratio_to_send']:.2f}x | {same} |")
    stages = {}
    for row in PATTERN:
        stages[row] = {}
        for r in results[:2]:  # a passive AD-PSGD rank: its client's iterations
            windows = r["iterations"][row] or results[r["rank"] ^ 1]["iterations"][row]
            stages[row].update({f"rank {r['rank']} {key}": ms for key, ms
                                in _stages(r["spans"][row], windows).items()})
        print(f"\n{row}: median ms per iteration in each link call (ranks 0 and 1)")
        for key, ms in stages[row].items():
            print(f"  {key:<40} {ms:8.1f}")
    return {"workers": args.workers, "bytes": nbytes, "repeats": args.repeats, "rows": rows,
            "stages": stages, "ranks": results}


def _plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetsync.report.colours import protocol_colour

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(report["rows"])
    ax.bar(names, [report["rows"][n]["gb_per_s"] for n in names],
           color=[protocol_colour(n) for n in names])  # the raw rows grey
    ax.set_ylabel("GB/s (payload / time)")
    ax.set_title(f"{report['bytes'] / 1e6:.0f} MB, {report['workers']} gloo processes")
    fig.tight_layout()
    fig.savefig(out / "bandwidth.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mb", type=float, default=None,
                        help="payload in MB (default: resnet-wide's tensors, 44.7 MB)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("runs/transport-bandwidth"))
    args = parser.parse_args()
    if args.workers < 2 or args.workers % 2:
        parser.error("--workers must be even and >= 2 (AD-PSGD's ring is bipartite)")
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mp.spawn(_worker, args=(port, args, args.out), nprocs=args.workers)
    results = [json.loads((args.out / f"rank{r}.json").read_text())
               for r in range(args.workers)]
    for r in range(args.workers):
        (args.out / f"rank{r}.json").unlink()
    report = _report(results, args)
    report["load_average"] = os.getloadavg()
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    _plot(report, args.out)
    print(f"\nload average {os.getloadavg()[0]:.2f}; wrote {args.out / 'results.json'} and "
          f"{args.out / 'bandwidth.png'}")


if __name__ == "__main__":
    main()
