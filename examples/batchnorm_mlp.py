"""A user script with BatchNorm: an MLP on scikit-learn's digits, made data-parallel by hetsync.

The lines marked `# hetsync` are hetsync's. The held-out split is evaluated in `model.eval()`
mode, which uses BatchNorm's running statistics (buffers, not parameters): a protocol that
loses or never synchronises them shows it as a poor validation accuracy. The script also has
what many scripts have: per-group settings (no weight decay on BatchNorm and biases) and a
learning-rate schedule.

    hetsync launch --workers 4 --protocol dpsgd examples/batchnorm_mlp.py --epochs 30

Without a launcher it runs as a single ordinary process.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hetsync  # hetsync


def digits(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Digits (1797 8x8 images), pixels scaled to [0, 1]; a fixed 20% held out."""
    x, y = load_digits(return_X_y=True)
    order = np.random.RandomState(seed).permutation(len(x))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.long)
    cut = int(0.8 * len(x))
    return TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on the linear weights only (matrices), not on BatchNorm or biases."""
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model: nn.Module, data: TensorDataset) -> dict[str, float]:
    """Held-out loss and accuracy in eval mode (BatchNorm's running statistics)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in data.tensors)
    logits = model(x)
    model.train(was_training)
    return {
        "loss": nn.functional.cross_entropy(logits, y).item(),
        "accuracy": (logits.argmax(1) == y).float().mean().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    runtime = hetsync.init()  # hetsync: join the run
    train, held_out = digits()
    sampler = DistributedSampler(train, seed=args.seed)  # hetsync: this worker's shard
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)  # the same model on every rank
    net = build_model(args.hidden).to(runtime.device)  # hetsync: this worker's device
    optimizer = torch.optim.SGD(
        param_groups(net, args.weight_decay), lr=args.lr, momentum=args.momentum
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs * len(loader))
    model, optimizer = hetsync.prepare(  # hetsync: rank 0 evaluates the consensus model
        net, optimizer, evaluate=lambda m: evaluate(m, held_out)  # during the run: summary.json
    )

    for xb, yb in optimizer.iterate(loader, epochs=args.epochs):  # hetsync: stops together
        xb, yb = xb.to(runtime.device), yb.to(runtime.device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step(loss=loss)  # hetsync
        schedule.step()

    final = optimizer.consensus_model()  # hetsync: every rank; the average of all workers' models
    report(runtime, optimizer.iteration, evaluate(final, held_out))


def report(runtime: hetsync.Runtime, iterations: int, result: dict[str, float]) -> None:
    """Rank 0 prints the held-out figures and writes them to RUN_DIR/user_result.json."""
    if runtime.rank != 0:
        return
    row = {"val_loss": result["loss"], "val_accuracy": result["accuracy"],
           "iterations": iterations}
    print(json.dumps(row))
    if runtime.run_dir is not None:
        (runtime.run_dir / "user_result.json").write_text(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
