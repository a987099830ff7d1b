"""The options of a run, from the command line or a TOML file, checked before anything starts.

`RunConfig` is the single description of a run: the CLI builds it, `--config FILE.toml` fills
it, the launcher writes it to `DIR/config.json`, and every worker reads it back from there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsync.errors import ConfigError
from hetsync.faults import parse_faults
from hetsync.metrics import strict_json
from hetsync.network.spec import parse_network, parse_payload
from hetsync.protocols.catalog import PROTOCOL_OPTIONS, check_protocol_options, essential_ranks
from hetsync.slowdown import SlowdownSpec, parse_slowdown
from hetsync.topology import WEIGHTS
from hetsync.transport.placement import BACKENDS, DEVICES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["OPTION_HELP", "RunConfig", "default_out", "load_toml"]

_CHOICES = {
    "weights": WEIGHTS,
    "backend": BACKENDS,
    "device": DEVICES,
    "on_failure": ("stop", "continue"),
    **{name: allowed for options in PROTOCOL_OPTIONS for name, allowed in options.CHOICES.items()},
}
#: Each protocol's options, as its package describes them: the flags' help.
OPTION_HELP = {name: text for options in PROTOCOL_OPTIONS for name, text in options.HELP.items()}
#: Each protocol's options' range checks, by kind.
_PROTOCOL_RANGES = {kind: tuple(name for options in PROTOCOL_OPTIONS
                                for name in getattr(options, kind))
                    for kind in ("NON_NEGATIVE", "AT_LEAST_ONE", "FINITE")}


@dataclass
class _RunOptions:
    """The options every run has; each protocol's own come from its package."""
    protocol: str = "allreduce"
    workload: str = "cnn"
    workers: int = 4
    step_time: float = 0.0
    """Emulated compute time per iteration, in milliseconds (0: real compute only)."""
    slowdown: str = "none"
    pin: bool = False
    """Give each worker cores of its own (hetsync.launch.cpu_placement); the launcher only."""
    cpus_per_worker: int = 1
    """With --pin: how many cores each worker gets."""
    max_time: float | None = None
    max_iterations: int | None = None
    target_loss: float | None = None
    """None: the workload's default target, used to measure time to target."""
    stop_at_target: bool = True
    topology: str = "ring"
    """Communication graph of the decentralized protocols (see hetsync.topology)."""
    weights: str = "uniform"
    """Mixing weights: uniform or metropolis."""
    seed: int = 0
    batch_size: int | None = None
    lr: float | None = None
    momentum: float | None = None
    out: Path | None = None
    data_dir: Path | None = None
    label: str | None = None
    eval_every: float = 2.0
    """Seconds between model snapshots evaluated off the critical path."""
    eval_samples: int = 2000
    """Held-out samples used to evaluate each worker's own model (consensus models: all)."""
    hang_timeout: float = 20.0
    """A worker without progress this long is reported as hung."""
    backend: str = "auto"
    """How messages travel; auto: NCCL where every local worker has a GPU of its own (see
    hetsync.transport.placement)."""
    device: str = "auto"
    """Where the built-in workloads' models compute; auto: a GPU when one is visible."""
    network: str = "none"
    """Emulated network (see hetsync.network.spec); none: the real one, nothing added."""
    payload: str = "none"
    """Declared model size that messages are charged for; none: the real model's."""
    overwrite: bool = False
    """Replace a run already in --out (otherwise refused)."""
    checkpoint_every: float | None = None
    """Seconds of run time between each worker's checkpoints (see hetsync.launch.checkpoint);
    None: no checkpoints."""
    fault: str = "none"
    """Failures to inject on purpose (see hetsync.faults), for tests and experiments."""
    on_failure: str = "stop"
    """What a lost worker (dead, stopped, hung) does to the run: stop it, or continue without
    the worker where the protocol can (see hetsync.protocols.catalog.essential_ranks)."""
    quiet: bool = False
    keep_snapshots: bool = False
    script: list[str] = field(default_factory=list)
    """For `hetsync launch`: the user's script and its arguments."""


