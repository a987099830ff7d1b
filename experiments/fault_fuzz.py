"""Real-process fault fuzz: short `hetsync train` runs with random kills, stops and delayed
messages, under every protocol that goes on without a lost worker (`--on-failure continue`).

What the simulator's fuzz (experiments/fuzz_protocols.py) cannot see lives here: threads,
locks, the lost-worker watcher, the launcher's failure detector and the end-of-run rendezvous.
Each case draws, from its own seed, a protocol variant, 4-6 workers, a short run (40-120
iterations of svm at a few ms each, a slow worker now and then) and its faults:
- one loss at a random time: a kill, or a stop the worker never comes back from (declared lost
  after --hang-timeout), sometimes of a rank the protocol cannot lose (rank 0 of Prague and PS);
- sometimes a short stop (SIGSTOP, resumed well within --hang-timeout) of another worker;
- sometimes `delay-messages` (every worker's messages held back now and then).

A case passes when the run ends as promised, within a generous outer timeout (no hang):
- with an essential rank lost: exit status 1 and a last stderr line naming that rank;
- otherwise: exit status 0, a stop reason that is the run's own (iterations, time, target),
  and no worker declared lost that was not killed or stopped for good;
and in both cases a summary.json that is strict JSON (no NaN), that `hetsync report` accepts,
and no process of the run left (scanned in /proc by the run's folder in HETSYNC_RUN_DIR).

With `--rejoin`, the cases are All-Reduce's under `--on-failure rejoin`: the same draws of
workers, lengths and faults, plus a second kill of the same rank now and then (a worker that
fails again) and `--max-restarts` 0-3. Such a case passes when it exits 0 at its own stop, every
restart's worker came back (or was lost again before), no rank was restarted more than
--max-restarts times, and the members' final models are identical (consensus distance 0: a
rejoined worker took the others' model, not a fresh one).

Prints each failing case's seed and exact command; writes results.json and results.md
(counts by variant and outcome, each failure classified) under --out after every case, so an
interrupted fuzz keeps what it measured. About 15 s a case on 2 idle cores, a minute when
they are shared.

    python experiments/fault_fuzz.py [--cases 100] [--seed 0] [--out runs/fault-fuzz]
    python experiments/fault_fuzz.py --seed 0 --case 17      # replay one case
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetsync.cli import train_flags
from hetsync.config import RunConfig
from hetsync.protocols.catalog import all_variants, essential_ranks
from hetsync.protocols.variant import NamedVariant
from hetsync.report import write_report

HETSYNC = [sys.executable, "-m", "hetsync.cli"]
HANG_TIMEOUT = 4.0
"""--hang-timeout of every case: a short stop lasts well under it, a loss is known after it."""
OUTER_TIMEOUT = 300.0
"""Seconds a case may take before it counts as hung: a normal one takes 15 s on 2 idle cores
and up to 2 minutes where a dozen other processes share them."""
#: The labels in the order the fuzz drew from before the variants moved into their packages
#: (issue 23): a case draws its variant by position, so earlier seeds replay only in this
#: order. Variants marked `fault_fuzz` since then follow, in the catalog's order.
REPLAY_ORDER = ("hop", "hop-backup1", "hop-backup1-skip", "prague", "prague-no-overlap",
                "prague-buffer", "adpsgd", "ps-sync", "ps-async", "ps-sync-backup1")
#: The variants fuzzed: each protocol package's own, marked `fault_fuzz` in its variants.py.
VARIANTS: dict[str, NamedVariant] = {variant.label: variant for variant in sorted(
    (variant for variant in all_variants() if variant.fault_fuzz),
    key=lambda v: REPLAY_ORDER.index(v.label) if v.label in REPLAY_ORDER else len(REPLAY_ORDER))}
OK = ("ok", "ok-failed-as-expected")


@dataclass
class Case:
    """One drawn run: replayed exactly from (seed, index)."""

    seed: int
    index: int
    variant: str
    workers: int
    iterations: int
    step_ms: float
    slowdown: str
    faults: list[str]
    lost_expected: list[int]
    """Ranks killed or stopped for good (may be declared lost)."""
    essential_lost: int | None
    """An essential rank the faults take away: the run must fail naming it."""
    loss_at_s: float
    max_restarts: int | None = None
    """`--on-failure rejoin`'s cases: their --max-restarts (None: a `continue` case)."""

    def args(self, out: Path) -> list[str]:
        options = (VARIANTS[self.variant].run_options if self.max_restarts is None else {})
        failure = (["--on-failure", "continue"] if self.max_restarts is None else
                   ["--protocol", self.variant, "--on-failure", "rejoin",
                    "--max-restarts", str(self.max_restarts)])
        args = ["train", *train_flags(options), "--workload", "svm",
                "--workers", str(self.workers), "--step-time", f"{self.step_ms:g}",
                "--max-iterations", str(self.iterations), "--max-time", "60",
                *failure, "--hang-timeout", f"{HANG_TIMEOUT:g}",
                "--seed", str(self.seed * 100_000 + self.index), "--quiet", "--overwrite",
                "--out", str(out)]
        if self.slowdown != "none":
            args += ["--slowdown", self.slowdown]
        if self.faults:
            args += ["--fault", ";".join(self.faults)]
        return args


