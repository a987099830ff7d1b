"""The options of a run, from the command line or a TOML file, checked before anything starts.

`RunConfig` is the single description of a run: the CLI builds it, `--config FILE.toml` fills
it, the launcher writes it to `DIR/config.json`, and every worker reads it back from there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsync.errors import ConfigError
from hetsync.faults import parse_faults
from hetsync.metrics import strict_json
from hetsync.network.spec import parse_network, parse_payload
from hetsync.protocols.catalog import (
    BUILTIN,
    GRAPH_PROTOCOLS,
    OPTIONS_OF,
    check_protocol_options,
    check_rejoin,
    essential_ranks,
    option_owners,
)
from hetsync.protocols.option_field import check_values, flag
from hetsync.slowdown import SlowdownSpec, parse_slowdown
from hetsync.topology import WEIGHTS
from hetsync.transport.codec_kinds import CODECS
from hetsync.transport.placement import BACKENDS, DEVICES
from hetsync.user_files import check_python_script, read_user_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["RunConfig", "default_out", "load_toml", "option_fields"]

#: The longest duration an option may give (30 days): beyond it a value is a typo or a unit
#: mistaken, and the OS's sleep and timers overflow far later, inside a worker.
_LONGEST_S = 30 * 24 * 3600.0
_CHOICES = {
    "weights": WEIGHTS,
    "backend": BACKENDS,
    "device": DEVICES,
    "on_failure": ("stop", "continue", "rejoin"),
    "eval_bn": ("recompute", "saved"),
    "sampler": ("static", "dynamic"),
    "compress": CODECS,
}

#: What `--device cuda:1` (PyTorch's spelling) gets told: the workers' GPUs are placed by rule.
_PICK_A_GPU = (": hetsync places the workers on the visible GPUs itself, round-robin; to pick "
               "GPU 1, run with CUDA_VISIBLE_DEVICES=1 and --device cuda")


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
    keep_awake: bool = False
    """With --pin: busy loops at the lowest priority on the workers' cores
    (hetsync.launch.awake_cores)."""
    max_time: float | None = None
    max_iterations: int | None = None
    epochs: int | None = None
    """The built-in workloads: stop after this many epochs of the training data."""
    sampler: str = "static"
    """The built-in workloads' data: each worker a fixed shard (static), or each epoch dealt
    out as the workers ask (dynamic, hetsync.data.DynamicSampler)."""
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
    eval_bn: str = "recompute"
    """An averaged model's BatchNorm statistics when it is evaluated: recomputed from training
    samples, or the average of the workers' (hetsync.metrics.evaluator's module doc)."""
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
    compress: str = "none"
    """How model and gradient payloads are written on the wire (hetsync.transport.codec)."""
    overwrite: bool = False
    """Replace a run already in --out (otherwise refused)."""
    checkpoint_every: float | None = None
    """Seconds of run time between each worker's checkpoints (see hetsync.launch.checkpoint);
    None: no checkpoints."""
    fault: str = "none"
    """Failures to inject on purpose (see hetsync.faults), for tests and experiments."""
    on_failure: str = "stop"
    """What a lost worker (dead, stopped, hung) does to the run: stop it, or continue without
    the worker where the protocol can (see hetsync.protocols.catalog.essential_ranks), or
    restart it and have it rejoin the running run (`rejoin`: hetsync.transport.membership)."""
    max_restarts: int = 3
    """`--on-failure rejoin`: how many times a worker is restarted before the run goes on
    without it."""
    quiet: bool = False
    keep_snapshots: bool = False
    script: list[str] = field(default_factory=list)
    """For `hetsync launch`: the user's script and its arguments."""


_RUN_FIELDS = {f.name: f for f in dataclasses.fields(_RunOptions)}


