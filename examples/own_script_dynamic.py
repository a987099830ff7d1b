"""examples/own_script.py with one import line changed: `hetsync.data.DynamicSampler` in place
of `DistributedSampler`, so that each epoch is dealt out as the workers ask and a faster worker
takes more of it (docs/protocols.md, "Epochs"). Under a protocol whose workers stop alone
(adpsgd, hop, prague) 10 epochs beside one 4x slow worker end near the others' pace:

    hetsync launch --workers 4 --protocol adpsgd --step-time 50 \
        --slowdown deterministic:ranks=3,factor=4 examples/own_script_dynamic.py --epochs 10

Under a lock-step one (allreduce, ddp, dpsgd, ps sync, localsgd) each worker gets
DistributedSampler's equal share, as before.
"""

import argparse

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hetsync  # hetsync (added)
from hetsync.data import DynamicSampler as DistributedSampler  # hetsync (added)


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