def cannot_lose(variant: str, workers: int) -> frozenset[int]:
    """The ranks `variant` cannot lose on `workers` workers (its package's `tolerate_loss`)."""
    return essential_ranks(RunConfig(**{**VARIANTS[variant].run_options, "workers": workers,
                                        "on_failure": "continue"}))


def draw(seed: int, index: int, variants: list[str]) -> Case:
    """Case `index` of the fuzz seeded `seed` (its own generator: cases replay one by one)."""
    rng = random.Random(f"fault-fuzz/{seed}/{index}")
    variant = rng.choice(variants)
    protocol = VARIANTS[variant].protocol
    workers = rng.choice((4, 4, 4, 5, 6))
    if protocol == "adpsgd" and workers % 2:  # its ring must be bipartite (no extra draw:
        workers += 1                          # every other case replays as before)
    iterations = rng.randrange(40, 121)
    step_ms = rng.choice((5.0, 10.0, 20.0))
    slowdown = "none"
    if rng.random() < 0.3:
        slowdown = f"deterministic:ranks={rng.randrange(workers)},factor={rng.choice((2, 3))}"
    essential = cannot_lose(variant, workers)
    at = round(rng.uniform(0.2, 2.5), 2)
    if essential and rng.random() < 0.15:
        victim = rng.choice(sorted(essential))
    else:
        victim = rng.choice([r for r in range(workers) if r not in essential])
    kind = rng.choice(("kill", "kill", "stop"))
    faults = [f"{kind}:rank={victim},at={at:g}s"]
    if rng.random() < 0.4:  # a short stop of another worker: it must not be declared lost
        other = rng.choice([r for r in range(workers) if r != victim])
        faults.append(f"stop:rank={other},at={rng.uniform(0.2, 2.5):.2f}s,"
                      f"for={rng.uniform(0.2, 1.5):.2f}s")
    if rng.random() < 0.5:
        faults.append(f"delay-messages:p={rng.choice((0.02, 0.1, 0.3))},"
                      f"ms={rng.choice((5, 20, 100))}")
    return Case(seed, index, variant, workers, iterations, step_ms, slowdown, faults,
                [victim], victim if victim in essential else None, at)


REJOIN_VARIANT = "allreduce"