@dataclass
class RunConfig(*PROTOCOL_OPTIONS, _RunOptions):  # type: ignore[misc]
    """Every option of `hetsync train` / `hetsync launch`: the run's, then each protocol's
    (its package's `Options`, see hetsync.protocols.catalog); field names are the long options.
    """

    DEFAULT_MAX_TIME = 120.0

    def slowdown_spec(self) -> SlowdownSpec:
        return parse_slowdown(self.slowdown, seed=self.seed)

    def validate(self) -> RunConfig:
        """Raise ConfigError naming the first wrong option; return self for chaining. The
        checks of a protocol that a user's module registered are the registry's
        (`hetsync.protocols.registry.validated`): config knows the built-in protocols only."""
        from hetsync.workloads import get_workload

        if not self.script:
            get_workload(self.workload)
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1 (got {self.workers})")
        for name in ("step_time", "max_time", "eval_every", "hang_timeout", "lr", "momentum",
                     "checkpoint_every", *_PROTOCOL_RANGES["NON_NEGATIVE"]):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative (got {value})")
        for name in ("max_iterations", "batch_size", "eval_samples", "cpus_per_worker",
                     *_PROTOCOL_RANGES["AT_LEAST_ONE"]):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
        for name in ("step_time", "max_time", "eval_every", "hang_timeout", "lr", "momentum",
                     "target_loss", "checkpoint_every", *_PROTOCOL_RANGES["FINITE"]):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number "
                                  f"(got {value})")
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1) (got {self.momentum})")
        if self.max_time == 0:
            raise ConfigError("--max-time must be > 0 seconds")
        if self.eval_every == 0 or self.hang_timeout == 0 or self.checkpoint_every == 0:
            raise ConfigError("--eval-every, --hang-timeout and --checkpoint-every must be > 0 "
                              "seconds")
        if self.checkpoint_every is not None and self.script:
            raise ConfigError("--checkpoint-every checkpoints the built-in workloads' training; "
                              "a script checkpoints itself (SyncOptimizer.state_dict(), see "
                              "docs/failures.md)")
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be {' or '.join(allowed)} (got {value!r})")
        self.slowdown_spec().check_ranks(self.workers)
        if self.cpus_per_worker != 1 and not self.pin:
            raise ConfigError("--cpus-per-worker gives pinned workers their cores: add --pin")
        if self.ps_backup and self.protocol != "ps":
            raise ConfigError("--ps-backup applies to --protocol ps --ps-mode sync only")
        network = parse_network(self.network)
        if network is not None:
            network.check_ranks(self.workers)
        for fault in parse_faults(self.fault):
            if fault.rank >= self.workers:
                raise ConfigError(f"--fault names rank {fault.rank}, but there are only "
                                  f"{self.workers} workers (ranks 0..{self.workers - 1})")
        if parse_payload(self.payload) is not None and network is None:
            raise ConfigError("--payload charges messages on an emulated network: give --network")
        check_protocol_options(self)
        if self.on_failure == "continue":
            essential_ranks(self)
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ConfigError(f"--data-dir {self.data_dir} is not a directory")
        if self.script and not Path(self.script[0]).is_file():
            raise ConfigError(f"script {self.script[0]!r} not found")
        return self

    def resolved(self) -> RunConfig:
        """A copy with the workload's defaults and a stop condition filled in."""
        from hetsync.workloads import get_workload

        values = dataclasses.asdict(self)
        if not self.script:
            workload = get_workload(self.workload)
            for name in ("batch_size", "lr", "momentum", "target_loss"):
                if values[name] is None:
                    values[name] = getattr(workload, name)
        if self.max_time is None and self.max_iterations is None:
            values["max_time"] = self.DEFAULT_MAX_TIME
        values["label"] = self.label or self.protocol
        return RunConfig(**values)

    def to_json(self) -> str:
        values = dataclasses.asdict(self)
        for key in ("out", "data_dir"):
            if values[key] is not None:
                values[key] = str(values[key])
        return strict_json.dumps(values, indent=2)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> RunConfig:
        """Build from a dict (TOML or JSON), rejecting unknown keys and wrong types by name."""
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        values = {key.replace("-", "_"): value for key, value in values.items()}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"{source}: unknown option {unknown[0]!r}")
        for key, value in values.items():
            declared = fields[key]
            if value is None and declared.endswith("| None"):
                continue
            expected = declared.removesuffix(" | None")
            if not _has_type(value, expected):
                raise ConfigError(f"{source}: {key} must be {_TYPE_NAMES[expected]} "
                                  f"(got {value!r})")
        for key in ("out", "data_dir"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        return cls(**values)

    @classmethod
    def read(cls, path: Path) -> RunConfig:
        return cls.from_dict(json.loads(Path(path).read_text()), source=str(path))


_TYPE_NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "Path": "a path (a string)", "list[str]": "a list of strings"}


def _has_type(value: object, declared: str) -> bool:
    """Whether a TOML or JSON value fits a RunConfig field declared as `declared`."""
    if declared == "bool":
        return isinstance(value, bool)
    if declared == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if declared == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if declared in ("str", "Path"):
        return isinstance(value, (str, Path))
    if declared == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return True


def default_out(config: RunConfig) -> Path:
    """The run directory of a run without `--out`: its label and the time it started."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.label or config.protocol}-{stamp}"


def load_toml(path: Path) -> dict[str, Any]:
    """Read a `--config FILE.toml`; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config file {path} not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"--config file {path} is not a text file (not UTF-8)") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config file {path} is not valid TOML: {error}") from None
