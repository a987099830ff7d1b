"""The smallest script a stranger writes: a plain `for` loop of `step()` calls that never reads
`optimizer.should_stop` and calls nothing of hetsync at its end (no `close()`).

Arguments: OUT STEPS (`forever`: loop until the run stops it). After each step every rank
writes its iteration to OUT/last_rank{r}.txt (what a script writes as it goes must survive its
run's end); after the loop it writes OUT/after_rank{r}.txt.
"""

import itertools
import sys
from pathlib import Path

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out = Path(sys.argv[1])
steps = itertools.count() if sys.argv[2] == "forever" else range(int(sys.argv[2]))
torch.manual_seed(runtime.rank)
net = nn.Linear(8, 1)
model, optimizer = hetsync.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
for i in steps:
    x = torch.randn(16, 8)
    optimizer.zero_grad()
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    optimizer.step()
    (out / f"last_rank{runtime.rank}.txt").write_text(str(i + 1))
(out / f"after_rank{runtime.rank}.txt").write_text("the loop ended")
