"""Joining a run, `hetsync.init()`: where the transport meets the protocols.

The transport (hetsync.transport.runtime) connects the worker; the run's options (config.json,
`HETSYNC_CONFIG`, `init`'s keywords) are read here and handed to it. Which protocols exist is
the registry's to say (a user's module may have registered one), and the registry sits above
the transport, with the drivers: the session asks it, so that a wrong protocol name fails at
`init()`, in one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hetsync.config import RunConfig, lift_tables, load_toml
from hetsync.errors import ConfigError
from hetsync.protocols.registry import get_protocol
from hetsync.transport.runtime import Runtime, join

__all__ = ["init"]

#: A TOML file of the run's options for `hetsync.init()` where no launcher gives them.
ENV_CONFIG = "HETSYNC_CONFIG"


def init(**defaults: object) -> Runtime:
    """Join the run: set up the process group and read the run's settings.

    Keyword arguments give the run's options (for example `protocol="ddp"`) when no launcher
    gives them: under `hetsync launch` the launcher's options (all of them, defaults included)
    apply instead; under torchrun, `HETSYNC_CONFIG=FILE.toml` overrides them key by key.

    Threads: `HETSYNC_THREADS=N` sets torch's intra-op threads; without it, a worker that
    shares its machine with other workers (the launcher's, or torchrun's with
    LOCAL_WORLD_SIZE > 1) gets one thread, so that workers do not fight over cores; a lone
    process keeps torch's default (see `hetsync.transport.runtime.thread_count`).
    """
    return join(lambda run_dir: _read_config(defaults, run_dir))


def _read_config(defaults: Mapping[str, object], run_dir: Path | None) -> RunConfig:
    """The run's options: the launcher's (`run_dir/config.json`), else `defaults` with
    `HETSYNC_CONFIG`'s keys over them. A wrong protocol name fails here, in one line, not at
    the first step."""
    config = RunConfig.from_dict(dict(defaults), source="hetsync.init()")
    get_protocol(config.protocol)
    if config.workers < 1:
        raise ConfigError(f"hetsync.init(): workers must be >= 1 (got {config.workers})")
    if run_dir is not None and (run_dir / "config.json").is_file():
        return RunConfig.read(run_dir / "config.json")
    if ENV_CONFIG in os.environ:
        path = os.environ[ENV_CONFIG]
        merged = {**lift_tables(dict(defaults), "hetsync.init()"),
                  **lift_tables(load_toml(Path(path)), path, protocol=config.protocol)}
        return RunConfig.from_dict(merged, source=path)
    return config
