"""Rank 0 spends SECONDS in its own code between two steps (run by hetsync launch).

As a script's validation pass does: after step 3, rank 0 computes in plain Python, with no
heartbeat, for SECONDS (argv[1]) while its peers wait for its next update in gloo or in
their protocol. The run then goes on for STEPS (argv[2]) steps in all and ends.
"""

import sys
import time

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
seconds, steps = float(sys.argv[1]), int(sys.argv[2])
model = nn.Linear(4, 3)
optimizer = hetsync.SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
while not optimizer.should_stop and optimizer.iteration < steps:
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    if optimizer.iteration == 3 and runtime.rank == 0:
        deadline, total = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:  # busy: the training thread on a core throughout
            total += sum(range(1000))
optimizer.close()
