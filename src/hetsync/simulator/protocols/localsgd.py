"""Local SGD's simulation lives in its package (re-exported here until the simulator finds it
there)."""

from hetsync.protocols.localsgd.simulation import build_workers

__all__ = ["build_workers"]
