"""Benchmark: time per P-Reduce of each implementation in hetsync.protocols.prague.preduce.

For each group size and the flat size of each workload's model: one group of ranks 0..k-1 while
the other workers idle ("alone"), and all workers split into disjoint groups of k running at
once ("concurrent"; a smaller remainder group runs too but is not timed). One sample is the
time from the last member's start to the last member's end (the members' clocks are the same
monotonic clock); the table shows the median over --repeats samples. `subgroup first use` is a
P-Reduce on a group created for it (creation + admission all-reduce + all-reduce); the other
columns are steady state (subgroup: cached group).

    python experiments/preduce_options.py [--workers 8] [--repeats 40] [--out runs/bench-preduce]
        [--models svm cnn resnet 4MB]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import time
from pathlib import Path

import matplotlib
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetsync.protocols.prague.options import PREDUCE_KINDS as KINDS
from hetsync.protocols.prague.preduce import make_preducer
from hetsync.transport.flat import model_tensors
from hetsync.workloads import get_workload

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIRST_USE = "subgroup first use"
LABELS = [*KINDS, FIRST_USE]
TIMEOUT = datetime.timedelta(seconds=60)


def _groups(mode: str, k: int, world: int) -> list[tuple[int, ...]]:
    if mode == "alone":
        return [tuple(range(k))]
    return [tuple(range(s, min(s + k, world))) for s in range(0, world, k)]


def _worker(rank: int, args: argparse.Namespace, sizes: dict[str, int], port: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    world = args.workers
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=world, timeout=TIMEOUT)
    preducers = {kind: make_preducer(kind, rank, world, store=dist.PrefixStore(kind, store))
                 for kind in KINDS}
    samples: list[dict[str, object]] = []  # one per (row, label, repeat): this rank's span
    for mode in ("alone", "concurrent"):
        for k in args.group_sizes:
            if k > world or (mode == "concurrent" and k == world):  # same as alone
                continue
            mine = next((g for g in _groups(mode, k, world) if rank in g), None)
            for model, numel in sizes.items():
                flat = torch.randn(numel)
                for label in LABELS:
                    for repeat in range(-1, args.repeats):  # repeat -1: warm-up, not kept
                        preducer = preducers[label] if label in preducers else make_preducer(
                            "subgroup", rank, world, store=dist.PrefixStore("first", store))
                        dist.barrier()
                        start = time.perf_counter()
                        if mine is not None:
                            preducer.average(flat, mine)
                        end = time.perf_counter()
                        if label == FIRST_USE:
                            preducer.close()
                        if repeat >= 0 and mine is not None and len(mine) == k:
                            samples.append({"mode": mode, "group_size": k, "model": model,
                                            "label": label, "repeat": repeat,
                                            "start": start, "end": end})
    gathered: list[object] = [None] * world if rank == 0 else []
    dist.gather_object(samples, gathered if rank == 0 else None, dst=0)
    if rank == 0:
        (args.out / "samples.json").write_text(json.dumps([s for g in gathered for s in g]))
    for preducer in preducers.values():
        preducer.close()
    dist.destroy_process_group()


def _rows(samples: list[dict], sizes: dict[str, int]) -> list[dict]:
    spans: dict[tuple, list[tuple[float, float]]] = {}
    for s in samples:
        key = (s["mode"], s["group_size"], s["model"], s["label"], s["repeat"])
        spans.setdefault(key, []).append((s["start"], s["end"]))
    per_label: dict[tuple, list[float]] = {}
    for (mode, k, model, label, _), members in spans.items():
        last_start, last_end = max(a for a, _ in members), max(b for _, b in members)
        per_label.setdefault((mode, k, model, label), []).append(1e3 * (last_end - last_start))
    return [{"mode": mode, "group_size": k, "model": model, "numel": sizes[model],
             "kind": label, "median_ms": statistics.median(ms), "samples_ms": ms}
            for (mode, k, model, label), ms in per_label.items()]


def _report(rows: list[dict], out: Path) -> None:
    table: dict[tuple, dict[str, float]] = {}
    for r in rows:
        table.setdefault((r["mode"], r["group_size"], r["model"], r["numel"]), {})[r["kind"]] = (
            r["median_ms"])
    print(f"\nmedian ms per P-Reduce (ratio to the best steady-state option of the row)\n"
          f"{'mode':10s} {'k':>2s} {'model':>15s} " + " ".join(f"{x:>18s}" for x in LABELS))
    for (mode, k, model, numel), ms in table.items():
        best = min(ms[kind] for kind in KINDS)
        cells = [f"{ms[x]:8.2f} ({ms[x] / best:5.2f}x)" for x in LABELS]
        row = f"{mode:10s} {k:2d} {f'{model} {numel}':>15s} "
        print(row + " ".join(f"{c:>18s}" for c in cells))
    modes = list(dict.fromkeys(mode for mode, *_ in table))
    fig, axes = plt.subplots(len(modes), 1, figsize=(12, 4.5 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        rows_here = [(key, ms) for key, ms in table.items() if key[0] == mode]
        width = 0.8 / len(LABELS)
        for i, label in enumerate(LABELS):
            ax.bar([j + i * width for j in range(len(rows_here))],
                   [ms[label] for _, ms in rows_here], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows_here))],
                      [f"k={k}\n{model}" for (_, k, model, _), _ in rows_here])
        ax.set_yscale("log")
        ax.set_ylabel("ms per P-Reduce (median)")
        ax.set_title(f"P-Reduce, {mode}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "preduce.png", dpi=110)
    print(f"\nwrote {out / 'results.json'} and {out / 'preduce.png'}")


def _numel(model: str) -> int:
    """A workload's model size, or a size in MiB of fp32 (`4MB`)."""
    if model.endswith("MB"):
        return int(float(model[:-2]) * 2**20) // 4
    return sum(t.numel() for t in model_tensors(get_workload(model).build_model()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--group-sizes", type=int, nargs="+", default=[2, 3, 4, 8])
    p.add_argument("--models", nargs="+", default=["svm", "cnn", "resnet"],
                   help="workloads, or sizes in MiB of fp32 (e.g. 4MB)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-preduce"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {m: _numel(m) for m in args.models}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    mp.spawn(_worker, args=(args, sizes, port), nprocs=args.workers)
    samples = json.loads((args.out / "samples.json").read_text())
    (args.out / "samples.json").unlink()
    rows = _rows(samples, sizes)
    (args.out / "results.json").write_text(json.dumps(
        {"workers": args.workers, "repeats": args.repeats, "sizes": sizes, "rows": rows},
        indent=1))
    print(f"{args.workers} workers, {args.repeats} repeats, {time.monotonic() - started:.0f} s")
    _report(rows, args.out)


if __name__ == "__main__":
    main()
