"""A script that joins the run but trains with its own optimizer: `hetsync.prepare` is never
called, so nothing synchronises."""

import torch
from torch import nn

import hetsync

hetsync.init()
net = nn.Linear(4, 1)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    net(torch.randn(8, 4)).sum().backward()
    optimizer.step()
