"""DDP with a model of several gradient buckets (run by hetsync launch --protocol ddp): rank 1
alone asks to stop in its fifth iteration, so only the vote reduced with the buckets can stop
rank 0. Each rank writes its iterations and its buckets' sizes to OUT/ddp_rank{r}.json."""

import json
import sys

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out = sys.argv[1]
torch.manual_seed(0)
# 36 MB in one weight: past DDP's 25 MB bucket cap, so at least two buckets
model = nn.Sequential(nn.Linear(16, 3000), nn.ReLU(), nn.Linear(3000, 3000), nn.ReLU(),
                      nn.Linear(3000, 2))
model, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
generator = torch.Generator().manual_seed(runtime.rank)
while not optimizer.should_stop:
    optimizer.zero_grad()
    model(torch.randn(8, 16, generator=generator)).square().mean().backward()
    if runtime.rank == 1 and optimizer.iteration == 4:
        optimizer.request_stop()
    optimizer.step()
optimizer.close()
sizes = optimizer.protocol.ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]  # the driver's
with open(f"{out}/ddp_rank{runtime.rank}.json", "w") as f:
    json.dump({"iterations": optimizer.iteration, "buckets": len(sizes.split(","))}, f)
