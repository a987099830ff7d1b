"""Local SGD's options (`--local-steps`, `--outer-optimizer`, `--outer-lr`,
`--outer-momentum`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hetsync.errors import ConfigError

if TYPE_CHECKING:
    from hetsync.protocols.run_options import RunOptions

__all__ = ["OUTER_OPTIMIZERS", "Options", "check"]

#: none: the average is the new model (local SGD); nesterov: DiLoCo's outer step.
OUTER_OPTIMIZERS = ("none", "nesterov")


@dataclass
class Options:
    local_steps: int = 8
    """Local SGD: optimizer steps each worker takes on its own between two averages."""
    outer_optimizer: str = "none"
    """Local SGD: none (the average is the new model) or nesterov (DiLoCo's outer step)."""
    outer_lr: float = 0.7
    """Local SGD, nesterov: the outer learning rate (DiLoCo's 0.7)."""
    outer_momentum: float = 0.9
    """Local SGD, nesterov: the outer Nesterov momentum (DiLoCo's 0.9)."""

    HELP: ClassVar[dict[str, str]] = {
        "local_steps": "local SGD: optimizer steps each worker takes alone between averages",
        "outer_optimizer": "local SGD: none (the average is the new model) or nesterov "
        "(DiLoCo: outer Nesterov step on the averaged pseudo-gradient)",
        "outer_lr": "local SGD with --outer-optimizer nesterov: the outer learning rate",
        "outer_momentum": "local SGD with --outer-optimizer nesterov: the outer momentum, "
        "in [0, 1)",
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"outer_optimizer": OUTER_OPTIMIZERS}
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("outer_lr", "outer_momentum")
    AT_LEAST_ONE: ClassVar[tuple[str, ...]] = ("local_steps",)
    FINITE: ClassVar[tuple[str, ...]] = ("outer_lr", "outer_momentum")


def check(config: RunOptions) -> None:
    if config.outer_momentum >= 1:
        raise ConfigError(f"--outer-momentum must be in [0, 1) (got {config.outer_momentum})")
