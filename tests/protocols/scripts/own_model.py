"""A user's model class with a method and an attribute of its own, in a module of its own so
that a module saved whole (`torch.save(model)`) loads in another process (`ddp_own_model.py`
trains it; tests/protocols/ddp/test_own_model.py loads what it saved)."""

import torch
from torch import nn


class Net(nn.Module):
    """A BatchNorm MLP whose forward pass calls its own `init_hidden`, as a GRU script's does."""

    def __init__(self) -> None:
        super().__init__()
        self.width = 16  # an attribute of its own
        self.body = nn.Sequential(nn.Linear(4, self.width), nn.BatchNorm1d(self.width), nn.ReLU())
        self.head = nn.Linear(self.width, 2)

    def init_hidden(self, batch: int) -> torch.Tensor:
        return torch.full((batch, self.width), 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x) + self.init_hidden(len(x)))
