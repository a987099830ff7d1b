"""Your own training script, made data-parallel by hetsync: the lines marked `# hetsync`.

Three lines are added and three changed (the sampler, the loop header, `step(loss=...)`).
Run it on this machine with 4 workers, one of them 4x slow:

    hetsync launch --workers 4 --protocol allreduce --slowdown deterministic:ranks=3,factor=4 \
        --max-time 30 examples/own_script.py --epochs 20

or on several machines with torchrun (options from a TOML file):

    HETSYNC_CONFIG=run.toml torchrun --nnodes 2 --nproc-per-node 4 ... examples/own_script.py

Without a launcher it runs as a single ordinary process.
"""

import argparse

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hetsync  # hetsync (added)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()

    hetsync.init()  # hetsync (added): join the run: process group, options, slowdown
    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    dataset = TensorDataset(x, torch.tensor(y, dtype=torch.float32))
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))  # hetsync

    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = hetsync.prepare(model, optimizer)  # hetsync (added)
    loss_fn = nn.BCEWithLogitsLoss()

    for xb, yb in optimizer.iterate(loader, epochs=args.epochs):  # hetsync: stops together
        optimizer.zero_grad()
        loss = loss_fn(model(xb).squeeze(1), yb)
        loss.backward()
        optimizer.step(loss=loss)  # hetsync: `loss=` is optional; it is logged

    print(f"rank {torch.distributed.get_rank()}: {optimizer.iteration} iterations, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
