"""Joining a run, `hetsync.init()`: where the transport meets the protocols.

The transport (hetsync.transport.runtime) connects the worker and reads the run's settings;
which protocols exist is the registry's to say (a user's module may have registered one), and
the registry sits above the transport, with the drivers. The session hands the registry's
lookup to the transport, so that a wrong protocol name fails at `init()`, in one line.
"""

from __future__ import annotations

from hetsync.protocols.registry import get_protocol
from hetsync.transport.runtime import Runtime, join

__all__ = ["init"]


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
    return join(defaults, get_protocol)
