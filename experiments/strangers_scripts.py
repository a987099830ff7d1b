"""Benchmark: the strangers' scripts (examples/strangers/) under every protocol, against DDP.

Each script's hetsync version (`with_hetsync.py`, five lines from its plain version) runs under
hetsync's launcher with each protocol variant, at 2 and 4 workers, `--repeats` times with the
seeds 0..N-1 (the script's own `--seed` and the run's), and its plain version once per seed
as one ordinary process. Per (script, workers, variant) it reports how many runs exited
cleanly (the first failure's one-line error otherwise), the wall time of the launch, and the
script's own final held-out metric as rank 0 wrote it (mean ± standard deviation over the
repeats: the noise), with its gap to DDP's mean and to the plain script's. Quality and clean
ends, not speed: nothing is slowed down and the machine is shared.

    python experiments/strangers_scripts.py [--repeats 3] [--workers 2 4] [--small]
        [--only digits_cnn] [--variants ddp hop] [--out runs/strangers-scripts]

At the defaults (4 scripts x 11 variants x 2 world sizes x 3 repeats, the full forms) it takes
hours on a 2-core machine; `--small` (the short forms) and `--repeats 1` make it about 20 s a
run; `--resume` reuses the runs that have a result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hetsync.config import RunConfig
from hetsync.launch.launcher import run
from hetsync.protocols.catalog import all_variants

STRANGERS = Path(__file__).resolve().parents[1] / "examples" / "strangers"
SCRIPTS = sorted(p.name for p in STRANGERS.iterdir() if (p / "plain.py").is_file())
#: Every protocol family, with Prague's paper loop beside its default: what the issue names.
VARIANTS = ("ddp", "allreduce", "ps-sync", "ps-async", "dpsgd", "adpsgd", "hop", "prague",
            "prague-paper", "localsgd", "diloco")
PLAIN = "plain (1 process)"


def _one_line(error: BaseException) -> str:
    """The line of a failure that names it: the last non-empty line of its message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:200]


def launch(script: str, label: str, workers: int, seed: int,
           args: argparse.Namespace) -> dict[str, Any]:
    """One run of `script` under `label` (or its plain version alone, for PLAIN): rank 0's
    result.json with the wall time, or the one line it failed with."""
    slug = "plain" if label == PLAIN else f"{label}-w{workers}"
    run_dir = args.out / script / f"{slug}-seed{seed}"
    result_file = run_dir / "script" / ("result.json" if label == PLAIN else "rank0/result.json")
    if args.resume and result_file.is_file():
        return json.loads((run_dir / "record.json").read_text())
    script_args = ["--out", str(run_dir / "script"), "--seed", str(seed)]
    script_args += ["--small"] if args.small else []
    started = time.monotonic()
    try:
        if label == PLAIN:
            done = subprocess.run([sys.executable, str(STRANGERS / script / "plain.py"),
                                   *script_args], capture_output=True, text=True)
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                raise RuntimeError(lines[-1] if lines else f"exit status {done.returncode}")
        else:
            options = dict(next(v for v in all_variants() if v.label == label).run_options)
            run(RunConfig(workers=workers, seed=seed, quiet=True, out=run_dir / "run",
                          overwrite=True, device="cpu",
                          script=[str(STRANGERS / script / "with_hetsync.py"), *script_args],
                          **options))
        result = json.loads(result_file.read_text())
        record = {"value": result["value"], "metric": result["metric"],
                  "higher_is_better": result["higher_is_better"]}
    except Exception as error:  # every failure is a row of the table
        record = {"error": _one_line(error)}
    record["wall_s"] = time.monotonic() - started
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "record.json").write_text(json.dumps(record) + "\n")
    return record


def _mean_sd(values: list[float], digits: int = 4) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _gap(mine: list[float], base: list[float]) -> str:
    return f"{statistics.mean(mine) - statistics.mean(base):+.4f}" if mine and base else "-"


def table(script: str, rows: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown for one script: a row per (variant, workers) in `rows`' order."""
    ok_of = {key: [r for r in runs if "error" not in r] for key, runs in rows.items()}
    metric = next((r[0]["metric"] for r in ok_of.values() if r), "metric")
    plain = [r["value"] for r in ok_of.get(PLAIN, [])]
    lines = [f"**{script}** ({metric}; rank 0's own model)", "",
             "| protocol | workers | clean exits | wall (s) | metric | - DDP | - plain |",
             "|---|---|---|---|---|---|---|"]
    for key, runs in rows.items():
        label, _, workers = key.rpartition(" w")
        ok = ok_of[key]
        values = [r["value"] for r in ok]
        ddp = [r["value"] for r in ok_of.get(f"ddp w{workers}", [])]
        status = f"{len(ok)}/{len(runs)}"
        if len(ok) < len(runs):
            status += f": {next(r['error'] for r in runs if 'error' in r)}"
        wall = _mean_sd([r["wall_s"] for r in runs], 1)
        if label == "":  # the plain script
            label, workers = key, "1"
        lines.append(f"| {label} | {workers} | {status} | {wall} "
                     f"| {_mean_sd(values) if values else '-'} "
                     f"| {_gap(values, ddp) if label != 'ddp' else '-'} "
                     f"| {_gap(values, plain) if key != PLAIN else '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3, help="seeds 0..N-1: the noise")
    parser.add_argument("--small", action="store_true", help="the scripts' short forms")
    parser.add_argument("--only", choices=SCRIPTS, action="append", help="repeatable")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--resume", action="store_true", help="reuse runs that have a result")
    parser.add_argument("--out", type=Path, default=Path("runs/strangers-scripts"))
    args = parser.parse_args()

    everything: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for script in args.only or SCRIPTS:
        rows: dict[str, list[dict[str, Any]]] = {PLAIN: []}
        for seed in range(args.repeats):
            rows[PLAIN].append(launch(script, PLAIN, 1, seed, args))
        for workers in args.workers:
            for label in args.variants:
                for seed in range(args.repeats):
                    record = launch(script, label, workers, seed, args)
                    rows.setdefault(f"{label} w{workers}", []).append(record)
                    print(f"{script} / {label} / {workers} workers / seed {seed}: {record}",
                          flush=True)
        everything[script] = rows
    heading = (f"Seeds 0..{args.repeats - 1}, {'short' if args.small else 'full'} forms; "
               "metric: mean ± sd over the seeds of rank 0's own final held-out figure; gaps "
               "are means minus DDP's (same workers) and the plain script's.")
    text = heading + "\n\n" + "\n\n".join(table(s, r) for s, r in everything.items()) + "\n"
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(everything, indent=1) + "\n")


if __name__ == "__main__":
    main()
