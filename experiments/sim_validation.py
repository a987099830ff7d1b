"""Benchmark: the simulator against real runs of the same configuration.

For each worker count, benchmark-suite slowdown (homogeneous, one worker 5x slow, random 4x
with p=0.1), network (free loopback, or the paper regime: 10 Gbit/s with a 100 MB payload) and
protocol variant that has a simulation, this runs `hetsync train` and `hetsync simulate --math`
with the same options and compares simulated with measured throughput (samples/s; the issue
asks within 15 %) and time to target (within 25 %). Real runs go one at a time, since they
share the machine's cores; the load average before each is recorded. Each run directory is
kept under --out (real/, sim/) and reused when it exists, so an interrupted comparison resumes
and a second one with other plots costs nothing; `--real DIR` reuses real runs made elsewhere.
`--calibrate` prints the figures `hetsync.simulator.costs` takes from the real runs.
A real run takes --max-time plus 10-30 s of start-up; the default matrix is about 40 minutes.

    .venv/bin/python experiments/sim_validation.py [--workers 8,16] [--protocols hop,prague] \\
        [--settings homogeneous,one-5x-slow,random] [--networks free,paper] [--max-time 20] \\
        [--real DIR] [--calibrate] [--out runs/bench-sim-validation]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim_calibration import from_runs

from hetsync import cli
from hetsync.bench.suites import HETEROGENEITY, NETWORKS
from hetsync.errors import ConfigError
from hetsync.protocols.catalog import SIMULATED, all_variants

COMMAND = "python experiments/sim_validation.py"
THROUGHPUT_TOLERANCE, TARGET_TOLERANCE = 0.15, 0.25
HETSYNC = str(Path(sys.executable).with_name("hetsync"))
SETTINGS = {"homogeneous": HETEROGENEITY["homogeneous"],
            "one-5x-slow": HETEROGENEITY["one 5x slow"],
            "random": HETEROGENEITY["random x4"]}
#: name -> (--network, --payload): loopback as it is, or the regime suites' paper-scale cell.
NETWORK_SETTINGS = {"free": ("none", "none"), "paper": (NETWORKS["10Gbit"], "100MB")}
#: The variants compared: every family's default and its best-known option set.
#: hop-auto is `--protocol hop` with no options.
VARIANTS = ("allreduce", "ddp", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop", "hop-auto",
            "hop-skip", "prague", "prague-paper")
_BY_LABEL = {v.label: v for v in all_variants()}


@dataclass(frozen=True)
class Case:
    variant: str
    workers: int
    setting: str
    network: str

    @property
    def name(self) -> str:
        return f"{self.variant}-{self.setting}-{self.network}-{self.workers}w"

    def options(self, args: argparse.Namespace) -> list[str]:
        """The options shared by `train` and `simulate`."""
        network, payload = NETWORK_SETTINGS[self.network]
        flags = ["--workload", "svm", "--workers", str(self.workers), "--step-time",
                 f"{args.step_time:g}", "--max-time", f"{args.max_time:g}", "--slowdown",
                 SETTINGS[self.setting], "--network", network, "--payload", payload,
                 "--target-loss", f"{args.target_loss:g}", "--no-stop-at-target",
                 "--seed", str(args.seed), "--label", self.name]
        return flags + cli.train_flags(_BY_LABEL[self.variant].run_options)


def simulated_variants() -> list[str]:
    """The variants whose protocol has a simulation."""
    return [v for v in VARIANTS if _BY_LABEL[v].protocol in SIMULATED]


def _summary(run_dir: Path, case: Case, args: argparse.Namespace) -> dict[str, Any] | None:
    """The summary of a finished run of `case` in `run_dir`, if it is one (same duration)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        config = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    same = (config.get("max_time") == args.max_time and summary.get("workers") == case.workers
            and config.get("target_loss") == args.target_loss)
    return summary if same else None


