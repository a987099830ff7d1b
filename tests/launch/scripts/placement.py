"""A worker (run by hetsync launch) that writes down where the kernel runs it, to test
`--pin` and `--slowdown cpu:` from inside the workers.

`OUT/rank{R}.start.json` at once: the cores it may run on and its cgroups; `rank{R}.training.json`
after its first step: its cgroups then (a `cpu:` straggler joins its quota as training
starts). It trains a small model with real compute per step (no emulated step time), and at
the end writes `OUT/rank{R}.json`: its iterations, and the CPU time it got over the wall time
it trained.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import hetsync

out = Path(sys.argv[1])
rank = int(os.environ["RANK"])
facts = {"cores": sorted(os.sched_getaffinity(0)),
         "cgroups": Path("/proc/self/cgroup").read_text().splitlines()}
(out / f"rank{rank}.start.json").write_text(json.dumps(facts))
hetsync.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = hetsync.SyncOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), model)
x = torch.randn(256, 256)
wall, cpu = time.monotonic(), time.process_time()
while not optimizer.should_stop:
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    if optimizer.iteration == 1:
        cgroups = Path("/proc/self/cgroup").read_text().splitlines()
        (out / f"rank{rank}.training.json").write_text(json.dumps({"cgroups": cgroups}))
facts["iterations"] = optimizer.iteration
facts["cpu_fraction"] = (time.process_time() - cpu) / (time.monotonic() - wall)
optimizer.close()
(out / f"rank{rank}.json").write_text(json.dumps(facts))
