"""Run a suite: plan every (setting, variant, repeat), run what is not done yet, report.

The suite folder is the unit of resumption: `suite.json` records the options, each run has
its own directory under `runs/`, and a run counts as done once its `summary.json` says it
finished. A run that failed is recorded (`failed.txt`), the suite goes on, and `--resume`
retries it, as it does a run that was interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hetsync.bench.progress import SuiteProgress
from hetsync.bench.side_by_side import run_side_by_side
from hetsync.bench.suites import Setting, Suite, Variant, eval_every, get_suite
from hetsync.config import RunConfig
from hetsync.data.dealing import ENV_SAMPLER
from hetsync.errors import ConfigError, Deadlock, WorkerFailed
from hetsync.launch.launcher import run as launch
from hetsync.metrics import strict_json
from hetsync.report.plots import slug
from hetsync.simulator.run import SimOptions, simulate
from hetsync.user_files import out_folder
from hetsync.workloads import get_workload

__all__ = ["BenchOptions", "PlannedRun", "plan", "run_suite"]

FAILED_FILE = "failed.txt"
SUITE_FILE = "suite.json"


@dataclass(frozen=True)
class BenchOptions:
    """What `hetsync bench` was asked for; recorded in suite.json and checked on --resume."""

    suite: str = "headline"
    workload: str = "cnn"
    workers: int = 8
    step_time: float = 50.0
    """Emulated compute per iteration (ms), so that protocols, not CPU contention, decide."""
    max_time: float | None = None
    """Seconds per run; None: the suite's."""
    target_loss: float | None = None
    """None: the suite's target for the workload, else the workload's own."""
    repeats: int = 1
    seed: int = 0
    network: str | None = None
    """An emulated network for every run; None: each setting's (most have none)."""
    payload: str | None = None
    """A declared model size for every run; None: each setting's."""
    simulate: bool = False
    """Run every run in the simulator (suites too large for real runs always are)."""
    math: bool = False
    """Simulated runs also do the workers' real numerical updates (svm only)."""
    variants: str | None = None
    """Comma-separated variant labels: run only these (and the reference runs); None: all."""
    cpus_per_worker: int | None = None
    """Cores per worker in a suite that pins its workers (the real suites); None: one. The
    issue that asked for them gave 8 workers 2 cores each of 16; one each leaves the
    launcher 8 of its own."""

    def chosen_suite(self) -> Suite:
        """The suite, restricted to `variants` where given, and a suite whose settings name
        their workloads to the settings of --workload where it is one of them."""
        suite = get_suite(self.suite)
        if self.workload in suite.own_workloads:
            suite = suite.of_workload(self.workload)
        if self.variants is None:
            return suite
        return suite.only(tuple(label.strip() for label in self.variants.split(",")
                                if label.strip()))

    def check(self) -> BenchOptions:
        self.chosen_suite()
        get_workload(self.workload)
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1 (got {self.repeats})")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1 (got {self.workers})")
        if self.math and not (self.simulate or get_suite(self.suite).simulated):
            raise ConfigError("--math applies to simulated runs: add --simulate")
        if self.cpus_per_worker is not None:
            if self.cpus_per_worker < 1:
                raise ConfigError(f"--cpus-per-worker must be >= 1 (got {self.cpus_per_worker})")
            if not get_suite(self.suite).run_options.get("pin"):
                raise ConfigError(f"--cpus-per-worker applies to the suites that pin their "
                                  f"workers (real, real-small), not {self.suite}")
        return self

    def differences(self, other: BenchOptions) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


