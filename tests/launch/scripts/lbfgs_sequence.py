"""pytorch/examples' time_sequence_prediction, adapted in five lines (run by hetsync launch).

Argv: OUT. Two stacked LSTM cells in float64 learn to continue sine waves, each rank on its
own shard of the waves, with LBFGS, whose step(closure) evaluates the model several times a
step. Writes to OUT/lbfgs_rank{r}.pt the parameters it ended with, what each step() returned
(the closure's first loss) and the loss over every rank's waves before and after.
"""

import sys

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out = sys.argv[1]
waves = torch.sin((torch.arange(25) + torch.arange(-32, 32, 4).unsqueeze(1)) / 4.0).double()
mine = waves[runtime.rank::runtime.world_size]  # a shard per rank
x, y = mine[:, :-1], mine[:, 1:]


class Sequence(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        state1 = state2 = (sequence.new_zeros(len(sequence), self.hidden),) * 2
        outputs = []
        for value in sequence.split(1, dim=1):
            state1 = self.lstm1(value, state1)
            state2 = self.lstm2(state1[0], state2)
            outputs.append(self.linear(state2[0]))
        return torch.cat(outputs, dim=1)


def full_loss(m: nn.Module) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(m(waves[:, :-1]), waves[:, 1:]))


torch.manual_seed(runtime.rank)  # different models: rank 0's is every rank's start
model = Sequence().double()
model, optimizer = hetsync.prepare(model, torch.optim.LBFGS(model.parameters(), lr=0.8,
                                                            max_iter=6))
before = full_loss(model)
returned = []
while not optimizer.should_stop:
    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss
    returned.append(optimizer.step(closure).item())
optimizer.close()
torch.save({"params": [p.detach().clone() for p in model.parameters()], "returned": returned,
            "before": before, "after": full_loss(model)}, f"{out}/lbfgs_rank{runtime.rank}.pt")
