"""Checkpoints of the built-in training loop (`--checkpoint-every`) and `train --resume`.

Theory of operation. Each worker writes `DIR/checkpoints/rank{r}.pt` by itself, at the first
iteration boundary after every `--checkpoint-every` seconds of run time: a temporary file
renamed over the previous checkpoint, so a reader (or a resume after a kill in the middle of
a write) always finds a whole one. There is no barrier: the workers' checkpoints are of
different iterations and times, and a resumed run starts every worker from its own. The
protocols keep no synchronisation state across it (tokens, queues, groups and rounds start
afresh from the loaded models, as a new run would from them); only state that the models do
not carry is saved (`Protocol.state_dict()`: the parameter server's model and optimizer).
Messages in flight at the failure are lost with the work done after each checkpoint.

Every worker goes on for the same number of steps: `--max-iterations` K counts them from the
earliest checkpoint's iteration, the `base` the launcher gives every worker (`ENV_RESUME_BASE`),
so each runs K - base more and the one resumed from the earliest ends exactly at K, the others
past it by how far their checkpoints were ahead. Counted from each worker's own checkpoint,
the workers of a static Prague schedule left a group one member short (a deadlock) and the
protocols that agree on the stop ended some workers short of K.

On resume the launcher puts every worker on one run-time axis: each goes on at the latest
checkpoint's time (so the rows' `t` increases on every worker and the workers' clocks agree,
as the evaluator's snapshot sets and the emulated network need). Each worker keeps its rows
up to its checkpoint and drops the later ones; `eval.jsonl` keeps the evaluations up to the
earliest checkpoint.

Workers the run lost (`--on-failure continue`, the summary's `lost_workers`) stay lost: a
worker that comes back does not rejoin (docs/failures.md), and its checkpoint, if it has one,
is older than the survivors' by the time since its loss. The resume goes on with the
survivors only (the launcher spawns the lost ranks to form the process group and declares
them lost from the start), trims by the survivors' checkpoints, and keeps the loss in the new
summary; a protocol that cannot go on without them is refused in one line.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hetsync.config import RunConfig, lift_tables
from hetsync.errors import ConfigError
from hetsync.metrics.atomic import replacing, write_text
from hetsync.protocols.catalog import essential_ranks

__all__ = ["ENV_RESUME_AT", "ENV_RESUME_BASE", "Checkpointer", "Resume", "checkpoint_path",
           "lost_before", "prepare_resume", "resume_config"]

#: Set by the launcher on a resumed run: the run time (s) at which every worker goes on.
ENV_RESUME_AT = "HETSYNC_RESUME_AT"
#: Set by the launcher on a resumed run: the iteration every worker's steps count from.
ENV_RESUME_BASE = "HETSYNC_RESUME_BASE"
#: Options a resumed run may change: how far it goes, its faults and its display.
MAY_CHANGE = ("max_time", "max_iterations", "fault", "quiet")


def checkpoint_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "checkpoints" / f"rank{rank}.pt"


class Checkpointer:
    """Writes one worker's checkpoint every `every` seconds of run time, atomically."""

    def __init__(self, run_dir: Path, rank: int, every: float, elapsed: float = 0.0) -> None:
        self.path = checkpoint_path(run_dir, rank)
        self.every = every
        self._next = elapsed + every

    def due(self, elapsed: float) -> bool:
        return elapsed >= self._next

    def write(self, state: dict[str, Any], elapsed: float) -> float:
        """Save `state`; returns the seconds the write took."""
        began = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(self.path) as partial:
            torch.save(state, partial)
        self._next = elapsed + self.every
        return time.perf_counter() - began


def resume_config(run_dir: Path, given: dict[str, Any]) -> RunConfig:
    """The recorded options of the run in `run_dir`, with the ones `given` that may change
    (`MAY_CHANGE`); any other given option that differs is refused in one line. A fault is
    not repeated unless given again: it was the test of the run before."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no config.json)")
    try:
        recorded = RunConfig.read(path)
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError(f"--resume {run_dir}: {path} cannot be read ({error})") from None
    if recorded.checkpoint_every is None:
        raise ConfigError(f"--resume {run_dir}: the run was not checkpointed (it had no "
                          "--checkpoint-every)")
    values = recorded.to_dict()
    values["fault"] = "none"
    given = lift_tables({"protocol": recorded.protocol, **given}, source="--resume")
    RunConfig.from_dict(given, source="--resume")  # unknown options and wrong types, by name
    for name, value in given.items():
        if name in MAY_CHANGE:
            values[name] = value
        elif _plain(value) != _plain(values[name]):
            flag = "--" + name.replace("_", "-")
            allowed = ", ".join("--" + n.replace("_", "-") for n in MAY_CHANGE)
            raise ConfigError(f"--resume {run_dir}: {flag} {_plain(value)} differs from the "
                              f"run's {_plain(values[name])} (only {allowed} may change)")
    return RunConfig(**values)


def _plain(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a resumed run goes on: every worker at run time `at_s`, each from its own
    checkpoint's iteration (None: a rank lost before the resume, which does not go on)."""

    at_s: float
    iterations: list[int | None]

    @property
    def base(self) -> int:
        """The earliest checkpoint's iteration, which `--max-iterations` counts every worker's
        steps from: all go on for the same number, as lock-step protocols need."""
        return min(i for i in self.iterations if i is not None)

    def environment(self) -> dict[str, str]:
        """What each worker of the resumed run is told of it."""
        return {ENV_RESUME_AT: repr(self.at_s), ENV_RESUME_BASE: str(self.base)}


