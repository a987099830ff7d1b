"""The training script of examples/own_script.py as it was before hetsync: plain PyTorch.

`diff examples/plain_script.py examples/own_script.py` shows what hetsync asks of a script
(tests/examples/test_own_script.py counts it for the README).
"""

import argparse

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = load_breast_cancer(return_X_y=True)
    x = torch.tensor((x - x.mean(0)) / x.std(0), dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32)
    dataset, held_out = TensorDataset(x[:469], y[:469]), (x[469:].to(device), y[469:].to(device))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)

    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()

    def evaluate(m: nn.Module) -> dict[str, float]:
        logits = m(held_out[0]).squeeze(1)
        accuracy = ((logits > 0).float() == held_out[1]).float().mean()
        return {"loss": float(loss_fn(logits, held_out[1])), "accuracy": float(accuracy)}

    for _epoch in range(args.epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()

    model.eval()
    with torch.no_grad():
        print(f"held-out {evaluate(model)}")


if __name__ == "__main__":
    main()
