"""A float64 LSTM that learns sine waves with LBFGS, in the shape of PyTorch's
time_sequence_prediction example: plain PyTorch, no hetsync (with_hetsync.py is the same script
adapted).

Its shape: the whole training set in one batch, the model in float64 (`model.double()`), and
`optimizer.step(closure)` with a closure that zeroes the gradients, computes the loss and calls
backward (LBFGS evaluates it several times a step); after each step the held-out waves are
predicted, with some steps of the future beyond them. The waves are generated (shifted sines).

    python examples/strangers/sine_lbfgs/plain.py --small --out runs/sine

It writes OUT/result.json: the held-out waves' mean squared error after the last step.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn


class Sequence(nn.Module):
    """Two LSTM cells and a linear read-out, one time step at a time."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, inputs, future: int = 0):
        outputs = []
        h1 = c1 = h2 = c2 = torch.zeros(inputs.size(0), self.hidden, dtype=torch.double)
        for input_t in inputs.split(1, dim=1):
            h1, c1 = self.lstm1(input_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            output = self.linear(h2)
            outputs.append(output)
        for _ in range(future):  # go on from its own predictions
            h1, c1 = self.lstm1(output, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            output = self.linear(h2)
            outputs.append(output)
        return torch.cat(outputs, dim=1)


def sine_waves(count: int, length: int, period: float = 20.0) -> np.ndarray:
    """`count` sines of `length` samples, each shifted by a random offset."""
    rng = np.random.default_rng(2)
    x = np.arange(length) + rng.integers(-4 * period, 4 * period, count).reshape(count, 1)
    return np.sin(x / period).astype("float64")


def main() -> None:
    parser = argparse.ArgumentParser(description="sine waves with LBFGS")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--small", action="store_true", help="a few seconds: 3 short steps")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".", help="where result.json goes")
    args = parser.parse_args()
    max_iter = 20
    if args.small:
        args.steps, max_iter = 3, 6

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = torch.from_numpy(sine_waves(36, 60))
    train, test = data[4:], data[:4]
    inputs, target = train[:, :-1], train[:, 1:]
    test_input, test_target = test[:, :-1], test[:, 1:]

    seq = Sequence(args.hidden)
    seq.double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=max_iter)

    for i in range(args.steps):
        def closure():
            optimizer.zero_grad()
            loss = criterion(seq(inputs), target)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        with torch.no_grad():
            future = 20
            prediction = seq(test_input, future=future)
            test_loss = criterion(prediction[:, :-future], test_target).item()
        print(f"step {i}: train loss {loss.item():.6f}, test loss {test_loss:.6f}")

    result = {"metric": "test_mse", "value": test_loss, "higher_is_better": False,
              "train_loss": loss.item()}
    print(json.dumps(result))
    (out / "result.json").write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