@dataclass(init=False)
class RunConfig(_RunOptions):
    """Every option of `hetsync train` / `hetsync launch`: the run's (field names are the long
    options), and the chosen protocol's own, `protocol_options` (its package's `Options`, see
    hetsync.protocols.catalog; None for a protocol without options).

    Built from flat keywords, as the command line gives them: `RunConfig(protocol="hop",
    max_gap=4)`; a protocol option of another protocol than `protocol` is refused. A
    protocol's options read as attributes too (`config.max_gap`), for its own checks and
    driver.
    """

    DEFAULT_MAX_TIME = 120.0

    protocol_options: Any = None

    def __init__(self, *, protocol_options: Any = None, **values: Any) -> None:
        unknown = sorted(set(values) - set(_RUN_FIELDS) - set(option_owners()))
        if unknown:
            raise TypeError(f"RunConfig() got an unexpected keyword argument {unknown[0]!r}")
        for name, f in _RUN_FIELDS.items():
            if name in values:
                value = values.pop(name)
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, name, value)
        self.protocol_options = _options_for(self.protocol, protocol_options, values)

    def __getattr__(self, name: str) -> Any:
        """The chosen protocol's options (fields and methods), as attributes. Another
        protocol's read as its defaults: a script may run another protocol than the run's
        (`SyncOptimizer(..., protocol=...)`), which then has no options of the run's."""
        options = self.__dict__.get("protocol_options")
        if not name.startswith("__"):
            if options is not None and hasattr(options, name):
                return getattr(options, name)
            for cls in OPTIONS_OF.values():
                if not isinstance(options, cls) and hasattr(defaults := cls(), name):
                    return getattr(defaults, name)
        raise AttributeError(f"{type(self).__name__} of protocol "
                             f"{self.__dict__.get('protocol')!r} has no option {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """A protocol option set on the config lands in `protocol_options`: one place each.
        Any other name is refused, as the constructor refuses it: kept as a plain attribute
        it would read back, but neither `to_dict` nor config.json would carry it to the
        workers."""
        if name in _RUN_FIELDS or name == "protocol_options":
            object.__setattr__(self, name, value)
            return
        options = self.__dict__.get("protocol_options")
        if options is not None and any(f.name == name for f in dataclasses.fields(options)):
            setattr(options, name, value)
            return
        owners = option_owners()
        if name in owners:
            raise ConfigError(_not_its_own(name, self.protocol, owners))
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every option as flat keywords (`RunConfig(**config.to_dict())` is a copy)."""
        values = {name: getattr(self, name) for name in _RUN_FIELDS}
        values["script"] = list(self.script)
        if self.protocol_options is not None:
            values.update(dataclasses.asdict(self.protocol_options))
        return values

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
                     "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative (got {value})")
        for name in ("max_iterations", "epochs", "batch_size", "eval_samples",
                     "cpus_per_worker"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
        for name in ("step_time", "max_time", "eval_every", "hang_timeout", "lr", "momentum",
                     "target_loss", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number "
                                  f"(got {value})")
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1) (got {self.momentum})")
        for name in ("max_time", "eval_every", "hang_timeout", "checkpoint_every"):
            if getattr(self, name) == 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds")
        for name, limit in (("step_time", 1000 * _LONGEST_S), ("max_time", _LONGEST_S),
                            ("eval_every", _LONGEST_S), ("hang_timeout", _LONGEST_S),
                            ("checkpoint_every", _LONGEST_S)):
            value = getattr(self, name)
            if value is not None and value > limit:
                unit = "ms" if name == "step_time" else "s"
                raise ConfigError(f"--{name.replace('_', '-')} {value:g} {unit} is longer "
                                  "than 30 days: is the unit right?")
        if self.max_time is not None and self.step_time / 1000 >= self.max_time:
            raise ConfigError(f"--step-time {self.step_time:g} ms is as long as --max-time "
                              f"{self.max_time:g} s or longer: no step would end")
        for name in ("epochs", "sampler"):
            if self.script and getattr(self, name) != getattr(RunConfig, name):
                raise ConfigError(f"{flag(name)} sets the built-in workloads' data; a script "
                                  "deals its own (hetsync.data.DynamicSampler, see "
                                  "docs/protocols.md)")
        if self.checkpoint_every is not None and self.script:
            raise ConfigError("--checkpoint-every checkpoints the built-in workloads' training; "
                              "a script checkpoints itself (SyncOptimizer.state_dict(), see "
                              "docs/failures.md)")
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"{flag(name)} must be {' or '.join(allowed)} "
                                  f"(got {value!r}){_PICK_A_GPU if name == 'device' else ''}")
        if self.protocol_options is not None:
            check_values(self.protocol_options)
        self.slowdown_spec().check_ranks(self.workers)
        if self.cpus_per_worker != 1 and not self.pin:
            raise ConfigError("--cpus-per-worker gives pinned workers their cores: add --pin")
        if self.keep_awake and not self.pin:
            raise ConfigError("--keep-awake keeps pinned workers' cores busy: add --pin")
        network = parse_network(self.network)
        if network is not None:
            network.check_ranks(self.workers)
        for fault in parse_faults(self.fault):
            if fault.WHERE == "network" and network is None:
                raise ConfigError(f"--fault {fault.kind} slows the emulated network: give "
                                  "--network")
            if fault.rank >= self.workers:
                raise ConfigError(f"--fault names rank {fault.rank}, but there are only "
                                  f"{self.workers} workers (ranks 0..{self.workers - 1})")
        if parse_payload(self.payload) is not None and network is None:
            raise ConfigError("--payload charges messages on an emulated network: give --network")
        check_protocol_options(self)
        if self.protocol in BUILTIN and self.protocol not in GRAPH_PROTOCOLS:
            for name in ("topology", "weights"):
                if getattr(self, name) != getattr(RunConfig, name):
                    raise ConfigError(f"{flag(name)} shapes the graph of "
                                      f"{', '.join(GRAPH_PROTOCOLS)}; {self.protocol} has none "
                                      f"(got {getattr(self, name)!r})")
        if self.on_failure == "continue":
            essential_ranks(self)
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be 0 or more (got {self.max_restarts})")
        if self.on_failure == "rejoin":
            check_rejoin(self)
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ConfigError(f"--data-dir {self.data_dir} is not a directory")
        if self.script:
            check_python_script(self.script[0], "script")
        return self

    def resolved(self) -> RunConfig:
        """A copy with the workload's defaults and, for a built-in workload, a stop condition
        filled in. A user's script (`hetsync launch`) gets none: its own loop decides when it
        ends, and a limit it never asked for would cut its training short."""
        from hetsync.workloads import get_workload

        values = self.to_dict()
        if not self.script:
            workload = get_workload(self.workload)
            for name in ("batch_size", "lr", "momentum", "target_loss"):
                if values[name] is None:
                    values[name] = getattr(workload, name)
            if self.max_time is None and self.max_iterations is None and self.epochs is None:
                values["max_time"] = self.DEFAULT_MAX_TIME
        values["label"] = self.label or self.protocol
        return RunConfig(**values)

    def to_json(self) -> str:
        """The run's options, the protocol's as a table under its name (as in a TOML file)."""
        values = {name: getattr(self, name) for name in _RUN_FIELDS}
        for key in ("out", "data_dir"):
            if values[key] is not None:
                values[key] = str(values[key])
        if self.protocol_options is not None:
            values[self.protocol] = dataclasses.asdict(self.protocol_options)
        return strict_json.dumps(values, indent=2)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> RunConfig:
        """Build from a dict (TOML or JSON): the run's options and the protocol's, flat or in
        a table named by the protocol (`[hop]`; a flat key wins over its table's), rejecting
        unknown keys, another protocol's options and wrong types by name."""
        values = lift_tables(values, source)
        owners = option_owners()
        protocol = values.get("protocol", cls.protocol)
        own = OPTIONS_OF.get(protocol) if isinstance(protocol, str) else None
        fields = {f.name: str(f.type) for f in dataclasses.fields(own)} if own else {}
        fields |= {name: str(f.type) for name, f in _RUN_FIELDS.items()}
        for key, value in values.items():
            if key not in fields:
                if key in owners:
                    raise ConfigError(f"{source}: {_not_its_own(key, protocol, owners)}")
                raise ConfigError(f"{source}: unknown option {key!r}")
            declared = fields[key]
            if value is None and declared.endswith("| None"):
                continue
            expected = declared.removesuffix(" | None")
            if not _has_type(value, expected):
                raise ConfigError(f"{source}: {key} must be {_TYPE_NAMES[expected]} "
                                  f"(got {value!r})")
        for key in ("out", "data_dir"):
            if values.get(key) is not None:
                if not str(values[key]).strip():  # Path("") is ".": the current folder
                    raise ConfigError(f"{source}: {key} is empty: give a path")
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


