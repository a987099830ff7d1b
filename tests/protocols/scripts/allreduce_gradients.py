"""All-Reduce's gradients, step by step (run by hetsync launch with --protocol allreduce).

Each rank trains a small model with a BatchNorm (a buffer in the reduction) and a layer only
rank 0 uses (its gradient is None on the others), and records per step: its own gradients
before the step, the reduced ones after it, whether they are then one buffer
(`hetsync.transport.contiguous.span`), and what `optimizer.zero_grad()` leaves: None (torch's
default), except at step 3, where `set_to_none=False` zeroes them where they are and the
next backward pass accumulates into them. Writes OUT/grads_rank{r}.pt.
"""

import sys

import torch
from torch import nn

import hetsync
from hetsync.transport.contiguous import span

runtime = hetsync.init()
out = sys.argv[1]
torch.manual_seed(0)
model = nn.ModuleDict({"body": nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)),
                       "rank0": nn.Linear(2, 2)})
model, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05,
                                                          momentum=0.9))
generator = torch.Generator().manual_seed(1000 + runtime.rank)
params = list(model.parameters())
record = []
while not optimizer.should_stop:
    x = torch.randn(16, 4, generator=generator) + runtime.rank
    y = model["body"](x)
    if runtime.rank == 0:
        y = model["rank0"](y)
    y.square().mean().backward()
    local = [None if p.grad is None else p.grad.clone() for p in params]
    optimizer.step()
    reduced = [p.grad.clone() for p in params]
    one_buffer = span([p.grad for p in params]) is not None
    addresses = [p.grad.data_ptr() for p in params]
    kept = len(record) == 2
    optimizer.zero_grad(set_to_none=not kept)
    cleared = [None if p.grad is None else p.grad.clone() for p in params]
    if kept:
        kept = [p.grad.data_ptr() for p in params] == addresses
    record.append({"local": local, "reduced": reduced, "one_buffer": one_buffer,
                   "cleared": cleared, "kept": kept})
optimizer.close()
torch.save(record, f"{out}/grads_rank{runtime.rank}.pt")