@dataclass(frozen=True)
class PlannedRun:
    setting: Setting
    variant: Variant
    repeat: int
    config: RunConfig
    not_applicable: str | None = None
    """Why this protocol cannot run in this setting (e.g. too few workers for its groups)."""

    @property
    def run_dir(self) -> Path:
        assert self.config.out is not None
        return Path(self.config.out)

    @property
    def name(self) -> str:
        return f"{self.setting.name} · {self.variant.label} · repeat {self.repeat + 1}"

    @property
    def done(self) -> bool:
        """Whether its summary.json says it finished. A failed run (`failed.txt`) and an
        interrupted one (Ctrl-C, SIGTERM) have a summary too, of what they measured: they are
        not done, so their figures stay out of the medians and `--resume` runs them again."""
        try:
            summary = json.loads((self.run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return False
        reason = summary.get("stop_reason") or ""
        return not ((self.run_dir / FAILED_FILE).is_file() or reason == "interrupted"
                    or reason.startswith("failed"))


def plan(suite: Suite, options: BenchOptions, out: Path, quiet: bool = True) -> list[PlannedRun]:
    """Every run of the suite, its configuration checked before any run starts. A variant
    that cannot run in a setting (Group Division 2 on 4 workers) is kept as not applicable,
    with the reason, so that the other settings still run."""
    runs = []
    for setting in suite.settings:
        for variant in suite.variants_of(setting):
            for repeat in range(options.repeats):
                values = {
                    "workload": setting.workload or options.workload,
                    "workers": setting.workers or options.workers,
                    "step_time": options.step_time if setting.step_time is None
                    else setting.step_time,
                    "slowdown": setting.slowdown,
                    "network": options.network or setting.network,
                    "payload": options.payload or setting.payload,
                    # `is None`, not `or`: a --max-time 0 reaches validate(), which refuses it
                    "max_time": suite.max_time if options.max_time is None
                    else options.max_time,
                    "eval_every": eval_every(setting.workload or options.workload),
                    "target_loss": suite.target_loss.get(setting.workload or options.workload)
                    if options.target_loss is None else options.target_loss,
                    "seed": options.seed + repeat,
                    "out": out / "runs" / slug(setting.name) / slug(variant.label) / f"r{repeat}",
                    "label": variant.label,
                    "quiet": quiet,
                    "overwrite": True,  # the suite folder is the bench's: --resume redoes runs
                    **suite.run_options,
                    **({"epochs": suite.epochs} if suite.epochs is not None else {}),
                    **setting.options,
                    **({"cpus_per_worker": options.cpus_per_worker}
                       if options.cpus_per_worker is not None else {}),
                    **variant.options,
                }
                config = RunConfig(**(_script_values(setting.script, values) if setting.script
                                      else values))
                try:
                    config.validate()
                except ConfigError as error:
                    runs.append(PlannedRun(setting, variant, repeat, config, str(error)))
                else:
                    runs.append(PlannedRun(setting, variant, repeat, config))
    if all(run.not_applicable for run in runs):
        raise ConfigError(f"no run of the suite can start: {runs[0].not_applicable}")
    return runs


#: Where a script setting's path starts: the repository's root (its examples/).
_ROOT = Path(__file__).resolve().parents[3]


def _script_values(script: tuple[str, ...], values: dict[str, Any]) -> dict[str, Any]:
    """A script setting's run options: the script with the run's epochs, seed and a folder of
    its own in the run's; the sampler goes to its workers' environment (`_sampler_of`)."""
    kept = {k: v for k, v in values.items() if k not in ("epochs", "sampler")}
    path, *args = script
    return {**kept, "script": [str(_ROOT / path), *args, "--epochs", str(values["epochs"]),
                               "--seed", str(values["seed"]),
                               "--out", str(values["out"] / "script")]}


@contextlib.contextmanager
def _sampler_of(run: PlannedRun) -> Iterator[None]:
    """A script setting's run with its variant's sampler in `HETSYNC_SAMPLER`, which the
    workers inherit from the launcher (hetsync.data); other runs as they are."""
    sampler = run.variant.options.get("sampler")
    if not run.setting.script or sampler is None:
        yield
        return
    before = os.environ.get(ENV_SAMPLER)
    os.environ[ENV_SAMPLER] = sampler
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENV_SAMPLER]
        else:
            os.environ[ENV_SAMPLER] = before


def _claim_folder(out: Path, options: BenchOptions, resume: bool) -> None:
    """Record the options, or on --resume check that they are the recorded ones."""
    record = out / SUITE_FILE
    if record.is_file():
        if not resume:
            raise ConfigError(f"{out} already holds a suite run: pass --resume to finish it, "
                              "or choose another --out")
        recorded = recorded_options(out)
        assert recorded is not None
        changed = options.differences(recorded)
        if changed:
            raise ConfigError(
                f"--resume: {out} was run with different options ("
                + ", ".join(f"{n}={getattr(recorded, n)!r}" for n in changed)
                + "); resume with those, or choose another --out")
        return
    if resume:
        raise ConfigError(f"--resume: {out} holds no suite run ({SUITE_FILE} missing)")
    with out_folder(out):  # a file, a read-only place: one line
        record.write_text(strict_json.dumps(asdict(options), indent=2) + "\n")


def recorded_options(out: Path) -> BenchOptions | None:
    """The options a suite folder was started with, for --resume without repeating them; a
    damaged record is one line (ConfigError), not a traceback."""
    record = out / SUITE_FILE
    if not record.is_file():
        return None
    try:
        return BenchOptions(**json.loads(record.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as error:  # unreadable, not JSON, unknown keys
        raise ConfigError(f"{record} is not a suite's record ({error}): a damaged file; "
                          "choose another --out") from None


def run_suite(options: BenchOptions, out: Path, resume: bool = False,
              show_run_progress: bool | None = None) -> list[PlannedRun]:
    """Run the suite's runs that are not done yet; return the whole plan.

    Failed runs are recorded and skipped; KeyboardInterrupt stops the suite (finished runs
    stay done, so --resume continues from the interrupted one)."""
    options.check()
    suite = options.chosen_suite()
    if show_run_progress is None:
        show_run_progress = sys.stderr.isatty()
    runs = plan(suite, options, out, quiet=not show_run_progress)
    _claim_folder(out, options, resume)
    for reason in dict.fromkeys(f"{r.setting.name} · {r.variant.label}: {r.not_applicable}"
                                for r in runs if r.not_applicable):
        print(f"not applicable, left out: {reason}")
    todo = in_rounds([(position, run) for position, run in enumerate(runs, 1)
                      if not run.done and not run.not_applicable])
    start = launch
    if options.simulate or suite.simulated:
        sim_options = SimOptions(math=options.math, progress=False)
        start = functools.partial(simulate, options=sim_options)
    progress = SuiteProgress(len(runs))
    progress.skipped(sum(run.done for run in runs))
    for i, (position, run) in enumerate(todo):
        progress.started(position, run.name,
                         [(r.config.workers, r.config.max_time or 0.0) for _, r in todo[i:]])
        (run.run_dir / FAILED_FILE).unlink(missing_ok=True)
        try:
            begin = run_side_by_side if run.setting.side_by_side else start
            with _sampler_of(run):
                outcome = _outcome(begin(run.config).summary)
        except (WorkerFailed, Deadlock) as error:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            (run.run_dir / FAILED_FILE).write_text(f"{error}\n")
            outcome = f"failed: {error}"
        progress.finished(run.config.workers, outcome)
    return runs


def in_rounds(todo: list[tuple[int, PlannedRun]]) -> list[tuple[int, PlannedRun]]:
    """The runs in rounds: each run's first repeat, then each one's second, and so on (in
    plan order within a round). A machine whose speed drifts over the suite's hour then
    slows every variant's repeats alike, instead of all the repeats of whichever variants
    ran in a slow period."""
    return sorted(todo, key=lambda item: item[1].repeat)


def _outcome(summary: dict) -> str:
    if summary.get("side_by_side"):
        return f"{summary['samples_per_s']:.0f} samples/s in all, each worker alone"
    ttt = summary["time_to_target_s"]
    reached = f"target in {ttt:.1f} s" if ttt is not None else "target not reached"
    rate = summary["samples_per_s"]
    outcome = f"{reached}, " + (f"{rate:.0f} samples/s" if rate is not None else
                                f"{summary['iterations_per_s']:.1f} iterations/s")
    reason = summary.get("stop_reason") or ""
    return outcome + (f" ({reason.split(' (')[0]})" if reason.startswith("cut") else "")
