"""DDP on the virtual clock: All-Reduce's simulation (see `allreduce`: DDP's bucketed
all-reduces overlap a backward pass that an emulated step time pads at its end)."""

from hetsync.protocols.allreduce.simulation import build_workers

__all__ = ["build_workers"]