def _run(kind: str, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """The summary of `case` run by `kind` (train or simulate), from the cache when it is there."""
    out = args.out / ("real" if kind == "train" else "sim") / case.name
    for candidate in ([args.real / case.name] if kind == "train" and args.real else []) + [out]:
        summary = _summary(candidate, case, args)
        if summary is not None:
            return {"summary": summary, "dir": str(candidate), "load": None}
    load = os.getloadavg()[0]
    command = [HETSYNC, kind, *case.options(args), "--out", str(out), "--overwrite", "--quiet"]
    if kind == "simulate":
        command.append("--math")
    began = time.monotonic()
    if kind == "simulate":  # in this process: no start-up, and nothing runs beside it
        if cli.main(command[1:]) != 0:
            raise RuntimeError(f"{' '.join(command)} failed")
    else:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    print(f"  {kind} {case.name}: {time.monotonic() - began:.0f} s wall, load {load:.1f}",
          flush=True)
    summary = json.loads((out / "summary.json").read_text())
    (out / "validation_load.json").write_text(json.dumps({"load_average": load}) + "\n")
    return {"summary": summary, "dir": str(out), "load": load}


def _load_of(result: dict[str, Any]) -> float | None:
    if result["load"] is not None:
        return float(result["load"])
    try:
        return float(json.loads((Path(result["dir"]) / "validation_load.json").read_text())
                     ["load_average"])
    except (OSError, ValueError, KeyError):
        return None


def _ratio(sim: float | None, real: float | None) -> float | None:
    return sim / real if sim and real else None


def _made(case: Case, args: argparse.Namespace) -> bool:
    """Whether a real run of `case` exists (in --real or --out)."""
    places = ([args.real] if args.real else []) + [args.out / "real"]
    return any(_summary(place / case.name, case, args) is not None for place in places)


def compare(case: Case, args: argparse.Namespace) -> dict[str, Any] | None:
    if args.only_made and not _made(case, args):
        return None
    real = _run("train", case, args)
    if args.only_real:
        return None
    sim = _run("simulate", case, args)
    r, s = real["summary"], sim["summary"]
    return {
        "case": case.name, "variant": case.variant, "workers": case.workers,
        "setting": case.setting, "network": case.network,
        "real_samples_per_s": r["samples_per_s"], "sim_samples_per_s": s["samples_per_s"],
        "throughput_ratio": _ratio(s["samples_per_s"], r["samples_per_s"]),
        "real_time_to_target_s": r["time_to_target_s"],
        "sim_time_to_target_s": s["time_to_target_s"],
        "target_ratio": _ratio(s["time_to_target_s"], r["time_to_target_s"]),
        "real_sync_wait": r["sync_wait_fraction"], "sim_sync_wait": s["sync_wait_fraction"],
        "load_average": _load_of(real), "real_dir": real["dir"], "sim_dir": sim["dir"],
    }


# --- output ----------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def _mark(ratio: float | None, tolerance: float) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}" + ("" if abs(ratio - 1) <= tolerance else " ✗")


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| run | workers | setting | network | real samples/s | sim samples/s | sim/real "
             "| real to target (s) | sim to target (s) | sim/real | sync wait real / sim | load |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['workers']} | {r['setting']} | {r['network']} | "
            f"{r['real_samples_per_s']:.0f} | {r['sim_samples_per_s']:.0f} | "
            f"{_mark(r['throughput_ratio'], THROUGHPUT_TOLERANCE)} | "
            f"{_fmt(r['real_time_to_target_s'], '.1f')} | {_fmt(r['sim_time_to_target_s'], '.1f')}"
            f" | {_mark(r['target_ratio'], TARGET_TOLERANCE)} | "
            f"{100 * r['real_sync_wait']:.0f}% / {100 * r['sim_sync_wait']:.0f}% | "
            f"{_fmt(r['load_average'], '.1f')} |")
    return lines


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for key, tolerance, what in (("throughput_ratio", THROUGHPUT_TOLERANCE, "throughput"),
                                 ("target_ratio", TARGET_TOLERANCE, "time to target")):
        ratios = [r[key] for r in rows if r[key] is not None]
        inside = sum(abs(x - 1) <= tolerance for x in ratios)
        if ratios:
            lines.append(f"{what}: {inside} of {len(ratios)} runs within "
                         f"{100 * tolerance:.0f} % (sim/real from {min(ratios):.2f} to "
                         f"{max(ratios):.2f}, median {statistics.median(ratios):.2f})")
    return lines


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetsync.report.colours import protocol_styles

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    variants = sorted({r["variant"] for r in rows})
    colours = {v: style.fill for v, style in protocol_styles(variants).items()}
    markers = {8: "o", 16: "s"}
    panels = (("samples_per_s", "throughput (samples/s)", THROUGHPUT_TOLERANCE),
              ("time_to_target_s", "time to target (s)", TARGET_TOLERANCE))
    for ax, (key, title, tolerance) in zip(axes, panels, strict=True):
        points = [(r[f"real_{key}"], r[f"sim_{key}"], r) for r in rows
                  if r[f"real_{key}"] and r[f"sim_{key}"]]
        for real, sim, r in points:
            ax.scatter(real, sim, color=colours[r["variant"]],
                       marker=markers.get(r["workers"], "^"),
                       facecolors="none" if r["network"] == "paper" else colours[r["variant"]])
        if points:
            low = 0.8 * min(min(p[0], p[1]) for p in points)
            high = 1.2 * max(max(p[0], p[1]) for p in points)
            line = [low, high]
            ax.plot(line, line, "k-", lw=1, label="simulated = measured")
            ax.fill_between(line, [x * (1 - tolerance) for x in line],
                            [x * (1 + tolerance) for x in line], color="grey", alpha=0.2,
                            label=f"±{100 * tolerance:.0f} %")
            ax.set_xlim(low, high)
            ax.set_ylim(low, high)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {title}")
        ax.set_ylabel(f"simulated {title}")
        ax.set_title(f"{title}: one point per run")
    for v in variants:
        axes[0].scatter([], [], color=colours[v], label=v)
    for n, m in markers.items():
        axes[0].scatter([], [], color="k", marker=m, label=f"{n} workers")
    axes[0].scatter([], [], facecolors="none", edgecolors="k", label="paper network (hollow)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="8,16", help="comma-separated worker counts")
    p.add_argument("--protocols", default="",
                   help=f"variants to compare (default: those with a simulation, of "
                        f"{', '.join(VARIANTS)})")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--networks", default="free",
                   help=f"some of {', '.join(NETWORK_SETTINGS)} (paper: {NETWORKS['10Gbit']}, "
                        "--payload 100MB)")
    p.add_argument("--paper-subset", default="",
                   help="variants to run under the paper network only (default: all chosen)")
    p.add_argument("--max-time", type=float, default=20.0)
    p.add_argument("--step-time", type=float, default=50.0)
    p.add_argument("--target-loss", type=float, default=0.15, help="svm (the suites' target)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--real", type=Path, help="a folder of real run directories to reuse, "
                   "named as this script names them (e.g. an earlier --out's real/)")
    p.add_argument("--only-real", action="store_true",
                   help="make (or reuse) the real runs only: simulate and compare later")
    p.add_argument("--only-made", action="store_true",
                   help="compare only the cases whose real run exists: run no real run")
    p.add_argument("--calibrate", action="store_true",
                   help="also print the overhead and P-Reduce figures of the real runs "
                        "(experiments/sim_calibration.py's from_runs)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-sim-validation"))
    return p.parse_args()