def option_fields() -> tuple[dataclasses.Field[Any], ...]:
    """Every option a run may be given, each once: the run's, then each protocol's (a name two
    protocols declare means the same in both: tests/protocols/test_options.py)."""
    seen = dict(_RUN_FIELDS)
    for options in OPTIONS_OF.values():
        for f in dataclasses.fields(options):
            seen.setdefault(f.name, f)
    return tuple(seen.values())


def lift_tables(values: Mapping[str, Any], source: str,
                protocol: str = RunConfig.protocol) -> dict[str, Any]:
    """Flat keys (`-` read as `_`) from TOML or JSON keys, some in a table named by the run's
    protocol (`[hop]`; `values`' own `protocol`, else `protocol`); a flat key wins over the
    table's. A table of another protocol, a key that is not its protocol's option, or a table
    that is not one is refused by name."""
    flat = _underscored(values, source)
    protocol = flat.get("protocol", protocol)
    lifted: dict[str, Any] = {}
    for name in [key for key in flat if key in BUILTIN]:
        table = flat.pop(name)
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: {name} must be a table of {name}'s options "
                              f"(got {table!r})")
        table = _underscored(table, f"{source}: [{name}]")
        if table and name != protocol:
            raise ConfigError(f"{source}: [{name}] sets {name}'s options, but the protocol is "
                              f"{protocol} (move them, or set protocol = \"{name}\")")
        own = {f.name for f in dataclasses.fields(OPTIONS_OF[name])} if name in OPTIONS_OF \
            else set()
        for key in table:
            if key not in own:
                known = ", ".join(sorted(own)) or "none"
                raise ConfigError(f"{source}: unknown option {key!r} in [{name}] ({name}'s "
                                  f"options: {known})")
        lifted |= table
    return {**lifted, **flat}


