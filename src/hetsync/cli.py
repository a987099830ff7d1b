"""The `hetsync` command: train, launch, report, bench.

Every option is checked before any process is spawned; a wrong one is reported in one line
naming the problem (exit status 2). A failed run names the failed worker (exit status 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hetsync.config import RunConfig, load_toml, option_fields
from hetsync.errors import ConfigError, Deadlock, OutputFailed, WorkerFailed
from hetsync.protocols.catalog import REJOIN, TOLERATE_LOSS
from hetsync.protocols.option_field import spec_of

__all__ = ["main", "train_flags"]

#: What each run option means: the help of its flag, and its row in docs/configuration.md (a
#: protocol's options say it themselves: `hetsync.protocols.option_field.option`).
_RUN_HELP = {
    "protocol": "synchronisation protocol (see `hetsync protocols`)",
    "workload": "built-in workload: cnn, svm, resnet, resnet-wide, mlp-wide or digits",
    "workers": "number of worker processes",
    "step_time": "emulated compute time per iteration, ms (0: real compute only)",
    "slowdown": "none | deterministic:ranks=3+5,factor=4 | random:p=0.1,factor=4 | trace:FILE "
    "(emulated: sleeps) | cpu:ranks=1,share=0.25 (real: the kernel caps those workers at that "
    "share of one core, a cgroup; needs root)",
    "pin": "give each worker cores of its own (CPU affinity); the launcher takes the cores "
    "left over, or shares the last worker's. Where cores are SMT siblings (hyperthreads of one "
    "physical core), workers of fewer cores than a physical core's threads each get a "
    "different physical core first, and workers of more get whole physical cores",
    "cpus_per_worker": "with --pin: cores per worker",
    "keep_awake": "with --pin: a busy loop at the lowest priority (SCHED_IDLE) on each "
    "worker's cores, so that a core whose worker waits for a message does not idle (an idle "
    "core computed the next step up to 1.4x slower here; costs power, not speed)",
    "max_time": "stop after this many seconds",
    "max_iterations": "stop after this many iterations",
    "epochs": "train: stop after this many epochs of the training data",
    "sampler": "train: static (each worker a fixed shard of the data) or dynamic (each epoch "
    "dealt out as the workers ask, so a faster worker takes more of it, under the protocols "
    "whose workers stop alone; see docs/protocols.md, Epochs)",
    "target_loss": "target for the consensus test loss: time to target is measured to it",
    "stop_at_target": "stop every worker once the target loss is reached. Without it, a "
    "pinned run evaluates nothing until its workers are done (nothing in the run depends on "
    "it, and a launcher evaluating beside pinned workers takes a core next to theirs), if the "
    "snapshots it keeps until then fit in a quarter of the free disk; the time to target is "
    "still found from the snapshots",
    "seed": "seed for the model, shards and random slowdowns",
    "batch_size": "minibatch size per worker",
    "lr": "learning rate",
    "momentum": "SGD momentum",
    "out": "run directory",
    "data_dir": "folder with the dataset's IDX files",
    "label": "name of the run in plots and tables",
    "eval_every": "seconds between evaluated model snapshots",
    "eval_samples": "held-out samples used to evaluate each worker's own model",
    "eval_bn": "BatchNorm statistics of an evaluated average of models (the consensus): "
    "recompute (from 1024 training samples, as torch.optim.swa_utils.update_bn; an average's "
    "own are not the average of the workers') or saved (the workers' averaged)",
    "hang_timeout": "seconds without progress after which a worker is reported as hung; "
                    "above 60, also how long a worker may take to join and to start training",
    "backend": "auto (NCCL where each local worker's model has a GPU of its own, else gloo), "
    "gloo or nccl",
    "device": "where the workers' models compute: auto (a GPU when one is visible), cpu or "
    "cuda; workers share GPUs round-robin",
    "topology": "graph of decentralized protocols: ring, directed-ring, torus, exponential, "
    "one-peer-exponential, complete, bipartite-exponential, edges:FILE",
    "weights": "mixing weights: uniform or metropolis (Metropolis-Hastings)",
    "network": "emulated network: none | bandwidth=10Gbit,latency=50us[;ranks=3:bandwidth=1Gbit]",
    "payload": "charge messages as if the model weighed this: bytes (100MB) or a model name "
    "(resnet50, vgg16, bert-base, ...); needs --network",
    "compress": "how model and gradient payloads travel: none, bf16, fp16 or int8 (chunks of "
    "1024 values with one fp32 scale each; summed in fp32, with error feedback)",
    "overwrite": "replace the run already in --out (without it, such an --out is refused)",
    "checkpoint_every": "seconds of run time between each worker's checkpoint (model, "
    "optimizer, iteration, data position) in DIR/checkpoints/, for `train --resume DIR`",
    "fault": "inject failures: kill:rank=R,at=20s | stop:rank=R,at=10s[,for=5s] | "
    "raise:rank=R,at=ITER | hang:rank=R,at=ITER | delay-messages:p=P,ms=M | "
    "slow-link:ranks=R[+R],at=T,bandwidth=B (needs --network), joined by ';' (tests, "
    "experiments)",
    "on_failure": "a lost worker (dead, stopped or hung): stop the run, continue without it "
    f"({', '.join(TOLERATE_LOSS)}, some not under every option of theirs), or restart it and "
    f"have it rejoin the running run with a live model ({', '.join(REJOIN)}, on gloo; see "
    "docs/failures.md)",
    "max_restarts": "--on-failure rejoin: restarts of one worker before the run goes on "
    "without it",
    "quiet": "no progress bar",
    "keep_snapshots": "keep the model snapshots after evaluation",
    "script": "hetsync launch: your script and its arguments",
}
#: Defaults that are not a value: what an unset option means.
_DEFAULT_TEXT = {
    "max_time": f"train: {RunConfig.DEFAULT_MAX_TIME:g} s if no iteration limit is set; "
    "launch: none, the script's loop ends the run",
    "max_iterations": "no limit",
    "epochs": "no limit",
    "target_loss": "the workload's",
    "batch_size": "the workload's",
    "lr": "the workload's",
    "momentum": "the workload's",
    "out": "runs/LABEL-TIMESTAMP",
    "data_dir": "Debian's install location",
    "label": "the protocol",
    "checkpoint_every": "no checkpoints",
}


def _path(text: str) -> Path:
    """A path flag's value: an empty one (an unset variable, `--out ''`) would be Path(".")
    and put a run's files in the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a path")
    return Path(text)


