"""The bare loop of plain.py made data-parallel by hetsync: the lines marked `# hetsync` are
the only changes (tests/examples/test_own_script.py counts them).

The loop is untouched: it never reads `should_stop`, never calls `close()` or anything else of
hetsync after it, and the process simply exits; each worker evaluates its own model and
writes OUT/rank{r}/result.json.

    hetsync launch --workers 2 --protocol ps --ps-mode async \\
        examples/strangers/bare_loop/with_hetsync.py --small --out runs/bare
"""

import argparse
import json
from pathlib import Path

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hetsync  # hetsync (added)


def main() -> None:
    parser = argparse.ArgumentParser(description="an MLP on the breast-cancer table")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--small", action="store_true", help="a few seconds: 5 epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".", help="where result.json goes")
    args = parser.parse_args()
    epochs = 5 if args.small else args.epochs

    hetsync.init()  # hetsync (added): join the run
    torch.manual_seed(args.seed)
    out = Path(args.out) / f"rank{torch.distributed.get_rank()}"  # hetsync (changed)
    out.mkdir(parents=True, exist_ok=True)
    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32)
    train = TensorDataset(x[:469], y[:469])
    loader = DataLoader(train, batch_size=16,
                        sampler=torch.utils.data.DistributedSampler(train))  # hetsync (changed)

    model = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    model, optimizer = hetsync.prepare(model, optimizer)  # hetsync (added)

    for epoch in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: last batch loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad():
        accuracy = ((model(x[469:]).squeeze(1) > 0).float() == y[469:]).float().mean().item()
    result = {"metric": "test_accuracy", "value": accuracy, "higher_is_better": True}
    print(json.dumps(result))
    (out / "result.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
