"""The models of the built-in workloads, sized for CPU runs of 4-16 workers."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["DigitsCNN", "LeNet", "LinearSVM", "WideMLP", "narrow_resnet18"]


class LeNet(nn.Module):
    """LeNet-5 for 28x28 grey images (62k parameters)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class DigitsCNN(nn.Module):
    """A two-layer CNN for 8x8 digits (7k parameters): milliseconds per step."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class LinearSVM(nn.Module):
    """A linear classifier w.x + b over flattened inputs; trained with the hinge loss."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1)).squeeze(1)


class WideMLP(nn.Module):
    """Two wide hidden layers over flattened 28x28 images: 11.4M parameters (45 MB, a
    full-width ResNet-18's message) for a step of tens of milliseconds on one core, where the
    ResNet's takes seconds: a real payload that a small machine can train."""

    def __init__(self, hidden: int = 3000, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def narrow_resnet18(width: int = 8, in_channels: int = 1, classes: int = 10) -> nn.Module:
    """ResNet-18 (CIFAR stem, 2-2-2-2 basic blocks) with `width` channels in its first stage."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for stage in range(4):
        cout = width * 2**stage
        for block in range(2):
            layers.append(_BasicBlock(cin, cout, 2 if stage and block == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)