_TYPES = {"out": _path, "data_dir": _path}


class _HelpFormatter(argparse.HelpFormatter):
    """Ends each option's help with its default, unless the help already gives it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("default:" in text or not action.option_strings or action.required
                or action.default in (None, argparse.SUPPRESS)):
            return text
        return f"{text} (default: {'off' if action.default is False else '%(default)s'})"


def meaning(f: dataclasses.Field[object]) -> str:
    """What an option (`hetsync.config.option_fields`) means: its flag's help."""
    spec = spec_of(f)
    if spec is not None:
        return spec.help
    return _RUN_HELP.get(f.name, f.name.replace("_", " "))  # the docs test asks for one


def default_text(f: dataclasses.Field[object]) -> str:
    """An option's default in words: its value, or what leaving it unset means."""
    spec = spec_of(f)
    if spec is not None and spec.default_text is not None:
        return spec.default_text
    if f.name in _DEFAULT_TEXT:
        return _DEFAULT_TEXT[f.name]
    if isinstance(f.default, bool):
        return "on" if f.default else "off"
    return str(f.default)


def _flag_type(f: dataclasses.Field[object]) -> Callable[[str], object]:
    declared = str(f.type)  # a string: annotations are postponed
    if f.name in _TYPES:
        return _TYPES[f.name]
    return float if declared.startswith("float") else int if declared.startswith("int") else str


def _add_run_options(parser: argparse.ArgumentParser, script: bool) -> None:
    """One flag per option, the run's and every protocol's; absent flags stay unset so
    --config can fill them.

    Their help shows RunConfig's defaults (the flags' own are SUPPRESS, to tell given from
    not given); a bool field defaulting to on gets a --no-NAME flag, one left unset (None)
    both.
    """
    parser.add_argument("--config", type=_path, help="TOML file with the same options (see "
                        "docs/configuration.md; flags given here win) (default: none)")
    for f in option_fields():
        if f.name == "script" or (script and f.name == "workload"):
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{meaning(f)} (default: {default_text(f)})".replace("%", "%%")
        if str(f.type) == "bool" and f.default:
            parser.add_argument("--no-" + flag[2:], dest=f.name, action="store_false",
                                default=argparse.SUPPRESS,
                                help=f"{meaning(f)}: this flag turns it off (default: on)")
        elif str(f.type) == "bool":
            parser.add_argument(flag, dest=f.name, action="store_true",
                                default=argparse.SUPPRESS, help=help_text)
        elif str(f.type) == "bool | None":  # unset: resolved per run (Hop's --skip)
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=_flag_type(f),
                                default=argparse.SUPPRESS, help=help_text)


