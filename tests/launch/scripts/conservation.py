"""Averaging with the learning rate at zero, from different models (run by hetsync launch).

Every rank sets its parameters to its own values after the optimizer was built (which
broadcast rank 0's model), trains with lr = 0 and writes its final flat model to
OUT/final_rank{r}.pt, with its initial one, for the test to check conservation and consensus.
With the argument `late`, even ranks (AD-PSGD's passive side) set theirs a moment later, as
a slow checkpoint load would: an average served before the model is set would be
overwritten, and the sum broken. With `steps=K` the loop ends by itself after K iterations,
as a script's epochs do, without the run's stop conditions.
"""

import sys
import time

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out = sys.argv[1]
model = nn.Linear(4, 3)
optimizer = hetsync.SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model)
generator = torch.Generator().manual_seed(100 + runtime.rank)
options = sys.argv[2:]
steps = next((int(o.split("=")[1]) for o in options if o.startswith("steps=")), None)
if "late" in options and runtime.rank % 2 == 0:
    time.sleep(0.5)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=generator) * (1 + runtime.rank))
initial = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
while not optimizer.should_stop and optimizer.iteration != steps:
    optimizer.zero_grad()
    model(torch.zeros(2, 4)).sum().backward()
    optimizer.step()
optimizer.close()
final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
torch.save({"initial": initial, "final": final}, f"{out}/final_rank{runtime.rank}.pt")
