"""Benchmark: user scripts (a GRU language model, a BatchNorm MLP) under every protocol vs DDP.

Each script runs through `hetsync launch` under each protocol with the same workers, epochs and
seed, and reports the held-out loss and accuracy of the model hetsync returns
(`optimizer.consensus_model()`, the average of the workers' models), with the gap to DDP.
Quality, not speed: no slowdown is injected and the wall times are only indicative. Not part of
the tests: 20 runs at the defaults, each mostly the 4 workers' start-up, 0.5 to 2 minutes
on 2 cores depending on how busy they are (about 35 minutes in all when measured on a shared
machine); `--resume` reuses finished runs.

    python experiments/user_scripts.py [--repeats 2] [--only gru] [--out runs/user-scripts]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = {
    "gru": (EXAMPLES / "gru_language_model.py", ["--epochs", "3"]),
    "batchnorm": (EXAMPLES / "batchnorm_mlp.py", ["--epochs", "15"]),
}
PROTOCOLS = {
    "ddp": ["--protocol", "ddp"],
    "allreduce": ["--protocol", "allreduce"],
    "ps sync": ["--protocol", "ps", "--ps-mode", "sync"],
    "ps async": ["--protocol", "ps", "--ps-mode", "async"],
    "dpsgd": ["--protocol", "dpsgd"],
    "adpsgd": ["--protocol", "adpsgd"],
    "hop": ["--protocol", "hop"],
    "hop backup 1 + skip": ["--protocol", "hop", "--backup", "1", "--skip"],
    "prague": ["--protocol", "prague"],
    "prague static": ["--protocol", "prague", "--schedule", "static"],
}


def launch(script: str, label: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run; its held-out figures, iterations and wall time, or the reason it failed."""
    path, script_args = SCRIPTS[script]
    run_dir = args.out / script / f"{label.replace(' ', '-')}-seed{seed}"
    result_file = run_dir / "user_result.json"
    if not (args.resume and result_file.is_file()):
        result_file.unlink(missing_ok=True)
        command = [
            str(Path(sys.executable).parent / "hetsync"), "launch", "--quiet",
            "--out", str(run_dir), "--workers", str(args.workers), "--seed", str(seed),
            "--max-time", "900",
            *PROTOCOLS[label], str(path), *script_args, "--seed", str(seed),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not result_file.is_file():
            lines = (done.stderr or done.stdout).strip().splitlines()
            return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    result = json.loads(result_file.read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "val_loss": result["val_loss"],
        "val_accuracy": result["val_accuracy"],
        "summary_final_loss": summary.get("final_loss"),  # the launcher's view, to cross-check
        "iterations": statistics.mean(summary["iterations"]),
        "wall_time_s": summary["wall_time_s"],
    }


def _mean_sd(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(script: str, runs: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: mean (± standard deviation over seeds) and the gap of the means to DDP."""
    base = [r for r in runs.get("ddp", []) if "error" not in r]
    rows = [
        f"**{script}** ({SCRIPTS[script][0].name} {' '.join(SCRIPTS[script][1])})", "",
        "| protocol | val loss | val accuracy | iterations | wall (s) | loss - DDP | acc - DDP |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, results in runs.items():
        ok = [r for r in results if "error" not in r]
        if not ok:
            rows.append(f"| {label} | failed: {results[0]['error']} | | | | | |")
            continue
        loss, acc = [r["val_loss"] for r in ok], [r["val_accuracy"] for r in ok]
        gaps = ["-", "-"]
        if base and label != "ddp":
            gaps = [f"{statistics.mean(mine) - statistics.mean(r[key] for r in base):+.3f}"
                    for mine, key in ((loss, "val_loss"), (acc, "val_accuracy"))]
        failed = f" ({len(results) - len(ok)} failed)" if len(ok) < len(results) else ""
        rows.append(
            f"| {label}{failed} | {_mean_sd(loss, 3)} | {_mean_sd(acc, 3)} "
            f"| {statistics.mean(r['iterations'] for r in ok):.0f} "
            f"| {statistics.mean(r['wall_time_s'] for r in ok):.1f} | {gaps[0]} | {gaps[1]} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="even: AD-PSGD's bipartite ring")
    parser.add_argument("--repeats", type=int, default=1, help="seeds 0..N-1, to show noise")
    parser.add_argument("--only", choices=sorted(SCRIPTS), action="append",
                        help="run only this script (repeatable)")
    parser.add_argument("--protocols", nargs="+", choices=list(PROTOCOLS), default=list(PROTOCOLS))
    parser.add_argument("--resume", action="store_true", help="reuse runs that have a result")
    parser.add_argument("--out", type=Path, default=Path("runs/user-scripts"))
    args = parser.parse_args()

    everything: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for script in args.only or list(SCRIPTS):
        runs: dict[str, list[dict[str, Any]]] = {}
        for label in args.protocols:
            for seed in range(args.repeats):
                result = launch(script, label, seed, args)
                runs.setdefault(label, []).append(result)
                print(f"{script} / {label} / seed {seed}: {result}", flush=True)
        everything[script] = runs
    report = "\n\n".join(table(script, runs) for script, runs in everything.items())
    heading = (f"{args.workers} workers, seeds 0..{args.repeats - 1}; held-out figures of the "
               "model hetsync returns; gaps are means minus DDP's means.")
    text = f"{heading}\n\n{report}\n"
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(everything, indent=1) + "\n")


if __name__ == "__main__":
    main()
