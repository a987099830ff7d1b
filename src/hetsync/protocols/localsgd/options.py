"""Local SGD's options (`--local-steps`, `--outer-optimizer`, `--outer-lr`,
`--outer-momentum`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetsync.errors import ConfigError
from hetsync.protocols.option_field import option

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["OUTER_OPTIMIZERS", "Options", "check"]

#: none: the average is the new model (local SGD); nesterov: DiLoCo's outer step.
OUTER_OPTIMIZERS = ("none", "nesterov")


@dataclass
class Options:
    local_steps: int = option(8, at_least=1, help="local SGD: optimizer steps each worker "
                              "takes alone between averages (each average waits for every "
                              "worker: no option tolerates a straggler)")
    outer_optimizer: str = option("none", choices=OUTER_OPTIMIZERS, help="local SGD: none (the "
                                  "average is the new model) or nesterov (DiLoCo: outer "
                                  "Nesterov step on the averaged pseudo-gradient)")
    outer_lr: float = option(0.7, at_least=0, finite=True, help="local SGD with "
                             "--outer-optimizer nesterov: the outer learning rate")
    """DiLoCo's 0.7."""
    outer_momentum: float = option(0.9, at_least=0, finite=True, help="local SGD with "
                                   "--outer-optimizer nesterov: the outer momentum, in [0, 1)")
    """DiLoCo's 0.9."""


def check(config: RunOptions) -> None:
    if config.outer_momentum >= 1:
        raise ConfigError(f"--outer-momentum must be in [0, 1) (got {config.outer_momentum})")