def train_flags(options: Mapping[str, object]) -> list[str]:
    """The `hetsync train` flags that set these options (`RunConfig`'s keywords), as
    `_add_run_options` names them: for a command that a person can rerun as printed."""
    defaults = {f.name: f.default for f in option_fields()}
    flags: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value != defaults[name]:
                flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetsync",
        description="Heterogeneity-aware decentralized data-parallel training on PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add = functools.partial(sub.add_parser, formatter_class=_HelpFormatter)
    train = add("train", help="train a built-in workload with N workers")
    _add_run_options(train, script=False)
    train.add_argument("--resume", type=_path, metavar="DIR", help="go on with the stopped or "
                       "failed run in DIR from its workers' checkpoints (--checkpoint-every), "
                       "with its recorded options; only --max-time, --max-iterations, --fault "
                       "and --quiet may be given to change them (default: a new run)")
    launch = add("launch", help="run your own training script with N workers")
    _add_run_options(launch, script=True)
    launch.add_argument("script", nargs=argparse.REMAINDER, help=_RUN_HELP["script"])
    simulate = add("simulate", help="run a protocol on a virtual clock (no processes; 1000+ "
                   "workers)")
    _add_run_options(simulate, script=False)
    _add_simulate_options(simulate)
    report = add("report", help="plots and a table from run directories")
    report.add_argument("runs", nargs="+", type=_path, help="run directories")
    report.add_argument("--out", type=_path, required=True, help="folder for plots and report.md")
    _add_bench_parser(add)
    demo = add("demo", help="the default bench at a small size (4 workers, 30 s runs)")
    demo.add_argument("--out", type=_path, default=Path("runs/demo"), help="output folder")
    demo.add_argument("--workers", type=int, default=4, help="number of workers")
    demo.add_argument("--max-time", type=float, default=30.0, help="seconds per run at most")
    add("protocols", help="list the available protocols")
    add("workloads", help="list the built-in workloads")
    return parser


#: Options of `simulate` that are not run options (RunConfig fields).
_SIMULATE = ("math", "gg_service_us", "ps_service_us")


def _add_simulate_options(parser: argparse.ArgumentParser) -> None:
    from hetsync.simulator.run import SimOptions

    defaults = SimOptions()
    parser.add_argument("--math", action="store_true",
                        help="also run every worker's real numerical updates (svm only), for "
                        "loss and time to target (default: off)")
    parser.add_argument("--gg-service-us", type=float, default=defaults.gg_service_us,
                        help="microseconds the Group Generator spends per message")
    parser.add_argument("--ps-service-us", type=float, default=defaults.ps_service_us,
                        help="microseconds the parameter server spends per push")


