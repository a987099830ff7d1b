"""Your own training script, made data-parallel by hetsync: the lines marked `# hetsync`.

Against the same script in plain PyTorch (examples/plain_script.py), 4 lines are added,
5 changed and 1 removed (the README shows them). Run it on this machine with 4 workers, one
of them 4x slow, each iteration paced to 50 ms of emulated compute so that the slow worker
shows:

    hetsync launch --workers 4 --protocol allreduce --step-time 50 \
        --slowdown deterministic:ranks=3,factor=4 examples/own_script.py --epochs 20

or on several machines with torchrun (options from a TOML file):

    HETSYNC_CONFIG=run.toml torchrun --nnodes 2 --nproc-per-node 4 ... examples/own_script.py

Without a launcher it runs as a single ordinary process.
"""

import argparse

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler  # hetsync (added)

import hetsync  # hetsync (added)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()

    device = hetsync.init().device  # hetsync (changed): join the run; this worker's device
    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32)
    dataset, held_out = TensorDataset(x[:469], y[:469]), (x[469:].to(device), y[469:].to(device))
    sampler = DistributedSampler(dataset)  # hetsync (added): each worker its own share
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)  # hetsync (changed)

    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()

    def evaluate(m: nn.Module) -> dict[str, float]:
        logits = m(held_out[0]).squeeze(1)
        accuracy = ((logits > 0).float() == held_out[1]).float().mean()
        return {"loss": float(loss_fn(logits, held_out[1])), "accuracy": float(accuracy)}

    model, optimizer = hetsync.prepare(model, optimizer, evaluate=evaluate)  # hetsync (added)
    for xb, yb in optimizer.iterate(loader, epochs=args.epochs):  # hetsync (changed): stop together
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(xb).squeeze(1), yb)
        loss.backward()
        optimizer.step(loss=loss)  # hetsync (changed): `loss=` is optional; it is logged

    model = optimizer.consensus_model().eval()  # hetsync (changed): all workers' average
    with torch.no_grad():
        print(f"held-out {evaluate(model)}")


if __name__ == "__main__":
    main()
