"""hetsync: heterogeneity-aware decentralized data-parallel training on PyTorch.

The public API below is imported on first use, not with the package: every module of hetsync
runs this file first, and reading a run's options (`hetsync.config`, the CLI) must not cost
the import of torch and of every driver.
"""

from __future__ import annotations

import importlib

#: Each public name, and the module that defines it.
_PUBLIC = {
    "ConfigError": "hetsync.errors",
    "HetsyncError": "hetsync.errors",
    "Protocol": "hetsync.protocols.base",
    "RunStopped": "hetsync.errors",
    "Runtime": "hetsync.transport.runtime",
    "Step": "hetsync.step",
    "SyncOptimizer": "hetsync.api",
    "WorkerFailed": "hetsync.errors",
    "available_protocols": "hetsync.protocols.registry",
    "init": "hetsync.session",
    "prepare": "hetsync.api",
    "register_protocol": "hetsync.protocols.registry",
    "shutdown": "hetsync.transport.runtime",
}

__all__ = sorted(_PUBLIC)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hetsync' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
