"""The public training API: wrap your optimizer, keep your loop.

    import hetsync
    hetsync.init()
    model, opt = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step(loss=loss)          # pace, synchronise, log, agree on stopping
        if opt.should_stop:
            break
    opt.close()

or, with a DataLoader, `for x, y in opt.iterate(loader, epochs=10):`, which also handles
`set_epoch`, stopping and `close()`.

hetsync's own workloads train through exactly this loop (hetsync/launch/worker.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from hetsync.metrics.worker_log import IterationLog, Snapshotter
from hetsync.protocols import Protocol, Step, get_protocol
from hetsync.slowdown import pacing
from hetsync.transport.flat import broadcast_model
from hetsync.transport.runtime import Runtime, current_runtime

__all__ = ["SyncOptimizer", "prepare"]

#: Key in the control store that, once set, asks every worker to stop (value: the reason).
STOP_KEY = "stop"
_STOP_POLL_S = 0.25
Batch = TypeVar("Batch")


class SyncOptimizer:
    """An optimizer wrapper whose `step()` runs the run's protocol around the inner step.

    Composition, not subclassing (like torch's PostLocalSGDOptimizer): `param_groups`,
    `state_dict()` and `zero_grad()` are the inner optimizer's.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        protocol: str | None = None,
        *,
        runtime: Runtime | None = None,
        snapshots: bool = False,
    ) -> None:
        self.runtime = runtime or current_runtime()
        config = self.runtime.config
        if self.runtime.world_size > 1:
            broadcast_model(model)  # every worker starts from rank 0's model
        self.optimizer = optimizer
        protocol_class = get_protocol(protocol or config.protocol)
        self.protocol: Protocol = protocol_class(self.runtime, model, optimizer)
        self.model = self.protocol.wrap_model()
        self._raw_model = model
        self._slowdown = config.slowdown_spec()
        self._step_time_s = config.step_time / 1000.0
        self.iteration = 0
        self.should_stop = False
        self.stop_reason: str | None = None
        self._stop_requested = False
        self._closed = False
        self._next_stop_poll = 0.0
        run_dir = self.runtime.run_dir
        self._log = IterationLog(run_dir, self.runtime.rank) if run_dir else None
        self._snapshots = (
            Snapshotter(run_dir, self.runtime.rank, config.eval_every)
            if run_dir and snapshots
            else None
        )
        self.runtime.start_clock()
        self._step = self._new_step()
        self._heartbeat("compute")

    # --- the inner optimizer's surface ------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state.get("iteration", 0))
        self._step = self._new_step()

    # --- the iteration ------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask to stop after the current iteration (agreed with the others where needed)."""
        self._stop_requested = True

    def step(self, loss: torch.Tensor | float | None = None) -> Step:
        """Synchronise and apply one optimizer step; returns this iteration's record."""
        step = self._step
        self.protocol.before_optimizer_step(step)
        if not step.skip_optimizer_step:
            self.optimizer.step()
        self.protocol.after_optimizer_step(step)
        self.iteration = step.iteration
        self.should_stop = step.stop
        self._record(step, loss)
        self._step = self._new_step()
        return step

    def iterate(self, loader: Iterable[Batch], epochs: int | None = None) -> Iterator[Batch]:
        """Batches of `loader`, epoch after epoch, until the run stops; then `close()`.

        Calls `loader.sampler.set_epoch(epoch)` where the sampler has it (DistributedSampler).
        """
        epoch = 0
        try:
            while epochs is None or epoch < epochs:
                sampler = getattr(loader, "sampler", None)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
                for batch in loader:
                    yield batch
                    if self.should_stop:
                        return
                epoch += 1
        finally:
            self.close()

    def close(self) -> None:
        """Write the final snapshot and logs; release the protocol's resources (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._snapshots is not None:
            self._snapshots.final(self._raw_model, self.runtime.elapsed(), self.iteration)
        if self._log is not None:
            self._log.close()
        self._heartbeat("closing")  # a protocol may wait here for its neighbours to stop
        self.protocol.close()
        if self.runtime.launched:
            self.runtime.store.set(f"stopped/{self.runtime.rank}", self.stop_reason or "")
        self._heartbeat("done")
        if self.runtime.world_size > 1:
            # Leave together: a rank tearing down its gloo pairs while a peer still uses them
            # made the peer abort at exit now and then (about 1 run in 10 without this).
            dist.barrier()

    def __enter__(self) -> SyncOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------
    def _new_step(self) -> Step:
        step = Step(
            iteration=self.iteration + 1,
            on_begin_sync=self._begin_sync,
            on_phase=self._heartbeat if self.runtime.launched else None,
        )
        self.protocol.begin_iteration(step)
        return step

    def _begin_sync(self, step: Step) -> None:
        """Pad the compute to the emulated step time, inject the slowdown, decide stopping."""
        compute = time.perf_counter() - step.start - step.sync_wait_s  # waits are not compute
        factor = self._slowdown.factor(self.runtime.rank, step.iteration)
        pad, delay = pacing(compute, self._step_time_s, factor)
        if pad + delay > 0:
            time.sleep(pad + delay)
        step.compute_s, step.injected_delay_s = compute + pad, delay
        step.wants_stop = self._wants_stop(step.iteration)

    def _wants_stop(self, iteration: int) -> bool:
        config = self.runtime.config
        reason = None
        if self._stop_requested:
            reason = "script"
        elif config.max_iterations is not None and iteration >= config.max_iterations:
            reason = "max_iterations"
        elif config.max_time is not None and self.runtime.elapsed() >= config.max_time:
            reason = "max_time"
        elif self.runtime.launched and time.monotonic() >= self._next_stop_poll:
            self._next_stop_poll = time.monotonic() + _STOP_POLL_S
            if self.runtime.store.check([STOP_KEY]):
                reason = self.runtime.store.get(STOP_KEY).decode()
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
        return reason is not None

    def _record(self, step: Step, loss: torch.Tensor | float | None) -> None:
        elapsed = self.runtime.elapsed()
        if self._log is not None:
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
            self._log.append(
                {
                    "t": round(elapsed, 4),
                    "iteration": step.iteration,
                    "loss": value,
                    "compute_s": round(step.compute_s, 6),
                    "injected_delay_s": round(step.injected_delay_s, 6),
                    "sync_wait_s": round(step.sync_wait_s, 6),
                    "bytes_sent": step.bytes_sent,
                    **step.extra,
                }
            )
        if self._snapshots is not None:
            self._snapshots.maybe_snapshot(self._raw_model, elapsed, step.iteration)
        self._heartbeat("compute")

    def _heartbeat(self, phase: str) -> None:
        if self.runtime.launched:
            rt = self.runtime
            rt.store.set(f"hb/{rt.rank}", f"{self.iteration} {phase} {rt.elapsed():.3f}")


def prepare(
    model: nn.Module, optimizer: torch.optim.Optimizer, protocol: str | None = None
) -> tuple[nn.Module, SyncOptimizer]:
    """Return the module to call in the forward pass and the synchronising optimizer."""
    sync = SyncOptimizer(optimizer, model, protocol)
    return sync.model, sync