def draw_rejoin(seed: int, index: int) -> Case:
    """Case `index` of a `--rejoin` fuzz: a kill or a stop for good of any rank, now and then
    a second kill of it (a worker that fails again), a short stop of another, delays."""
    rng = random.Random(f"fault-fuzz-rejoin/{seed}/{index}")
    workers = rng.choice((3, 4, 4, 5))
    iterations = rng.randrange(80, 201)
    step_ms = rng.choice((10.0, 20.0))
    victim = rng.randrange(workers)
    at = round(rng.uniform(0.3, 2.5), 2)
    kind = rng.choice(("kill", "kill", "stop"))
    faults = [f"{kind}:rank={victim},at={at:g}s"]
    if rng.random() < 0.3:  # killed again: once it is back, or while it restarts
        faults.append(f"kill:rank={victim},at={at + rng.uniform(1.0, 8.0):.2f}s")
    if rng.random() < 0.3:
        other = rng.choice([r for r in range(workers) if r != victim])
        faults.append(f"stop:rank={other},at={rng.uniform(0.2, 2.5):.2f}s,"
                      f"for={rng.uniform(0.2, 1.5):.2f}s")
    if rng.random() < 0.3:
        faults.append(f"delay-messages:p={rng.choice((0.02, 0.1))},ms={rng.choice((5, 20))}")
    return Case(seed, index, REJOIN_VARIANT, workers, iterations, step_ms, "none", faults,
                [victim], None, at, max_restarts=rng.choice((0, 1, 3, 3)))


@dataclass
class Outcome:
    case: Case
    command: str
    outcome: str
    problems: list[str] = field(default_factory=list)
    exit: int | None = None
    seconds: float = 0.0
    stop_reason: str | None = None
    lost: list[int] = field(default_factory=list)
    last_line: str = ""
    log_tail: str = ""
    known: str | None = None


def _strict_json(path: Path) -> dict[str, Any] | str:
    """The file's object, or why it is not strict JSON (NaN and Infinity are not JSON)."""
    def refuse(name: str) -> float:
        raise ValueError(f"{name} is not JSON")
    try:
        return json.loads(path.read_text(), parse_constant=refuse)
    except FileNotFoundError:
        return "no summary.json"
    except ValueError as error:
        return f"summary.json is not strict JSON: {error}"


def leftovers(run_dir: Path) -> list[int]:
    """Pids of processes whose environment names this run's folder (its workers)."""
    marker = f"HETSYNC_RUN_DIR={run_dir}".encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes() + b"\0":
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _log_tail(run_dir: Path) -> str:
    """The last line of each worker's log, for classifying a failure."""
    tails = []
    for log in sorted((run_dir / "logs").glob("rank*.log")) + sorted(
            (run_dir / "logs").glob("rank*.out")):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            tails.append(f"{log.name}: {lines[-1][:200]}")
    return " | ".join(tails)


def known_defect(result: Outcome) -> str | None:
    """Which defect of issue 20 a failure looks like (the lead reruns these after the fixes)."""
    text = f"{result.last_line} {' '.join(result.problems)} {result.log_tail}"
    variant = VARIANTS.get(result.case.variant)
    protocol = variant.protocol if variant is not None else result.case.variant
    if "receiver thread failed" in text and "Connection closed by peer" in text:
        return "a receiver thread took a lost peer's closed connection for an error"
    if "at the end of the run" in text:
        return "end barrier (issue 20 item 2)"
    if protocol == "ps" and (result.outcome in ("hang", "failed")
                             or "deadlock" in text or "hung" in text):
        return "PS self-deadlock on a loss (item 1)?"
    if protocol == "adpsgd" and result.outcome in ("lost-healthy", "failed", "wrong-rank"):
        return "AD-PSGD healthy worker declared lost (item 4)?"
    return None


