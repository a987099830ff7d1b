"""N gloo processes on this machine, as the experiment scripts that time torch.distributed
itself start them (`mp.spawn`, one torch thread each, as hetsync's launcher gives workers
that share a machine)."""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist

from hetsync.config import RunConfig
from hetsync.transport.links import Links
from hetsync.transport.runtime import Runtime

TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("LOCAL_GLOO_TIMEOUT", 120)))
"""How long a wait may last (`LOCAL_GLOO_TIMEOUT` seconds, 120 by default): a test sets less,
so that a hang fails it sooner."""


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, for rank 0's store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank: int, world: int, port: int) -> dist.TCPStore:
    """Join the world of `world` gloo processes whose rank 0 holds the store on `port`; its
    store (rank 0's TCPStore)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    return store


def runtime(rank: int, config: RunConfig, store: dist.Store, links: Links | None = None
            ) -> Runtime:
    """What a driver of `config`'s run knows on rank `rank` of this world: the CPU, gloo, no
    run directory and no launcher (`links`: gloo's default ones unless given)."""
    return Runtime(rank=rank, world_size=config.workers, local_rank=rank,
                   device=torch.device("cpu"), backend="gloo", config=config, store=store,
                   t0=time.time(), run_dir=None, launched=False,
                   hang_timeout=config.hang_timeout, links=links or Links())
