"""Issue 14's fault table, run again: what a user gets from failures, bad input and lost workers.

Sections (`--only NAME` runs some of them):
- `failed`: each protocol with one worker killed, raising, hanging or stopped: is the right
  rank named, is there a summary, does `hetsync report` accept the run?
- `stop-each`: Hop and the parameter server with each rank stopped in turn: named right?
- `signals`: SIGTERM and Ctrl-C (SIGINT) to the launcher: a summary saying `interrupted`?
- `overwrite`: a second run into a finished run's --out, and one into a running run's --out.
- `bad-input`: the bad inputs of docs/failures.md through the CLI: exit status 2, one line?
- `continue`: Hop (backup 1), Prague, AD-PSGD and async PS under `--on-failure continue`, with
  and without one worker killed mid-run: do they reach the target, how much later?
- `resume`: a run that checkpoints, loses a worker (and stops), then `--resume`s.

Writes results.json and results.md under --out. About 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hetsync.config import RunConfig
from hetsync.errors import WorkerFailed
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl

HETSYNC = [sys.executable, "-m", "hetsync.cli"]
BASE: dict[str, Any] = {"workload": "svm", "workers": 4, "step_time": 10.0, "max_time": 60.0,
                        "hang_timeout": 3.0, "stop_at_target": False, "quiet": True,
                        "overwrite": True}
FAULTS = {"kill": "kill:rank=2,at=2s", "raise": "raise:rank=2,at=30",
          "hang": "hang:rank=2,at=30", "stop": "stop:rank=2,at=2s"}
PROTOCOLS = ("allreduce", "dpsgd", "adpsgd", "hop", "ps", "prague")


def _report_ok(run_dir: Path) -> bool:
    done = subprocess.run([*HETSYNC, "report", str(run_dir), "--out", str(run_dir / "report")],
                          capture_output=True, text=True)
    return done.returncode == 0


def _failed_run(out: Path, **options: Any) -> dict[str, Any]:
    """Run expecting a failure: what was blamed, how fast, and what it left."""
    started = time.monotonic()
    try:
        run(RunConfig(**{**BASE, **options, "out": out}))
        blamed, message = None, "(did not fail)"
    except WorkerFailed as failure:
        blamed, message = failure.rank, str(failure).splitlines()[0]
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return {"blamed": blamed, "message": message, "seconds": round(time.monotonic() - started, 1),
            "summary": summary_file.is_file(), "stop_reason": summary.get("stop_reason"),
            "report": _report_ok(out)}


def failed(out: Path) -> list[dict[str, Any]]:
    rows = []
    for protocol in PROTOCOLS:
        for kind, fault in FAULTS.items():
            row = _failed_run(out / f"{protocol}-{kind}", protocol=protocol, fault=fault)
            rows.append({"protocol": protocol, "fault": fault, "expected": 2, **row})
            print(rows[-1], flush=True)
    return rows


def stop_each(out: Path) -> list[dict[str, Any]]:
    rows = []
    for protocol in ("hop", "ps"):
        for rank in range(BASE["workers"]):
            row = _failed_run(out / f"{protocol}-stop{rank}", protocol=protocol,
                              fault=f"stop:rank={rank},at=2s")
            rows.append({"protocol": protocol, "fault": f"stop rank {rank}", "expected": rank,
                         **row})
            print(rows[-1], flush=True)
    return rows


def signals(out: Path) -> list[dict[str, Any]]:
    rows = []
    for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGINT", signal.SIGINT)):
        run_dir = out / name
        proc = subprocess.Popen([*HETSYNC, "train", "--protocol", "hop", "--workload", "svm",
                                 "--workers", "4", "--step-time", "10", "--max-time", "60",
                                 "--quiet", "--overwrite", "--out", str(run_dir)],
                                stderr=subprocess.PIPE, text=True)
        time.sleep(12)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append({"signal": name, "exit": proc.returncode,
                     "stop_reason": summary["stop_reason"], "report": _report_ok(run_dir),
                     "last_line": err.strip().splitlines()[-1]})
        print(rows[-1], flush=True)
    return rows


def _cli(*args: str) -> tuple[int, list[str]]:
    done = subprocess.run([*HETSYNC, *args], capture_output=True, text=True)
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def overwrite(out: Path) -> list[dict[str, Any]]:
    train = ["train", "--workload", "svm", "--workers", "2", "--max-iterations", "20",
             "--quiet", "--out", str(out / "taken")]
    _cli(*train, "--overwrite")
    code, lines = _cli(*train)
    rows = [{"case": "--out holds a finished run", "exit": code, "lines": lines}]
    proc = subprocess.Popen([*HETSYNC, *train[:-1], str(out / "busy"), "--max-iterations",
                             "100000", "--max-time", "30", "--overwrite"],
                            stderr=subprocess.DEVNULL)
    time.sleep(5)
    code, lines = _cli(*train[:-1], str(out / "busy"), "--overwrite")
    proc.terminate()
    proc.wait()
    rows.append({"case": "--out of a run in progress", "exit": code, "lines": lines})
    for row in rows:
        print(row, flush=True)
    return rows


def bad_input(out: Path) -> list[dict[str, Any]]:
    binary = out / "binary.bin"
    binary.write_bytes(bytes(range(256)))
    wrong_type = out / "wrong.toml"
    wrong_type.write_text('workers = "four"\n')
    afile = out / "afile"
    afile.write_text("")
    cases = [["--lr", "nan"], ["--target-loss", "nan"], ["--momentum", "5"],
             ["--workers", "1000"],
             ["--protocol", "prague", "--schedule", "static", "--workers-per-node", "3"],
             ["--protocol", "dpsgd", "--topology", f"edges:{binary}"],
             ["--slowdown", f"trace:{binary}"], ["--config", str(binary)],
             ["--config", str(wrong_type)], ["--network", "bandwidth=10Gbps"],
             ["--payload", "resnet51", "--network", "bandwidth=10gbit"],
             ["--payload", "10MB"], ["--backend", "nccl"],
             ["--out", str(afile / "run")], ["--out", "/proc/hetsync-run"],
             ["--on-failure", "continue"],
             ["--on-failure", "continue", "--protocol", "prague", "--schedule", "static"],
             ["--on-failure", "continue", "--protocol", "hop", "--topology", "directed-ring"],
             ["--fault", "delay-messages:p=2,ms=5"], ["--fault", "kill:rank=9,at=1s"]]
    rows = []
    for args in cases:
        workers = [] if "--config" in args else ["--workers", "4"]  # the file's must count
        code, lines = _cli("train", "--workload", "svm", *workers, *args)
        rows.append({"input": " ".join(args).replace(str(out), "DIR"), "exit": code,
                     "lines": len(lines), "message": lines[-1] if lines else ""})
        print(rows[-1], flush=True)
    return rows


def cont(out: Path, workers: int) -> list[dict[str, Any]]:
    variants = {"hop": {"protocol": "hop", "backup": 1, "skip": False},
                "prague": {"protocol": "prague"}, "adpsgd": {"protocol": "adpsgd"},
                "ps-async": {"protocol": "ps", "ps_mode": "async"}}
    rows = []
    for label, options in variants.items():
        for fault in ("none", "kill:rank=3,at=2s"):
            name = f"{label}-{'killed' if fault != 'none' else 'intact'}"
            summary = run(RunConfig(**{**BASE, **options, "workers": workers, "fault": fault,
                                       "on_failure": "continue", "stop_at_target": True,
                                       "out": out / name, "max_time": 90.0})).summary
            rows.append({"variant": label, "fault": fault,
                         "time_to_target_s": summary["time_to_target_s"],
                         "stop_reason": summary["stop_reason"],
                         "lost": [lost["rank"] for lost in summary["lost_workers"]],
                         "lost_at_s": [lost["at_s"] for lost in summary["lost_workers"]]})
            print(rows[-1], flush=True)
    return rows


def resume(out: Path) -> list[dict[str, Any]]:
    run_dir = out / "resumed"
    config = {**BASE, "protocol": "hop", "max_time": 16.0, "checkpoint_every": 2.0,
              "out": run_dir}
    first = "(did not fail)"
    try:
        run(RunConfig(**config, fault="kill:rank=1,at=7s"))
    except WorkerFailed as failure:
        first = str(failure).splitlines()[0]
    before = read_jsonl(run_dir / "eval.jsonl")
    summary = run(RunConfig(**config), resume=True).summary
    after = [row for row in read_jsonl(run_dir / "eval.jsonl") if row not in before]
    consensus = [row for row in before if row["model"] == "consensus"]
    resumed = [row for row in after if row["model"] == "consensus"]
    row = {"failure": first, "resumed_from_s": summary["resumed_from"][-1]["at_s"],
           "stop_reason": summary["stop_reason"],
           "last_loss_before": consensus[-1]["loss"] if consensus else None,
           "first_loss_after": resumed[0]["loss"] if resumed else None,
           "first_t_after": resumed[0]["t"] if resumed else None,
           "final_loss": summary["final_loss"], "report": _report_ok(run_dir)}
    print(row, flush=True)
    return [row]


SECTIONS = ("failed", "stop-each", "signals", "overwrite", "bad-input", "continue", "resume")


def _markdown(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for section, rows in results.items():
        if not rows:
            continue
        keys = list(rows[0])
        lines += [f"## {section}", "", "| " + " | ".join(keys) + " |",
                  "| " + " | ".join("---" for _ in keys) + " |"]
        for row in rows:
            cells = [str(row[k]).replace("|", "\\|") for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/fault-table"))
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--workers", type=int, default=8, help="workers of `continue`")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    runs = {"failed": failed, "stop-each": stop_each, "signals": signals,
            "overwrite": overwrite, "bad-input": bad_input, "resume": resume,
            "continue": lambda out: cont(out, args.workers)}
    for section in args.only:
        folder = args.out / section
        folder.mkdir(exist_ok=True)
        results[section] = runs[section](folder)
        results_file.write_text(json.dumps(results, indent=1))
    (args.out / "results.md").write_text(_markdown(
        {s: results[s] for s in SECTIONS if s in results}))
    print(_markdown(results))


if __name__ == "__main__":
    main()
