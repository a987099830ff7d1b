"""A fixed training job with two param groups and a StepLR schedule (run by hetsync launch).

Weights have weight decay, biases none; the schedule divides the learning rate by 10 every
3 iterations. Each rank draws its own fixed batches from a seeded generator, so two runs of
different protocols see the same data, and writes its final flat model to
OUT/final_rank{r}.pt for the test to compare ps sync with allreduce.
"""

import sys

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
inner = torch.optim.SGD([{"params": weights, "weight_decay": 0.1},
                         {"params": biases, "weight_decay": 0.0}], lr=0.5, momentum=0.9)
model, optimizer = hetsync.prepare(model, inner)
scheduler = torch.optim.lr_scheduler.StepLR(inner, step_size=3, gamma=0.1)
generator = torch.Generator().manual_seed(1000 + runtime.rank)
while not optimizer.should_stop:
    x = torch.randn(16, 6, generator=generator)
    y = torch.randint(0, 3, (16,), generator=generator)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step(loss=loss)
    scheduler.step()
optimizer.close()
final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
torch.save(final, f"{out}/final_rank{runtime.rank}.pt")