def run_case(case: Case, out: Path) -> Outcome:
    run_dir = (out / "runs" / f"{case.seed}-{case.index}-{case.variant}").resolve()
    args = case.args(run_dir)
    command = "hetsync " + shlex.join(args)
    started = time.monotonic()
    proc = subprocess.Popen([*HETSYNC, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=OUTER_TIMEOUT)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
        proc.terminate()  # as a scheduler would: the launcher writes an `interrupted` summary
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher's session: this case's only
            _, err = proc.communicate()
    seconds = round(time.monotonic() - started, 1)
    lines = [line for line in err.splitlines() if line.strip()]
    result = Outcome(case, command, "ok", exit=proc.returncode, seconds=seconds,
                     last_line=lines[-1][:300] if lines else "")
    problems = result.problems
    if hung:
        problems.append(f"hang: no end within {OUTER_TIMEOUT:g} s")
    deadline = time.monotonic() + 5.0  # workers die with the launcher: give them a moment
    while (left := leftovers(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        problems.append(f"orphan: {len(left)} process(es) of the run left (pids {left})")
        _kill(left)
    summary = _strict_json(run_dir / "summary.json")
    if isinstance(summary, str):
        problems.append(f"summary: {summary}")
        summary = {}
    else:
        try:  # what `hetsync report` runs, here without its 10 s of imports per case
            write_report([run_dir], run_dir / "report")
        except Exception as error:  # noqa: BLE001 - any refusal is the finding
            problems.append(f"report refused the run: {type(error).__name__}: {error}"[:300])
    result.stop_reason = summary.get("stop_reason")
    result.lost = sorted(lost["rank"] for lost in summary.get("lost_workers", []))
    if not hung:
        _judge(case, result, summary)
    if problems:
        result.outcome = problems[0].split(":")[0]
        result.log_tail = _log_tail(run_dir)
        result.known = known_defect(result)
    elif case.essential_lost is not None and proc.returncode == 1:
        result.outcome = "ok-failed-as-expected"
    return result


def _judge(case: Case, result: Outcome, summary: dict[str, Any]) -> None:
    """The run's end against what its faults promise."""
    problems = result.problems
    if case.max_restarts is not None:
        _judge_rejoin(case, result, summary)
        return
    if case.essential_lost is not None:
        rank = case.essential_lost
        if result.exit == 1:
            if f"worker rank {rank} " not in result.last_line:
                problems.append(f"wrong-rank: rank {rank} was lost, the last line says "
                                f"{result.last_line!r}")
            return
        ran = summary.get("wall_time_s") or 0.0
        if result.exit == 0 and ran > case.loss_at_s + 1.0:
            problems.append(f"unnoticed: essential rank {rank} lost at {case.loss_at_s} s, "
                            f"the run went on to {ran:.1f} s and exited 0")
        elif result.exit != 0:
            problems.append(f"failed: exit status {result.exit}")
        return
    if result.exit != 0:
        problems.append(f"failed: exit status {result.exit} (expected the survivors to "
                        "finish)")
        return
    reason = result.stop_reason or ""
    if reason.startswith(("failed", "interrupted", "diverged")) or not reason:
        problems.append(f"bad-stop: exit 0 with stop_reason {reason!r}")
    healthy_lost = [r for r in result.lost if r not in case.lost_expected]
    if healthy_lost:
        problems.append(f"lost-healthy: ranks {healthy_lost} declared lost, only "
                        f"{case.lost_expected} were killed or stopped for good")


def _judge_rejoin(case: Case, result: Outcome, summary: dict[str, Any]) -> None:
    """A `--rejoin` case's end: see the module doc."""
    problems = result.problems
    if result.exit != 0:
        problems.append(f"failed: exit status {result.exit} (expected the run to finish)")
        return
    reason = result.stop_reason or ""
    if reason.startswith(("failed", "interrupted", "diverged")) or not reason:
        problems.append(f"bad-stop: exit 0 with stop_reason {reason!r}")
    records = summary.get("rejoined", [])
    restarted = Counter(r["rank"] for r in records)
    if any(rank not in case.lost_expected for rank in restarted):
        problems.append(f"lost-healthy: ranks {sorted(restarted)} restarted, only "
                        f"{case.lost_expected} were killed or stopped")
    assert case.max_restarts is not None
    if any(n > case.max_restarts for n in restarted.values()):
        problems.append(f"restarts: {dict(restarted)} beyond --max-restarts {case.max_restarts}")
    last = {r["rank"]: r for r in records}
    stuck = [r for r in records if r["back_at_s"] is None and r is not last[r["rank"]]]
    if stuck or any(r["back_at_s"] is None and r["lost_at_s"] is not None
                    and (summary.get("wall_time_s") or 0) > r["lost_at_s"] + 30 for r in records):
        problems.append(f"not-back: restarts that never trained again: {records}")
    distance = summary.get("final_consensus_distance")
    if distance not in (0, 0.0, None):
        problems.append(f"apart: the members' final models are {distance} apart (expected 0)")


def _table(results: list[Outcome], command: str) -> str:
    outcomes = sorted({r.outcome for r in results}, key=lambda o: (o not in OK, o))
    order = [*VARIANTS, REJOIN_VARIANT]
    variants = sorted({r.case.variant for r in results}, key=order.index)
    counts = Counter((r.case.variant, r.outcome) for r in results)
    lines = [f"`{command}`", "", "| variant | cases | " + " | ".join(outcomes) + " |",
             "| --- " * (len(outcomes) + 2) + "|"]
    for variant in [*variants, "all"]:
        row = [r for r in results if variant in ("all", r.case.variant)]
        cells = [str(sum(counts[(v, o)] for v in variants if variant in ("all", v)) or "-")
                 for o in outcomes]
        lines.append(f"| {variant} | {len(row)} | " + " | ".join(cells) + " |")
    failures = [r for r in results if r.outcome not in OK]
    if failures:
        lines += ["", "| case | variant | outcome | faults | problems | known? | last line |",
                  "| --- " * 7 + "|"]
        for r in failures:
            lines.append(f"| {r.case.index} | {r.case.variant} | {r.outcome} | "
                         f"`{';'.join(r.case.faults)}` | {'; '.join(r.problems)} | "
                         f"{r.known or '-'} | {r.last_line} |")
    return "\n".join(lines) + "\n"


def fuzz(seed: int, indices: list[int], variants: list[str], out: Path,
         budget_s: float | None = None, command: str = "", rejoin: bool = False
         ) -> list[Outcome]:
    """Run the cases in turn, writing the results after each; stop starting new ones once
    `budget_s` seconds have passed. `rejoin`: `--on-failure rejoin` cases (`draw_rejoin`)."""
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    results: list[Outcome] = []
    for index in indices:
        if budget_s is not None and time.monotonic() - began > budget_s:
            print(f"budget of {budget_s:g} s spent: {len(results)} cases run", flush=True)
            break
        case = draw_rejoin(seed, index) if rejoin else draw(seed, index, variants)
        result = run_case(case, out)
        results.append(result)
        print(f"case {index} {result.case.variant} w{result.case.workers} "
              f"[{';'.join(result.case.faults)}] -> {result.outcome} ({result.seconds} s, "
              f"lost {result.lost}, {result.stop_reason})", flush=True)
        if result.outcome not in OK:
            print(f"    FAILED seed {seed} case {index}: {'; '.join(result.problems)}\n"
                  f"    replay: python experiments/fault_fuzz.py --seed {seed} --case {index}"
                  f"\n    command: {result.command}\n    last line: {result.last_line}"
                  + (f"\n    looks like: {result.known}" if result.known else ""), flush=True)
        (out / "results.json").write_text(json.dumps(
            {"command": command, "seed": seed,
             "counts": Counter(r.outcome for r in results),
             "by_variant": {v: Counter(r.outcome for r in results if r.case.variant == v)
                            for v in variants},
             "cases": [{**asdict(r), "case": asdict(r.case)} for r in results]},
            indent=2, allow_nan=False) + "\n")
        (out / "results.md").write_text("# Real-process fault fuzz\n\n"
                                        + _table(results, command))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="index of the first case")
    parser.add_argument("--case", type=int, help="run only this case (a replay)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--rejoin", action="store_true",
                        help="All-Reduce under --on-failure rejoin: kills followed by a return")
    parser.add_argument("--budget", type=float, help="start no case after this many seconds")
    parser.add_argument("--out", type=Path, default=Path("runs/fault-fuzz"))
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    indices = [args.case] if args.case is not None else list(
        range(args.first, args.first + args.cases))
    command = "python " + shlex.join(["experiments/fault_fuzz.py", *sys.argv[1:]])
    print(f"seed {args.seed}: {command}", flush=True)
    results = fuzz(args.seed, indices, variants, args.out, args.budget, command, args.rejoin)
    print(_table(results, command))
    print(f"results: {args.out / 'results.md'}")
    sys.exit(0 if all(r.outcome in OK for r in results) else 1)


if __name__ == "__main__":
    main()
