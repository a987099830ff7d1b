"""Two plain processes (no launcher) train 3 Hop steps; rank 1 then closes, waiting for rank
0's end markers, and rank 0 dies without sending them: rank 1's receive threads fail."""

import os
import time

import torch
from torch import nn

import hetsync

runtime = hetsync.init(protocol="hop", hang_timeout=60.0, device="cpu")
model = nn.Linear(4, 3)
optimizer = hetsync.SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
if runtime.rank == 0:
    time.sleep(3.0)  # rank 1 waits in its close() by now
    os._exit(3)
optimizer.close()
