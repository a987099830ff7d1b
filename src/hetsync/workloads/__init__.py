"""Built-in workloads: a real dataset, a model, a loss and default hyper-parameters.

A workload is found by name (`get_workload("cnn")`); adding one is one `register_workload`
call. Defaults were chosen so that All-Reduce with 8 workers and `--step-time 50` reaches the
`target_loss` within a minute or two on a 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from hetsync.errors import ConfigError
from hetsync.workloads.datasets import DataSplit, load_digits, load_fashion_mnist
from hetsync.workloads.models import DigitsCNN, LeNet, LinearSVM, WideMLP, narrow_resnet18
from hetsync.workloads.sharding import Shard

__all__ = [
    "DataSplit",
    "Shard",
    "Workload",
    "available_workloads",
    "get_workload",
    "register_workload",
]


@dataclass(frozen=True)
class Workload:
    """Everything a worker needs to train and evaluate one task."""

    name: str
    description: str
    load: Callable[[Path | None], DataSplit]
    build_model: Callable[[], nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    correct: Callable[[torch.Tensor, torch.Tensor], int]
    batch_size: int
    lr: float
    momentum: float
    target_loss: float


_WORKLOADS: dict[str, Workload] = {}


def register_workload(workload: Workload) -> Workload:
    """Make `workload` available by its name."""
    _WORKLOADS[workload.name] = workload
    return workload


def available_workloads() -> list[str]:
    return sorted(_WORKLOADS)


def get_workload(name: str) -> Workload:
    """Return the workload called `name`; the error lists the known ones."""
    try:
        return _WORKLOADS[name]
    except KeyError:
        known = ", ".join(available_workloads())
        raise ConfigError(f"unknown workload {name!r} (known: {known})") from None


def _argmax_correct(output: torch.Tensor, target: torch.Tensor) -> int:
    return int((output.argmax(1) == target).sum())


# --- the linear SVM: two groups of Fashion-MNIST classes, labels in {-1, +1} -----------------

#: T-shirt/top, pullover, coat, shirt: garments for the upper body, against everything else.
SVM_POSITIVE_CLASSES = (0, 2, 4, 6)
SVM_L2 = 1e-4


def _load_svm(data_dir: Path | None) -> DataSplit:
    split = load_fashion_mnist(data_dir)
    positive = torch.tensor(SVM_POSITIVE_CLASSES)

    def signs(y: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isin(y, positive), 1, -1)

    return DataSplit(
        train_x=split.train_x.flatten(1),
        train_y=signs(split.train_y),
        test_x=split.test_x.flatten(1),
        test_y=signs(split.test_y),
    )


def _hinge_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean hinge loss; the L2 term enters through the weight's gradient hook
    (`_RegularisedSVM`), so the logged loss is the hinge part that targets refer to."""
    return torch.clamp(1 - target.to(output.dtype) * output, min=0).mean()


def _sign_correct(output: torch.Tensor, target: torch.Tensor) -> int:
    return int((torch.where(output >= 0, 1, -1) == target).sum())


class _RegularisedSVM(LinearSVM):
    """LinearSVM whose training loss includes (lambda/2)||w||^2 through a gradient hook."""

    def __init__(self) -> None:
        super().__init__(28 * 28)
        self.linear.weight.register_hook(lambda g: g + SVM_L2 * self.linear.weight.detach())


def _pad_to_32(load: Callable[[Path | None], DataSplit]) -> Callable[[Path | None], DataSplit]:
    def padded(data_dir: Path | None) -> DataSplit:
        split = load(data_dir)
        low = float(split.train_x.min())
        return DataSplit(
            train_x=F.pad(split.train_x, (2, 2, 2, 2), value=low),
            train_y=split.train_y,
            test_x=F.pad(split.test_x, (2, 2, 2, 2), value=low),
            test_y=split.test_y,
        )

    return padded


register_workload(
    Workload(
        name="cnn",
        description="LeNet-5 on Fashion-MNIST (60k train / 10k test images)",
        load=load_fashion_mnist,
        build_model=LeNet,
        loss=F.cross_entropy,
        correct=_argmax_correct,
        batch_size=32,
        lr=0.02,
        momentum=0.9,
        target_loss=0.4,
    )
)
register_workload(
    Workload(
        name="svm",
        description="linear SVM (hinge loss, L2) on Fashion-MNIST: upper-body garments vs rest",
        load=_load_svm,
        build_model=_RegularisedSVM,
        loss=_hinge_loss,
        correct=_sign_correct,
        batch_size=64,
        lr=0.003,
        momentum=0.9,
        target_loss=0.13,
    )
)
register_workload(
    Workload(
        name="resnet",
        description="ResNet-18 of width 8 on Fashion-MNIST padded to 32x32",
        load=_pad_to_32(load_fashion_mnist),
        build_model=narrow_resnet18,
        loss=F.cross_entropy,
        correct=_argmax_correct,
        batch_size=32,
        lr=0.05,
        momentum=0.9,
        target_loss=0.4,
    )
)
register_workload(
    Workload(
        name="resnet-wide",
        description="full-width ResNet-18 (width 64, 11M parameters) on Fashion-MNIST padded "
        "to 32x32: enough compute per step to keep a GPU busy",
        load=_pad_to_32(load_fashion_mnist),
        build_model=lambda: narrow_resnet18(width=64),
        loss=F.cross_entropy,
        correct=_argmax_correct,
        batch_size=128,
        lr=0.05,
        momentum=0.9,
        target_loss=0.4,
    )
)
register_workload(
    Workload(
        name="mlp-wide",
        description="MLP with two hidden layers of 3000 (11.4M parameters, 45 MB a message, as "
        "a full-width ResNet-18) on Fashion-MNIST: a real payload for tens of ms of CPU a step",
        load=load_fashion_mnist,
        build_model=WideMLP,
        loss=F.cross_entropy,
        correct=_argmax_correct,
        batch_size=32,
        lr=0.02,
        momentum=0.9,
        target_loss=0.4,
    )
)
register_workload(
    Workload(
        name="digits",
        description="small CNN on scikit-learn's 8x8 digits (1497 train / 300 test images)",
        load=load_digits,
        build_model=DigitsCNN,
        loss=F.cross_entropy,
        correct=_argmax_correct,
        batch_size=16,
        lr=0.05,
        momentum=0.9,
        target_loss=0.3,
    )
)
