"""A BatchNorm model on a given device, trained through hetsync.prepare (run by hetsync launch).

Arguments: OUT DEVICE LR. DEVICE is `runtime` (hetsync.init().device, what the run placed this
worker on), `cuda` (the GPUs shared round-robin by local rank, as placement does when workers
outnumber GPUs) or any torch device. LR 0: every rank sets its parameters to its own values
after the optimizer was built, so that only the protocol's averaging moves them; LR > 0: all
ranks train from the same model. Rank r's inputs have mean 2r, so its BatchNorm statistics are
its own unless the protocol shares them. Writes OUT/device_rank{r}.pt (every tensor on the CPU)
with the flat parameters before and after, the running statistics, the consensus model's and
the devices the model and the consensus model ended on, and whether CUDA was started.
"""

import sys

import torch
from torch import nn

import hetsync

runtime = hetsync.init()
out, where, lr = sys.argv[1], sys.argv[2], float(sys.argv[3])
device = runtime.device if where == "runtime" else torch.device(where)
if device.type == "cuda" and device.index is None:
    device = torch.device("cuda", runtime.local_rank % torch.cuda.device_count())
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(device)
model, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=lr))
if lr == 0:
    generator = torch.Generator().manual_seed(100 + runtime.rank)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * (1 + runtime.rank))


def flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in m.parameters()])


initial = flat(model)
data = torch.Generator().manual_seed(1000 + runtime.rank)
while not optimizer.should_stop:
    x = (torch.randn(16, 4, generator=data) + 2.0 * runtime.rank).to(device)
    optimizer.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step(loss=loss)
optimizer.close()
consensus = optimizer.consensus_model()
torch.save({
    "initial": initial, "final": flat(model), "consensus": flat(consensus),
    "running_mean": model[1].running_mean.cpu(), "running_var": model[1].running_var.cpu(),
    "consensus_running_mean": consensus[1].running_mean.cpu(),
    "device": str(next(model.parameters()).device),
    "cuda_initialized": torch.cuda.is_initialized(),  # a CPU model's run must not start CUDA
    "consensus_devices": sorted({str(t.device) for t in [*consensus.parameters(),
                                                          *consensus.buffers()]}),
}, f"{out}/device_rank{runtime.rank}.pt")
