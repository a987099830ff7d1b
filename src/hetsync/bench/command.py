"""Run a suite and write its results: what `hetsync bench` does."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from hetsync.bench.epochs import epoch_table, goal_lines
from hetsync.bench.markdown import headline_lines, setting_table, write_markdown
from hetsync.bench.results import collect, write_results
from hetsync.bench.runner import BenchOptions, PlannedRun, plan, run_suite
from hetsync.user_files import out_folder

__all__ = ["bench", "command_line"]


def command_line(options: BenchOptions, out: Path) -> str:
    """The `hetsync bench` command that regenerates these results."""
    defaults = BenchOptions()
    parts = ["hetsync bench"]
    for f in fields(options):
        value = getattr(options, f.name)
        if value is True:
            parts.append(f"--{f.name}")
        elif value != getattr(defaults, f.name):
            parts.append(f"--{f.name.replace('_', '-')} {value:g}" if isinstance(value, float)
                         else f"--{f.name.replace('_', '-')} {value}")
    parts.append(f"--out {out}")
    return " ".join(parts)


def bench(options: BenchOptions, out: Path, resume: bool = False,
          show_run_progress: bool | None = None) -> Path:
    """Run (or finish) a suite into `out`, write results.json and results.md, print the
    tables; return the path of results.md. Interrupted (Ctrl-C, SIGTERM, a lease's time
    limit), it still writes the results of the runs that finished, then stops."""
    try:
        runs = run_suite(options, out, resume, show_run_progress)
    except KeyboardInterrupt:
        runs = plan(options.chosen_suite(), options, out)
        if any(run.done for run in runs):
            _write(options, runs, out)
        raise
    return _write(options, runs, out)


def _write(options: BenchOptions, runs: list[PlannedRun], out: Path) -> Path:
    suite = options.chosen_suite()
    results = collect(suite, options, runs, out)
    with out_folder(out):  # a full disk: one line
        write_results(results, out)
        report = write_markdown(results, runs, out, command_line(options, out))
    print()
    for setting in results["settings"]:
        if results["epochs"] and setting["reference"]:
            continue
        print(f"{setting['name']} ({setting['workers']} workers, slowdown {setting['slowdown']})")
        print(epoch_table(setting) if results["epochs"] else setting_table(setting))
    lines = goal_lines(results) if results["epochs"] else headline_lines(results)
    print("\n".join(lines).replace("**", ""))
    print(f"\nresults: {out / 'results.json'}\nreport:  {report}")
    return report
