"""A user's BatchNorm model trained through hetsync.prepare (run by hetsync launch/torchrun).

Trains a BatchNorm MLP on scikit-learn's digits with an evaluation function, then writes to
OUT/bn_rank{r}.pt this worker's running statistics and the consensus model's, for the test to
check that every protocol moves the statistics and keeps the workers' consistent, and whether
prepare returned the script's own model.
"""

import sys

import torch
from sklearn.datasets import load_digits
from torch import nn

import hetsync

runtime = hetsync.init()
out = sys.argv[1]
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
train_x, train_y, val_x, val_y = x[:1400], y[:1400], x[1400:], y[1400:]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def evaluate(m: nn.Module) -> dict[str, float]:
    output = m(val_x)
    accuracy = (output.argmax(1) == val_y).float().mean()
    return {"loss": float(nn.functional.cross_entropy(output, val_y)), "accuracy": float(accuracy)}


users_model = model
model, optimizer = hetsync.prepare(
    model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), evaluate=evaluate
)
generator = torch.Generator().manual_seed(runtime.rank)
while not optimizer.should_stop:
    batch = torch.randint(0, len(train_y), (32,), generator=generator)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
    loss.backward()
    optimizer.step(loss=loss)
optimizer.close()
bn = dict(model.named_buffers())
consensus = dict(optimizer.consensus_model().named_buffers())
torch.save({"local": bn["1.running_mean"].clone(), "consensus": consensus["1.running_mean"],
            "prepared_is_model": model is users_model}, f"{out}/bn_rank{runtime.rank}.pt")
