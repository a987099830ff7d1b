"""A worker that prints a lot (run by hetsync launch), to test how its output is shown.

Each rank prints LINES lines to stdout and as many to stderr before it joins the run (far
more than a pipe holds), then a line per iteration of a tiny training loop, and `bye`
without a newline. With a second argument `crash`, rank 1 fails before `hetsync.init()`,
so that no traceback reaches its logs/rank1.log.
"""

import os
import sys

import torch
from torch import nn

import hetsync

rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(f"hello from rank {rank} line {i} " + "x" * 80)
    print(f"warning from rank {rank} line {i}", file=sys.stderr)
if sys.argv[2:] == ["crash"] and rank == 1:
    raise RuntimeError("rank 1 could not start")
hetsync.init()
model = nn.Linear(4, 1)
optimizer = hetsync.SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
while not optimizer.should_stop:
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    print(f"hello from rank {rank} iteration {optimizer.iteration}")
optimizer.close()
print("bye", end="")
