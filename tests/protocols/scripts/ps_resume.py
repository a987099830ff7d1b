"""A parameter-server run that checkpoints, then one resumed from it (run by hetsync launch).

`OUT save`: rank r saves its model and optimizer state after iteration 4 + 4r (so each
worker's checkpoint is a different version of the model) to OUT/ckpt_rank{r}.pt.
`OUT resume`: each rank loads its checkpoint, writes its model and floating buffers as they
are after the load, flat, to OUT/loaded_rank{r}.pt, and trains on to the run's stop.
"""

import sys

import torch
from torch import nn

import hetsync
from hetsync.transport.flat import flatten

runtime = hetsync.init()
out, phase = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
model, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
checkpoint = f"{out}/ckpt_rank{runtime.rank}.pt"
if phase == "resume":
    saved = torch.load(checkpoint, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    torch.save(flatten([*model.parameters(), *buffers]), f"{out}/loaded_rank{runtime.rank}.pt")
generator = torch.Generator().manual_seed(1000 + runtime.rank)
while not optimizer.should_stop:
    x = torch.randn(16, 4, generator=generator) + runtime.rank
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step(loss=loss)
    if phase == "save" and optimizer.iteration == 4 + 4 * runtime.rank:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   checkpoint)
optimizer.close()