def _add_bench_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Bench flags stay None when not given (--resume keeps the recorded options)."""
    from hetsync.bench.runner import BenchOptions
    from hetsync.bench.suites import SUITES

    defaults = BenchOptions()
    bench = add(
        "bench", help="run a benchmark suite: every protocol side by side, tables and plots",
        description="Run a suite of the papers' comparisons into --out: results.json, "
        "results.md and plots. Without --suite: the headline suite (under 10 minutes).",
    )
    bench.add_argument("--suite", choices=list(SUITES),
                       help=f"which suite (default: {defaults.suite})")
    bench.add_argument("--out", type=_path, help="suite folder (default: runs/bench-SUITE)")
    bench.add_argument("--workload", help="cnn or svm (or another built-in); in a suite whose "
                       "settings name their workloads (real, real-small), only its settings "
                       f"of this one (default: {defaults.workload}, or digits where "
                       "Fashion-MNIST is not installed; a real suite: all of its own)")
    bench.add_argument("--repeats", type=int, help="runs per protocol and setting, with "
                       "seeds SEED..SEED+R-1, run in rounds (every run once, then again); the "
                       f"median is reported (default: {defaults.repeats})")
    bench.add_argument("--workers", type=int, help="workers where the suite does not say "
                       f"(default: {defaults.workers})")
    bench.add_argument("--step-time", type=float, help="emulated compute per iteration, ms "
                       f"(default: {defaults.step_time:g})")
    bench.add_argument("--max-time", type=float, help="seconds per run at most (default: the "
                       "suite's)")
    bench.add_argument("--target-loss", type=float, help="target loss (default: the suite's "
                       "for the workload, else the workload's)")
    bench.add_argument("--seed", type=int, help=f"first seed (default: {defaults.seed})")
    bench.add_argument("--network", help="emulated network for every run, as in `train` "
                       "(default: each setting's, most have none)")
    bench.add_argument("--payload", help="declared model size for every run, as in `train` "
                       "(default: each setting's)")
    bench.add_argument("--simulate", action="store_true", default=None, help="run the suite "
                       "in the simulator (`hetsync simulate`) instead of real processes "
                       "(default: off; on for simulated suites such as scaling-sim)")
    bench.add_argument("--math", action="store_true", default=None, help="with --simulate: "
                       "the workers' real numerical updates too (svm only) (default: off)")
    bench.add_argument("--variants", help="comma-separated variant labels: run only these "
                       "and the suite's reference runs, e.g. hop,allreduce (default: all)")
    bench.add_argument("--cpus-per-worker", type=int, help="cores per worker in a suite that "
                       "pins its workers (real, real-small) (default: 1)")
    bench.add_argument("--resume", action="store_true", help="finish an interrupted suite in "
                       "--out without redoing its finished runs")
    bench.add_argument("--list", action="store_true", help="list the suites and exit")


def _bench(args: argparse.Namespace) -> int:
    from hetsync.bench.command import bench
    from hetsync.bench.runner import BenchOptions, recorded_options
    from hetsync.bench.suites import describe_suites, get_suite

    if args.list:
        print(describe_suites())
        return 0
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchOptions)
             if getattr(args, f.name) is not None}
    out = args.out or Path(f"runs/bench-{given.get('suite', BenchOptions.suite)}")
    recorded = recorded_options(out) if args.resume else None
    if recorded is not None:
        options = dataclasses.replace(recorded, **given)
    else:
        options = BenchOptions(**given)
        suite = get_suite(options.suite)
        if "workload" not in given:
            options = dataclasses.replace(options,
                                          workload=suite.workload or _default_workload())
        elif suite.own_workloads:
            suite.of_workload(options.workload)  # refuses a workload the suite does not run
    bench(options, out, resume=args.resume)
    return 0


def _default_workload() -> str:
    """cnn, or digits where Fashion-MNIST is not installed (with a note)."""
    from hetsync.workloads import get_workload

    try:
        get_workload("cnn").load(None)
    except ConfigError as error:
        print(f"note: {error}; using --workload digits instead", file=sys.stderr)
        return "digits"
    return "cnn"


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults < --config file < flags given on the command line."""
    values = dict(load_toml(args.config)) if getattr(args, "config", None) else {}
    given = {k: v for k, v in vars(args).items()
             if k not in ("command", "config", "resume", *_SIMULATE)}
    if args.command == "launch":
        if not given.get("script"):
            raise ConfigError("hetsync launch needs a script: hetsync launch [options] script.py")
        given["workload"] = "script"
    merged = {**values, **given}
    return RunConfig.from_dict(merged, source=str(args.config or "command line"))


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "HETSYNC_STORE_PORT" not in os.environ
    )


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler, `timeout`) ends a run as Ctrl-C does: workers stopped, summary
    written."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
    try:
        if args.command == "protocols":
            from hetsync.protocols.registry import available_protocols

            print("\n".join(available_protocols()))
            return 0
        if args.command == "workloads":
            from hetsync.workloads import available_workloads, get_workload

            for name in available_workloads():
                workload = get_workload(name)
                print(f"{name:8s} {workload.description} (target loss {workload.target_loss})")
            return 0
        if args.command == "report":
            from hetsync.report import write_report

            for run in args.runs:
                if not (run / "summary.json").is_file():
                    raise ConfigError(f"{run} is not a run directory (no summary.json)")
            path = write_report(args.runs, args.out)
            print(f"report: {path}\nplots: {args.out}/*.png")
            return 0
        if args.command == "bench":
            return _bench(args)
        if args.command == "demo":
            from hetsync.demo import run_demo

            run_demo(args.out, args.workers, args.max_time, _default_workload())
            return 0
        if getattr(args, "resume", None) is not None:
            return _resume(args)
        config = config_from_args(args)
        if args.command == "simulate":
            return _simulate(config, args)
        if args.command == "train" and _under_torchrun():
            from hetsync.launch.worker import run_under_torchrun
            from hetsync.protocols.registry import validated

            config.workers = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun decides
            if config.pin or config.slowdown_spec().kind == "cpu":
                raise ConfigError("--pin and --slowdown cpu: are applied by hetsync's launcher; "
                                  "under torchrun, pin or cap the workers yourself (taskset, "
                                  "cgroups)")
            run_under_torchrun(validated(config).resolved())
            return 0
        from hetsync.launch.launcher import run

        result = run(config)
    except ConfigError as error:
        print(f"hetsync: error: {error}", file=sys.stderr)
        return 2
    except (WorkerFailed, Deadlock, OutputFailed) as error:
        print(f"hetsync: run failed: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hetsync: interrupted; all workers stopped (the run's summary.json says what "
              "was measured)", file=sys.stderr)
        if args.command == "bench":
            print("hetsync: finished runs are kept: add --resume to the same command to go on",
                  file=sys.stderr)
        return 130
    _print_result(result.run_dir, result.summary)
    return 0