def lost_before(run_dir: Path, config: RunConfig) -> list[dict[str, Any]]:
    """The workers the run in `run_dir` lost (its summary's `lost_workers` entries), which a
    resume goes on without; refused in one line where the protocol cannot."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    lost = list(summary.get("lost_workers") or []) if isinstance(summary, dict) else []
    if not lost:
        return []
    ranks = sorted(int(w["rank"]) for w in lost)
    named = ", ".join(map(str, ranks))
    try:
        essential = (essential_ranks(config) if config.on_failure == "continue"
                     else frozenset(ranks))
    except ConfigError as error:
        raise ConfigError(f"--resume {run_dir}: the run lost rank {named}, and {error}") from None
    needed = sorted(essential & set(ranks))
    if needed:
        raise ConfigError(f"--resume {run_dir}: the run lost rank {named}, and "
                          f"{config.protocol} cannot go on without rank "
                          f"{', '.join(map(str, needed))}")
    return lost


def prepare_resume(run_dir: Path, config: RunConfig,
                   lost: frozenset[int] = frozenset()) -> Resume:
    """Check the checkpoint of every worker not `lost`, and that `config`'s limits leave
    the run something to do, then trim what the run recorded after the checkpoints; return
    where the workers go on (the latest checkpoint's run time). Nothing is trimmed before
    every check has passed."""
    survivors = [r for r in range(config.workers) if r not in lost]
    missing = [r for r in survivors if not checkpoint_path(run_dir, r).exists()]
    if missing:
        ranks = ", ".join(map(str, missing))
        raise ConfigError(f"--resume {run_dir}: no checkpoint of rank {ranks} "
                          f"(checkpoints/rank{missing[0]}.pt): it failed before its first one")
    times: list[float] = []
    iterations: list[int | None] = [None] * config.workers
    for rank in survivors:
        t, iterations[rank] = _checkpoint_position(run_dir, rank)
        times.append(t)
    if config.max_time is not None and max(times) >= config.max_time:
        raise ConfigError(f"--resume {run_dir}: its checkpoints are at {max(times):.1f} s of "
                          f"run time, past --max-time {config.max_time:g}: give a longer one")
    done = [i for i in iterations if i is not None]
    if config.max_iterations is not None and min(done) >= config.max_iterations:
        raise ConfigError(f"--resume {run_dir}: its checkpoints are at iteration {min(done)}, "
                          f"past --max-iterations {config.max_iterations}: give more")
    _trim_evaluations(run_dir / "eval.jsonl", min(times))
    shutil.rmtree(run_dir / "snapshots", ignore_errors=True)  # the run before's, unevaluated
    return Resume(at_s=max(times), iterations=iterations)


def _checkpoint_position(run_dir: Path, rank: int) -> tuple[float, int]:
    """(run time, iteration) of `rank`'s checkpoint; ConfigError naming the file for one
    that is not a file, is empty, damaged, or not a hetsync checkpoint."""
    path = checkpoint_path(run_dir, rank)
    name = f"--resume {run_dir}: checkpoints/rank{rank}.pt"
    if not path.is_file():
        raise ConfigError(f"{name} is not a file")
    if path.stat().st_size == 0:
        raise ConfigError(f"{name} is empty")
    try:
        saved = torch.load(path, mmap=True, weights_only=False,
                           map_location="cpu")  # a GPU run's: no CUDA in the launcher
    except Exception:  # noqa: BLE001 - any unreadable file gets the same line
        raise ConfigError(f"{name} is damaged: not an archive torch.save wrote") from None
    try:
        return float(saved["t"]), int(saved["iteration"])
    except (TypeError, KeyError, ValueError):
        raise ConfigError(f"{name} is not a hetsync checkpoint (no run time and iteration "
                          "in it)") from None


def _trim_evaluations(path: Path, until: float) -> None:
    """Keep the evaluations of models up to run time `until` (later ones mix in work that
    the resume throws away)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if float(json.loads(line)["t"]) <= until:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue
    write_text(path, "".join(kept))
