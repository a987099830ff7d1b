"""hetsync: heterogeneity-aware decentralized data-parallel training on PyTorch."""

from __future__ import annotations

from hetsync.api import SyncOptimizer, prepare
from hetsync.errors import ConfigError, HetsyncError, WorkerFailed
from hetsync.protocols import Protocol, Step, available_protocols, register_protocol
from hetsync.transport.runtime import Runtime, init, shutdown

__all__ = [
    "ConfigError",
    "HetsyncError",
    "Protocol",
    "Runtime",
    "Step",
    "SyncOptimizer",
    "WorkerFailed",
    "available_protocols",
    "init",
    "prepare",
    "register_protocol",
    "shutdown",
]

__version__ = "0.1.0"