def _resume(args: argparse.Namespace) -> int:
    """`train --resume DIR`: the run's recorded options, extended where given."""
    from hetsync.launch.checkpoint import resume_config
    from hetsync.launch.launcher import run

    if _under_torchrun():
        raise ConfigError("--resume goes on with a run of hetsync's launcher; under torchrun, "
                          "resume from your own checkpoints (SyncOptimizer.load_state_dict())")
    values = dict(load_toml(args.config)) if args.config else {}
    given = {k: v for k, v in vars(args).items() if k not in ("command", "config", "resume")}
    config = resume_config(args.resume, {**values, **given})
    config.out = args.resume
    result = run(config, resume=True)
    _print_result(result.run_dir, result.summary)
    return 0


def _simulate(config: RunConfig, args: argparse.Namespace) -> int:
    from hetsync.simulator.run import SimOptions, simulate

    for name in ("gg_service_us", "ps_service_us"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number >= 0 "
                              f"(got {value})")
    options = SimOptions(math=args.math, gg_service_us=args.gg_service_us,
                         ps_service_us=args.ps_service_us, progress=not config.quiet)
    result = simulate(config, options)
    _print_result(result.run_dir, result.summary)
    reason = result.summary["stop_reason"]
    if reason:
        print(f"hetsync: note: the simulation was {reason}", file=sys.stderr)
    return 0


def _print_result(run_dir: Path, summary: dict[str, object]) -> None:
    parts = [f"{summary['label']}: {summary['wall_time_s']:.1f} s"]
    if summary["samples_per_s"] is not None:
        parts.append(f"{summary['samples_per_s']:.0f} samples/s")
    else:
        parts.append(f"{summary['iterations_per_s']:.1f} iterations/s")
    if summary["target_loss"] is not None:
        ttt = summary["time_to_target_s"]
        reached = f"in {ttt:.1f} s" if ttt is not None else "not reached"
        parts.append(f"target loss {summary['target_loss']} {reached}")
    if summary["final_loss"] is not None:
        parts.append(f"final loss {summary['final_loss']:.4f}")
    parts.append(f"sync wait {100 * float(summary['sync_wait_fraction']):.0f}%")
    reason = summary.get("stop_reason")
    if isinstance(reason, str) and reason.startswith("diverged"):
        parts.append(reason)
    lost = summary.get("lost_workers")
    if isinstance(lost, list) and lost:
        ranks = ", ".join(str(w["rank"]) for w in lost)
        redealt = summary.get("redealt_items")
        parts.append(f"{len(lost)} worker(s) lost (ranks {ranks}"
                     + (f"; {redealt} items of their claims dealt again)" if redealt else ")"))
    back = [w for w in summary.get("rejoined") or [] if w.get("back_at_s") is not None]
    if back:
        down = sum(float(w["downtime_s"] or 0.0) for w in back)
        parts.append(f"{len(back)} back after a restart (ranks "
                     f"{', '.join(str(w['rank']) for w in back)}; {down:.1f} s down in all)")
    distance = summary.get("final_consensus_distance")
    if distance is not None:
        parts.append(f"final models {float(distance):.2g} apart (consensus distance)")
    print(", ".join(parts) + f" -> {run_dir}")


if __name__ == "__main__":
    sys.exit(main())