def _cases(args: argparse.Namespace) -> list[Case]:
    available = simulated_variants()
    chosen = [v.strip() for v in args.protocols.split(",") if v.strip()] or available
    missing = [v for v in chosen if v not in available]
    if missing:
        raise ConfigError(f"no simulation (yet) for {', '.join(missing)}; simulated: "
                          f"{', '.join(available)}")
    settings = [s.strip() for s in args.settings.split(",")]
    networks = [n.strip() for n in args.networks.split(",")]
    paper_only = [v.strip() for v in args.paper_subset.split(",") if v.strip()] or chosen
    if any(s not in SETTINGS for s in settings) or any(n not in NETWORK_SETTINGS
                                                       for n in networks):
        raise ConfigError(f"--settings: some of {', '.join(SETTINGS)}; --networks: some of "
                          f"{', '.join(NETWORK_SETTINGS)}")
    workers = [int(n) for n in args.workers.split(",")]
    return [Case(v, n, s, net) for net in networks for n in workers for s in settings
            for v in chosen if net != "paper" or v in paper_only]


def main() -> int:
    args = _arguments()
    try:
        cases = _cases(args)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = os.getloadavg()
    rows = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.name}", flush=True)
        row = compare(case, args)
        if row is not None:
            rows.append(row)
    if args.only_real:
        return 0
    command = " ".join([COMMAND, *sys.argv[1:]])
    loads = [r["load_average"] for r in rows if r["load_average"] is not None]
    setting = (f"svm, --step-time {args.step_time:g} ms, --max-time {args.max_time:g} s, "
               f"target loss {args.target_loss:g}, seed {args.seed}; real runs one at a time on "
               f"{os.cpu_count()} CPUs shared with other sessions: load average "
               f"{min(loads, default=started[0]):.1f}-{max(loads, default=started[0]):.1f} "
               f"before the real runs (`uptime`'s 1-minute figure)")
    lines, summary = table(rows), verdict(rows)
    print("\n" + setting + "\n" + "\n".join(lines) + "\n" + "\n".join(summary))
    result: dict[str, Any] = {"command": command, "setting": setting, "rows": rows}
    if args.calibrate:
        result["calibration"] = from_runs(args.real or args.out / "real")
        print(json.dumps(result["calibration"], indent=2))
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    figure(rows, args.out / "sim_vs_real.png")
    (args.out / "results.md").write_text("\n".join(
        ["# The simulator against real runs", "", f"`{command}`", "", setting, "", *lines, "",
         *summary, "", "sim/real: simulated over measured; ✗ marks a ratio outside the goal "
         f"(throughput ±{100 * THROUGHPUT_TOLERANCE:.0f} %, time to target "
         f"±{100 * TARGET_TOLERANCE:.0f} %). Load: the 1-minute load average before the real "
         "run. Figure: sim_vs_real.png.", ""]))
    print(f"written: {args.out / 'results.md'}, results.json, sim_vs_real.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