def _underscored(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`values` with `-` in keys read as `_`; one option spelled both ways is refused, since
    either value would silently win."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name in out:
            raise ConfigError(f"{source}: {spelled[name]!r} and {key!r} are one option: keep "
                              "one")
        out[name], spelled[name] = value, key
    return out


def _not_its_own(name: str, protocol: object, owners: dict[str, tuple[str, ...]]) -> str:
    """The refusal of another protocol's option, in one line."""
    return (f"{flag(name)} applies to --protocol {' or '.join(owners[name])} (this run's "
            f"protocol is {protocol})")


def _options_for(protocol: str, given: Any, values: dict[str, Any]) -> Any:
    """`protocol`'s `Options`: `given` (or the defaults) with the flat `values` set; ConfigError
    for another protocol's option."""
    cls = OPTIONS_OF.get(protocol)
    owners = option_owners()
    own = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    for name in values:
        if name not in own:
            raise ConfigError(_not_its_own(name, protocol, owners))
    if cls is None:
        if given is not None:
            raise ConfigError(f"protocol {protocol} has no options (got {given!r})")
        return None
    if given is None:
        given = cls()
    elif not isinstance(given, cls):
        raise ConfigError(f"protocol_options of protocol {protocol} must be "
                          f"{cls.__module__}.Options (got {type(given).__name__})")
    return dataclasses.replace(given, **values)


def default_out(config: RunConfig) -> Path:
    """The run directory of a run without `--out`: its label and the time it started, one
    directory under runs/ whatever the label holds (`../x` or `a/b` would leave it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^\w.-]+", "-", config.label or config.protocol).strip(".-") or "run"
    return Path("runs") / f"{name}-{stamp}"


def load_toml(path: Path) -> dict[str, Any]:
    """Read a `--config FILE.toml`; errors name the file."""
    try:
        return tomllib.loads(read_user_text(path, "--config file"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config file {path} is not valid TOML: {error}") from None
