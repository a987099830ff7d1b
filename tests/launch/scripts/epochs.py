"""A script whose loop ends by itself, as most do: `optimizer.iterate(batches, epochs=E)`.

Arguments: OUT EPOCHS BATCHES [uneven]. Every rank sets its parameters to its own values after
the optimizer was built, trains with lr = 0 on BATCHES batches an epoch (with `uneven`, rank r
has BATCHES + r: shards of different sizes, so workers run out of data at different
iterations) and writes its initial and final flat models to OUT/final_rank{r}.pt, for the
test to check that the run ends and that the sum of the models is conserved.
"""

import sys

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out, epochs, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if "uneven" in sys.argv[4:]:
    batches += runtime.rank
net = nn.Linear(4, 3)
model, optimizer = hetsync.prepare(net, torch.optim.SGD(net.parameters(), lr=0.0))
generator = torch.Generator().manual_seed(100 + runtime.rank)
with torch.no_grad():
    for p in net.parameters():
        p.copy_(torch.randn(p.shape, generator=generator) * (1 + runtime.rank))
initial = torch.cat([p.detach().reshape(-1).clone() for p in net.parameters()])
for x in optimizer.iterate([torch.zeros(2, 4)] * batches, epochs=epochs):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
final = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
torch.save({"initial": initial, "final": final, "iteration": optimizer.iteration},
           f"{out}/final_rank{runtime.rank}.pt")
