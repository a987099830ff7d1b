"""What a forward pass of the user's model costs under `--protocol ddp` (issue 51).

`prepare` returns the user's own module; the driver runs DDP's forward bookkeeping from hooks
(hetsync/protocols/ddp/driver.py). In a world of one (this process, gloo), on a model of
MODULES modules with almost no compute, so that the per-call costs show, each round times:
`alone`, the module with no hook; `ddp-forward`, a second copy through a
`DistributedDataParallel` wrapper's own forward (what `prepare` returned before);
`global-hooks`, the module alone with a no-op forward pre-hook and hook common to all modules
registered (torch then takes its slower path for every submodule's call: what hooks left
registered through the pass would cost); `hetsync`, the module `prepare` returned, through
the driver's hooks (the round's `prepare`, closed at its end, is a fresh one each round, so
that no hook of it is registered while the others are timed).

    .venv/bin/python experiments/ddp_forward_cost.py [--modules 60] [--passes 2000] [--rounds 7]

Prints each way's least time per pass over the rounds (microseconds); writes nothing. About
30 s on this 2-core VM.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel

import hetsync


def _model(modules: int) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), *[nn.ReLU() for _ in range(modules - 1)])


def _per_pass_us(call: Callable[[torch.Tensor], torch.Tensor], passes: int) -> float:
    x = torch.randn(2, 8)
    began = time.perf_counter()
    for _ in range(passes):
        call(x)
    return (time.perf_counter() - began) / passes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=60)
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hetsync.init(protocol="ddp", device="cpu")
    alone, wrapped = _model(args.modules), DistributedDataParallel(_model(args.modules))
    times: dict[str, list[float]] = {"alone": [], "ddp-forward": [], "global-hooks": [],
                                     "hetsync": []}
    for _ in range(args.rounds):
        times["alone"].append(_per_pass_us(alone, args.passes))
        times["ddp-forward"].append(_per_pass_us(wrapped, args.passes))
        hooks = [register_module_forward_pre_hook(lambda module, inputs: None),
                 register_module_forward_hook(lambda module, inputs, output: None)]
        times["global-hooks"].append(_per_pass_us(alone, args.passes))
        for hook in hooks:
            hook.remove()
        model = _model(args.modules)
        prepared, optimizer = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
        times["hetsync"].append(_per_pass_us(prepared, args.passes))
        optimizer.close()
    hetsync.shutdown()
    print(f"{args.modules} modules, least us per forward pass over {args.rounds} rounds of "
          f"{args.passes}: " + ", ".join(f"{k} {min(v):.0f}" for k, v in times.items()))


if __name__ == "__main__":
    main()
