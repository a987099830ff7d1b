"""The parameter server's options (`--ps-mode`, `--ps-backup`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError
from hetsync.protocols.option_field import option
from hetsync.protocols.ps.core import MODES

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["Options", "check", "tolerate_loss"]


@dataclass
class Options:
    ps_mode: str = option("sync", choices=MODES, help="parameter server: sync (each round "
                          "waits for every worker) or async (each gradient applied as it "
                          "comes: tolerates a straggler, as sync does with --ps-backup 1)")
    """Sync waits for every worker; async applies each gradient as it comes."""
    ps_backup: int = option(0, at_least=0, help="parameter server, sync: backup workers, "
                            "gradients not waited for per round (late ones dropped)")
    """A round closes at the first workers - ps_backup gradients (Chen et al. 2016)."""


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
