"""A stranger's script under --protocol ddp (run by hetsync launch): its own model class
(own_model.Net), what hetsync.prepare returns used as that model.

Each rank starts from its own random model (prepare's broadcast makes them rank 0's) and
trains on its own data, each batch in two forward passes before one backward pass. Between
steps, rank 0 alone validates in eval mode under no_grad; at iteration 4 every rank runs a
forward pass that records gradients and no backward pass, and rank 0 saves the model whole
(`torch.save(model)`) and evaluates the loaded copy. After close() every rank saves its model
whole. Writes OUT/model_rank{r}.pt (the module) and OUT/facts_rank{r}.pt (what it saw).
"""

import sys
from pathlib import Path

import torch
from own_model import Net

import hetsync

runtime = hetsync.init()
out = Path(sys.argv[1])
torch.manual_seed(runtime.rank)
model = Net()
prepared, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05,
                                                             momentum=0.9))
facts = {"same": prepared is model, "hidden": tuple(prepared.init_hidden(3).shape),
         "keys": list(prepared.state_dict())}
val = torch.randn(64, 4, generator=torch.Generator().manual_seed(7))


def evaluate(m: torch.nn.Module, x: torch.Tensor = val) -> torch.Tensor:
    m.eval()
    with torch.no_grad():
        output = m(x)
    m.train()
    return output


data = torch.Generator().manual_seed(1000 + runtime.rank)
while not optimizer.should_stop:
    x = torch.randn(16, 4, generator=data) + runtime.rank
    optimizer.zero_grad()
    loss = sum(prepared(half).square().mean() for half in x.chunk(2))
    loss.backward()
    optimizer.step(loss=loss)
    if runtime.rank == 0 and optimizer.iteration % 3 == 0:
        for batch in val.chunk(4):  # a validation pass the other rank does not run
            evaluate(prepared, batch)
    if optimizer.iteration == 4:
        prepared(x)  # an evaluation with gradients, no backward pass follows
        if runtime.rank == 0:
            torch.save(prepared, out / "mid_run.pt")
            loaded = torch.load(out / "mid_run.pt", weights_only=False)
            loaded.eval()  # a forward pass with gradients of a copy: not the run's
            facts["mid_run_loaded"] = torch.equal(loaded(val).detach(), evaluate(prepared))
optimizer.close()
facts["output"] = evaluate(prepared)
torch.save(prepared, out / f"model_rank{runtime.rank}.pt")
torch.save(facts, out / f"facts_rank{runtime.rank}.pt")
