"""Does compression on the wire pay where bytes are the cost? (issue 53's goal)

8 workers train digits to the target loss on an emulated 1 Gbit network, each message charged
as if the model weighed 100 MB (`--network bandwidth=1Gbit,latency=50us --payload 100MB`):
the compute is real, the network emulated (the charge is the compressed bytes' modelled
time). Each protocol runs with `--compress none`, `bf16` and `int8` in one session, side by
side; a row gives the time to the target against `none`'s (the speed-up the goal sets: bf16
>= 1.6x, int8 >= 2.5x), the final held-out loss, the bytes one worker sent per iteration, and
the codec's own cost on the real (small) model: a run without the emulated network, each
codec's samples/s against none's.

    python experiments/compression.py [--out runs/compression] [--protocols allreduce,hop]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.report.colours import protocol_colour

CODECS = ("none", "bf16", "int8")
NETWORK = {"network": "bandwidth=1Gbit,latency=50us", "payload": "100MB"}


def _train(out: Path, protocol: str, codec: str, workers: int, max_time: float,
           **options: object) -> dict:
    config = RunConfig(protocol=protocol, workers=workers, workload="digits", compress=codec,
                       max_time=max_time, out=str(out), overwrite=True, quiet=True,
                       device="cpu", **options)
    summary = run(config).summary
    rows = [json.loads(line) for path in sorted((out / "workers").glob("rank*.jsonl"))
            for line in path.read_text().splitlines()]
    summary["bytes_per_iteration"] = mean(r["bytes_sent"] for r in rows) if rows else 0.0
    return summary


def _ratio(base: float | None, value: float | None) -> str:
    return f"{base / value:.2f}x" if base and value else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/compression"))
    parser.add_argument("--protocols", default="allreduce,hop,prague")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-time", type=float, default=240.0)
    args = parser.parse_args()
    lines = ["| protocol | codec | time to target (s) | speed-up vs none | final loss | "
             "bytes sent / iteration | samples/s, free network, vs none |",
             "|---|---|---|---|---|---|---|"]
    results: dict[str, dict[str, dict]] = {}
    for protocol in args.protocols.split(","):
        results[protocol] = {}
        for codec in CODECS:
            emulated = _train(args.out / f"{protocol}-{codec}", protocol, codec, args.workers,
                              args.max_time, **NETWORK)
            free = _train(args.out / f"{protocol}-{codec}-free", protocol, codec, 2, 6.0,
                          stop_at_target=False)
            results[protocol][codec] = {"emulated": emulated, "free": free}
            base = results[protocol]["none"]
            line = (f"| {protocol} | {codec} | {emulated['time_to_target_s']} | "
                    f"{_ratio(base['emulated']['time_to_target_s'], emulated['time_to_target_s'])}"
                    f" | {emulated['final_loss']:.4f} | {emulated['bytes_per_iteration']:.0f} | "
                    f"{_ratio(free['samples_per_s'], base['free']['samples_per_s'])} |")
            lines.append(line)
            print(line, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    _plot(results, args.out / "time-to-target.png")


def _plot(results: dict[str, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(CODECS)
    for i, (protocol, by_codec) in enumerate(results.items()):
        for j, codec in enumerate(CODECS):
            value = by_codec[codec]["emulated"]["time_to_target_s"] or 0.0
            ax.bar(i + (j - 1) * width, value, width, color=protocol_colour(protocol),
                   alpha=(1.0, 0.65, 0.35)[j], label=codec if i == 0 else None)
    ax.set_xticks(range(len(results)), list(results))
    ax.set_ylabel("time to target (s)")
    ax.set_title("8 workers, emulated 1 Gbit, 100 MB payload: none / bf16 / int8")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
