"""A BatchNorm model whose batches have a different mean on every rank (run by hetsync launch).

Rank r's inputs have mean 2r, so running statistics kept locally differ by rank, while shared
ones follow all ranks' batches. A second BatchNorm outside the model sees the same inputs and
keeps its statistics local, for comparison. Each rank writes both running means to
OUT/running_mean_rank{r}.pt.
"""

import sys

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=0.03), nn.Linear(4, 2))
local = nn.BatchNorm1d(4, momentum=0.03)
model, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
generator = torch.Generator().manual_seed(1000 + runtime.rank)
while not optimizer.should_stop:
    x = torch.randn(16, 4, generator=generator) + 2.0 * runtime.rank
    with torch.no_grad():
        local(model[0](x))
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step(loss=loss)
optimizer.close()
torch.save({"shared": model[1].running_mean, "local": local.running_mean},
           f"{out}/running_mean_rank{runtime.rank}.pt")
