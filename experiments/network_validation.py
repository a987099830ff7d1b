"""Benchmark: the network cost model against the kernel's own traffic shaping.

Worker processes, each in its own network namespace with its NIC limited to --rate each way by
`tc` (experiments/shaping.py), time real gloo communications of --size bytes: a point-to-point
transfer, an all-reduce over all of them (gloo's ring) and an incast of every other worker
into one (a parameter server's gather). The cost model (hetsync.network) prices the same
messages on the same NICs; the issue asks for agreement within 15 %. The same cases run first
unshaped, which is what the processes themselves cost: a shaped time far above it is the
network's. Needs root for the namespaces; without it, says why and exits. About 2 minutes.

    .venv/bin/python experiments/network_validation.py [--rate 100Mbit] [--size 10MB] \\
        [--out runs/network-validation]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

from shaped_timing import CASES, time_cases
from shaping import MAX_WORKERS, ShapedNetwork, unavailable_reason

from hetsync.errors import ConfigError
from hetsync.network.model import Message, NetworkModel
from hetsync.network.patterns import point_to_point, ring_allreduce
from hetsync.network.spec import NetworkSpec, parse_network, parse_payload

TOLERANCE = 0.15
COMMAND = "python experiments/network_validation.py"
COLUMNS = ("Modelled: `NetworkModel.duration` of the case's messages. Shaped: the processes "
           "under tc limits, from the last one's start to the last one's end. Unshaped: the "
           "same without limits, what the processes cost themselves. Bench CPU: their CPU "
           "time over the shaped time. Machine busy: every CPU, other sessions' work "
           "included.")


def messages(case: str, world: int, nbytes: float) -> list[Message]:
    """The messages the model charges for `case`, as the timed processes send them."""
    if case == "p2p":
        return point_to_point(0, 1, nbytes)
    if case == "allreduce":
        return ring_allreduce(range(world), nbytes)
    return [Message(s, 0, nbytes) for s in range(1, world)]


def _arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--rate", default="100Mbit", help="each NIC's rate, each way")
    p.add_argument("--latency", default="0", help="one-way delay (needs netem in the kernel)")
    p.add_argument("--size", default="10MB", help="bytes per transfer / all-reduced buffer")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (after a warm-up)")
    p.add_argument("--mtu", type=int, default=9000)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--no-realtime", action="store_true",
                   help="leave the processes at normal priority (see experiments/shaped_timing.py)")
    p.add_argument("--out", type=Path, default=Path("runs/network-validation"))
    return p.parse_args()


def _check(args: argparse.Namespace) -> tuple[NetworkSpec, int, list[str]]:
    spec = parse_network(f"bandwidth={args.rate},latency={args.latency}")
    nbytes = parse_payload(args.size)
    cases = [c.strip() for c in args.cases.split(",")]
    if spec is None or nbytes is None:
        raise ConfigError("give a --rate and a --size")
    if any(c not in CASES for c in cases):
        raise ConfigError(f"--cases: expected some of {', '.join(CASES)}, got {args.cases!r}")
    if not 2 <= args.workers <= MAX_WORKERS or args.repeats < 1 or not 1280 <= args.mtu <= 65535:
        raise ConfigError(f"need 2-{MAX_WORKERS} --workers, --repeats >= 1 and an --mtu of "
                          "1280-65535")
    return spec, nbytes, cases


def _row(case: str, model_s: float, shaped: dict[str, Any], floor: dict[str, Any]) -> dict:
    shaped_s = statistics.median(shaped["durations_s"])
    return {
        "case": case, "modelled_s": model_s, "shaped_s": shaped_s,
        "ratio": shaped_s / model_s, "unshaped_s": statistics.median(floor["durations_s"]),
        "shaped_runs_s": shaped["durations_s"],
        "late_start_s": statistics.median(shaped["late_start_s"]),
        "process_cpu_cores": statistics.median(shaped["process_cpu_cores"]),
        "machine_busy": statistics.median(shaped["machine_busy"]),
    }


def _table(rows: list[dict]) -> list[str]:
    lines = ["| case | modelled (s) | shaped (s) | shaped / modelled | unshaped (s) | "
             "bench CPU (cores) | machine busy |", "| --- " + "| ---: " * 6 + "|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['modelled_s']:.3f} | {r['shaped_s']:.3f} | "
                     f"{r['ratio']:.3f} | {r['unshaped_s']:.3f} | {r['process_cpu_cores']:.2f} | "
                     f"{100 * r['machine_busy']:.0f}% |")
    return lines


def main() -> int:
    args = _arguments()
    try:
        spec, nbytes, cases = _check(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reason = unavailable_reason(latency=spec.default.latency > 0)
    if reason:
        print(f"skipped: {reason}")
        return 0
    for signum in (signal.SIGINT, signal.SIGTERM):  # clean up, even if started in background
        signal.signal(signum, signal.default_int_handler)
    load = os.getloadavg()[0]
    with ShapedNetwork(args.workers, mtu=args.mtu) as net:
        print(f"{args.workers} namespaces up ({net.prefix}-*); unshaped run", flush=True)
        realtime = not args.no_realtime
        floor = time_cases(net, cases, nbytes, args.repeats, realtime)["cases"]
        net.shape(spec.default.egress * 8, spec.default.latency)
        print(f"shaped to {args.rate} each way; shaped run", flush=True)
        timed = time_cases(net, cases, nbytes, args.repeats, realtime)
    shaped = timed["cases"]
    model = NetworkModel(spec, args.workers)
    rows = [_row(c, model.duration(messages(c, args.workers, nbytes)), shaped[c], floor[c])
            for c in cases]
    setting = (f"{args.workers} workers, {args.rate} each way, latency {args.latency}, "
               f"{args.size} ({nbytes} bytes), MTU {args.mtu}, median of {args.repeats} "
               f"after a warm-up; {'real-time' if timed['realtime'] else 'normal'} priority; "
               f"load average {load:.1f} on {os.cpu_count()} CPUs at the start")
    table = _table(rows)
    print("\n" + setting + "\n" + "\n".join(table))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    verdict = f"largest difference {100 * worst:.1f} % (goal: within {100 * TOLERANCE:.0f} %)"
    print(verdict)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join([COMMAND, *sys.argv[1:]])
    (args.out / "results.json").write_text(json.dumps(
        {"command": command, "setting": setting, "network": spec.text, "bytes": nbytes,
         "workers": args.workers, "mtu": args.mtu, "load_average": load, "rows": rows},
        indent=2) + "\n")
    (args.out / "results.md").write_text("\n".join(
        ["# The network model against tc shaping", "", f"`{command}`", "", setting, "",
         *table, "", verdict, "", COLUMNS, ""]))
    print(f"written: {args.out / 'results.md'}, results.json")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: the namespaces and their processes are gone", file=sys.stderr)
        sys.exit(130)
