"""PyTorch's own DistributedDataParallel, the reference users know.

DDP all-reduces gradient buckets during backward(). A communication hook replaces its default
one to do the same arithmetic (divide by the world size, then sum) while adding what hetsync
needs: the emulated compute time and slowdown are slept before the first bucket is reduced,
the time until the reduction completes is counted as synchronisation, and the stop vote rides
in one extra element of the iteration's last bucket (the same on every rank): only that bucket
is copied to make room, every other is reduced in place, as DDP's default hook does. The last
is the remainder after DDP's 25 MB buckets, the smaller end in the models measured (8.7 of
44.7 MB for a full-width ResNet-18, 9.4 of 45.5 for `mlp-wide`). The decisions (the divisor,
the agreed stop) are `hetsync.protocols.allreduce.core.AllReduceWorker`'s: the first bucket
of an iteration asks it what to contribute, and the votes reduced with the last decide the
stop.

The hook reduces through the runtime's direct link, like every hetsync message; the wrapper's
own traffic (its broadcasts of the model and of the buffers) is torch's, the one exception to
the rule that only hetsync.transport.links talks to torch.distributed. Under NCCL the model
must be on a GPU (DDP's broadcasts would hand NCCL host memory): a ConfigError says so.

`prepare()` returns the user's own module, as under every other protocol: the wrapper stays
inside the driver, and what its `forward()` does around the module's (`_pre_forward`: the
reducer readied for a backward pass, the buffers broadcast; `_post_forward`: the reducer told
to expect the gradients) runs in forward hooks. Between forward passes the one hook is common
to all modules (torch's `register_module_forward_pre_hook`), filtered on the user's module: a
hook registered on the module itself would be pickled, deep-copied and saved with it, and a
copy's forward pass would drive this run's reducer. During the model's forward pass it gives
way to a hook on the model, which ends the pass: while one common to all modules is
registered, every submodule's call takes torch's slower path. A 60-module model's forward
pass with almost no compute took 0.80 ms so, against 0.87 through DDP's own forward (what
`prepare` returned before), 0.63 alone and 1.17 with hooks common to all modules throughout
(experiments/ddp_forward_cost.py, on this loaded 2-core VM). A forward pass that raised
leaves that hook on the model until the next one begins. Only a pass that records gradients
drives the reducer: one under `torch.no_grad()` (a validation pass, on any ranks, any number
of batches) leaves the reducer and the buffers alone, as it would under a
`DistributedDataParallel` whose `no_sync()` skipped it. Inputs are not moved to the model's
device (no `device_ids`), as under the other protocols.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from hetsync.errors import ConfigError
from hetsync.protocols.allreduce.core import (
    AllReduceWorker,
    Finish,
    GradientsReady,
    Reduce,
    Reduced,
    dispatch,
)
from hetsync.protocols.base import Closures, Protocol, Step
from hetsync.protocols.registry import register_protocol
from hetsync.transport.flat import model_tensors
from hetsync.transport.runtime import Runtime


@register_protocol("ddp")
class DDP(Protocol):
    """`torch.nn.parallel.DistributedDataParallel` with hetsync's measuring hook."""

    closures = Closures.AVERAGED  # every backward pass reduces: nothing more to do

    def __init__(
        self, runtime: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        super().__init__(runtime, model, optimizer)
        tensors = model_tensors(model)
        device = tensors[0].device if tensors else torch.device("cpu")
        if runtime.backend == "nccl" and device.type != "cuda":
            raise ConfigError(f"ddp: --backend nccl reduces on the GPU, but the model is on "
                              f"{device}: move it to a GPU, or use --backend gloo")
        self.link = runtime.links.direct
        self.channel = self.open_channel(self.link)
        # The gradients are views into DDP's buckets: no copy of them into the buckets before
        # the all-reduce and back after it (with the 45 MB model, 4-12 % more samples/s in
        # three alternated pairs; docs/notes/real-compute-log.md, "DDP's gradients in its buckets").
        self.ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        self.ddp.register_comm_hook(None, self._hook)
        self._bookkeeping = False  # the model's forward pass running has readied the reducer
        self._entry = register_module_forward_pre_hook(self._pre_forward)
        self._exit: RemovableHandle | None = None  # on the model, from its forward pass on
        self.step: Step | None = None
        self.core = AllReduceWorker(runtime.rank, runtime.world_size)
        self._reduce: Reduce | None = None  # what this iteration's buckets contribute
        self._votes = 0
        self._flats: dict[int, torch.Tensor] = {}
        """The last bucket's buffer with the vote, and any bucket's off the wire device, by
        bucket index, reused step after step (Link.flat says why: fresh pages every step)."""

    def _pre_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """Any module's forward pass begins: the model's readies DDP's reducer, and hands
        over to `_post_forward` on the model until it ends (the module doc says why)."""
        if module is not self.model:
            return
        self._entry.remove()
        if self._exit is not None:  # left by a forward pass that raised
            self._exit.remove()
        self._exit = module.register_forward_hook(self._post_forward, always_call=True)
        self._bookkeeping = torch.is_grad_enabled()
        if self._bookkeeping:
            self.ddp._pre_forward(*args)

    def _post_forward(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        """The model's forward pass ended: the hook common to all modules again, and DDP's
        reducer told to expect this output's gradients (returned as DDP's forward would)."""
        if module is not self.model:  # a copy made during the forward pass
            return None
        self._entry.remove()  # removed already, as a rule: never two registered
        self._entry = register_module_forward_pre_hook(self._pre_forward)
        if output is None:  # it raised (or returned nothing): torch is iterating the model's
            return None  # hooks, `_pre_forward` removes this one
        if self._exit is not None:
            self._exit.remove()
            self._exit = None
        return self.ddp._post_forward(output) if self._bookkeeping else None

    def close(self) -> None:
        """The model's forward passes are its own again (the reducer ignores a later
        backward pass: no forward pass readied it)."""
        self._entry.remove()
        if self._exit is not None:
            self._exit.remove()

    def before_optimizer_step(self, step: Step) -> None:
        # Gradients were reduced during backward(); only the votes remain to be read.
        self.step = step
        if self._reduce is None:  # no bucket reached `_hook`: DDP was not told of the pass
            raise RuntimeError(
                f"ddp: iteration {step.iteration} reduced no gradients: step() came without "
                f"backward() through the model called as model(...) (model.forward(...) skips "
                f"the hooks that drive DDP)")
        for decision in self.core.handle(Reduced(iteration=step.iteration, votes=self._votes)):
            dispatch(decision, self)

    def closure_evaluated(self, step: Step) -> None:
        """Nothing to do: the backward pass reduced the gradients, with the step's `_reduce`
        (kept until the next iteration begins: its vote is void, the stop agreed)."""

    # --- the core's decisions (`AllReduceDecisionHandler`), for `step` -----------------------
    def on_reduce(self, reduce: Reduce) -> None:
        """What every bucket of this iteration contributes (`_hook`)."""
        self._reduce = reduce

    def on_finish(self, finish: Finish) -> None:
        assert self.step is not None
        self.step.stop = finish.stop

    def after_optimizer_step(self, step: Step) -> None:
        """Nothing to do: DDP reduced the gradients during backward()."""

    def begin_iteration(self, step: Step) -> None:
        self.step = step
        self._reduce, self._votes = None, 0

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP rejects postponed annotations
        """DDP communication hook: `bucket` is a dist.GradBucket; returns a Future[Tensor]."""
        step = self.step
        if step is None:
            raise RuntimeError("DDP protocol: backward() ran before SyncOptimizer bound a step")
        step.begin_sync()
        if self._reduce is None:  # the iteration's first bucket
            for decision in self.core.handle(GradientsReady(iteration=step.iteration,
                                                            wants_stop=step.wants_stop)):
                dispatch(decision, self)
        reduce = self._reduce
        assert reduce is not None
        buffer, index = bucket.buffer(), bucket.index()
        voting = bucket.is_last()  # the vote rides in the last bucket's all-reduce
        if voting or buffer.device != self.link.device:  # a copy, with room for the vote
            flat = self.link.flat([buffer], *([float(reduce.vote)] if voting else []),
                                  out=self._flats.get(index))
            self._flats[index] = flat  # free again once `finish` has unpacked it
        else:
            flat = buffer
        flat[: buffer.numel()].div_(reduce.divisor)
        future = self.channel.all_reduce_async(step, flat, f"bucket{index}",
                                               exact_tail=1 if voting else 0)

        def finish(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            reduced = fut.value()
            if voting:
                self._votes = round(float(reduced[-1]))
            if flat is not buffer:
                self.link.unpack_into(reduced[: buffer.numel()], [buffer])
            return buffer

        return future.then(finish)
