"""A user's bf16 or fp16 model trained through hetsync.prepare (run by hetsync launch).

Argv: OUT, the dtype's name. Trains a small BatchNorm MLP on scikit-learn's digits held in that
dtype, then writes to OUT/lp_rank{r}.pt the dtypes its parameters ended in and its loss on all
the data before and after, for the test to check that headers do not round and it trains.
"""

import sys

import torch
from sklearn.datasets import load_digits
from torch import nn

import hetsync

runtime = hetsync.init()
out, dtype = sys.argv[1], getattr(torch, sys.argv[2])
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=dtype), torch.tensor(y)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
model = model.to(dtype)


def full_loss(m: nn.Module) -> float:
    with torch.no_grad():
        return float(nn.functional.cross_entropy(m(x).float(), y))


before = full_loss(model)
model, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
generator = torch.Generator().manual_seed(runtime.rank)
while not optimizer.should_stop:
    batch = torch.randint(0, len(y), (16,), generator=generator)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x[batch]).float(), y[batch])
    loss.backward()
    optimizer.step(loss=loss)
optimizer.close()
torch.save({"dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "before": before, "after": full_loss(model)}, f"{out}/lp_rank{runtime.rank}.pt")
