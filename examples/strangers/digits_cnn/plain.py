"""A small CNN on scikit-learn's 8x8 digits in the shape of PyTorch's mnist example and
torchvision's classification reference: plain PyTorch, no hetsync (with_hetsync.py is the same
script adapted).

Its shape: a DataLoader over the training images (shuffled, num_workers 0), SGD with Nesterov
momentum and two parameter groups (no weight decay on the BatchNorm and bias parameters, as
torchvision's `--norm-weight-decay 0`), label smoothing, a warm-up then cosine learning-rate
schedule stepped once an epoch (SequentialLR), an evaluation of accuracy on the test set after
every epoch, and the model's state_dict saved at the end.

    python examples/strangers/digits_cnn/plain.py --small --out runs/digits

It writes OUT/result.json: the test set's accuracy after the last epoch.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


def train_one_epoch(model, criterion, optimizer, loader, device) -> float:
    model.train()
    total = 0.0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


def test(model, loader, device) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in loader:
            output = model(images.to(device))
            correct += (output.argmax(1) == labels.to(device)).sum().item()
    return correct / len(loader.dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description="a CNN on the 8x8 digits")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--small", action="store_true", help="a few seconds: 3 epochs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=".", help="where model.pt and result.json go")
    args = parser.parse_args()
    if args.small:
        args.epochs = 3

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images, labels = load_digits(return_X_y=True)
    images = torch.tensor(images / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
    labels = torch.tensor(labels)
    train_set = TensorDataset(images[:1500], labels[:1500])
    test_set = TensorDataset(images[1500:], labels[1500:])
    train_loader = DataLoader(train_set, batch_size=args.batch_size, num_workers=0,
        shuffle=True)
    test_loader = DataLoader(test_set, batch_size=100)

    model = Net().to(device)
    no_decay = [p for name, p in model.named_parameters() if "bn" in name or "bias" in name]
    decay = [p for name, p in model.named_parameters() if not ("bn" in name or "bias" in name)]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, momentum=0.9, nesterov=True)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs - 1)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[1])
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    for epoch in range(args.epochs):
        train_loss = train_one_epoch(model, criterion, optimizer, train_loader, device)
        scheduler.step()
        accuracy = test(model, test_loader, device)
        print(f"epoch {epoch}: train loss {train_loss:.3f}, test accuracy {accuracy:.3f}")

    torch.save(model.state_dict(), out / "model.pt")
    result = {"metric": "test_accuracy", "value": accuracy, "higher_is_better": True,
              "train_loss": train_loss}
    print(json.dumps(result))
    (out / "result.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
