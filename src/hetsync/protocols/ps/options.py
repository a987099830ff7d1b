"""The parameter server's options (`--ps-mode`, `--ps-backup`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hetsync.errors import ConfigError
from hetsync.protocols.ps.core import MODES

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["Options", "check", "tolerate_loss"]


@dataclass
class Options:
    ps_mode: str = "sync"
    """Parameter server: sync (wait for every worker) or async (apply each gradient)."""
    ps_backup: int = 0
    """Parameter server, sync: a round closes at the first workers - ps_backup gradients; late
    ones are dropped (backup workers, Chen et al. 2016)."""

    HELP: ClassVar[dict[str, str]] = {
        "ps_mode": "parameter server: sync or async",
        "ps_backup": "parameter server, sync: backup workers, gradients not waited for per round "
        "(late ones dropped)",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"ps_mode": MODES}
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("ps_backup",)
    AT_LEAST_ONE: ClassVar[tuple[str, ...]] = ()
    FINITE: ClassVar[tuple[str, ...]] = ()


def check(config: RunOptions) -> None:
    if config.ps_backup and config.ps_mode != "sync":
        raise ConfigError("--ps-backup applies to --ps-mode sync (async waits for no one)")
    if config.ps_backup >= config.workers:
        raise ConfigError(f"--ps-backup must be < --workers {config.workers} (got "
                          f"{config.ps_backup}): a round needs at least one gradient")


def tolerate_loss(config: RunOptions) -> frozenset[int]:
    """`--on-failure continue`: the server stops waiting for a lost worker (a synchronous
    round closes without it); rank 0, which hosts the server, cannot be lost."""
    return frozenset({0})
