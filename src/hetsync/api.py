"""The public training API: wrap your optimizer, keep your loop.

    import hetsync
    device = hetsync.init().device
    model, opt = hetsync.prepare(model.to(device), torch.optim.SGD(model.parameters(), lr=0.05),
                                 evaluate=held_out_loss)     # optional: fn(model) -> loss
    for x, y in opt.iterate(loader, epochs=10):              # set_epoch, stop, close()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step(loss=loss)          # pace, synchronise, log, agree on stopping
    final = opt.consensus_model()    # every rank: the average of all workers' models

or a plain loop with `if opt.should_stop: break` and `opt.close()`. The optimizer is a
`torch.optim.Optimizer`: schedulers, GradScaler and clipping work on it.

hetsync's own workloads train through exactly this loop (hetsync/launch/worker.py).
"""

from __future__ import annotations

import copy
import inspect
import math
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, TypeVar

import torch
from torch import nn

from hetsync.errors import LOOP_ENDED, ConfigError, RunStopped
from hetsync.malloc_settings import touch_heap
from hetsync.metrics.evaluator import Evaluator
from hetsync.metrics.script_evaluation import (
    EvaluateFn,
    EvaluationThread,
    ScriptMeasure,
    stop_at_target,
)
from hetsync.metrics.summary import summarize, write_summary
from hetsync.metrics.thread_cpu import ThreadCpu
from hetsync.metrics.worker_log import IterationLog, Snapshotter
from hetsync.network.emulator import model_bytes
from hetsync.protocols.base import Closures, Protocol
from hetsync.protocols.registry import get_protocol
from hetsync.slowdown import join_cpu_quota, pacing
from hetsync.step import Step
from hetsync.transport.contiguous import lay_out
from hetsync.transport.control import STOP_KEY
from hetsync.transport.flat import average_model, broadcast_model, model_tensors
from hetsync.transport.runtime import Runtime, current_runtime

__all__ = ["SyncOptimizer", "prepare"]

_FRESH_MODELS = 8
"""How many models' worth of memory a worker's first steps may take fresh, touched before the
clock (hetsync.malloc_settings.touch_heap): gradients, optimizer state, and the messages a
protocol packs and receives."""

Batch = TypeVar("Batch")

_PREPARED: weakref.WeakSet[object] = weakref.WeakSet()
"""The models and optimizers a SyncOptimizer was built on: a second would synchronise the
same model twice, each protocol waiting on steps the other takes."""


class SyncOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose `step()` runs the run's protocol around the inner step.

    It wraps the user's optimizer (like torch's PostLocalSGDOptimizer) and shares its
    `param_groups`, `defaults` and `state`, so learning-rate schedulers, `torch.amp.GradScaler`,
    gradient clipping and checkpoints work on it as on the inner optimizer.

    It lays the model's floating parameters and buffers out in one buffer (each becomes a
    view of its slice; the `Parameter` objects stay the same), so that protocols move the
    model in one piece: a model moved afterwards (`model.to(...)`) still trains, tensor by
    tensor, only slower. `torch.save` writes a view's whole storage, so a script that saves
    one tensor or one submodule's state apart should `.clone()` it, or pass
    `contiguous=False` (the tensors are then left as they are).
    """

    #: GradScaler hands over `grad_scale` and `found_inf` instead of skipping `step()`: every
    #: worker must take part in every synchronisation, overflow or not (see `_unscale`).
    _step_supports_amp_scaling = True

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        protocol: str | None = None,
        *,
        runtime: Runtime | None = None,
        snapshots: bool = False,
        evaluate: EvaluateFn | None = None,
        contiguous: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"hetsync: the model must be a torch.nn.Module, not {model!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"hetsync: the optimizer must be a torch.optim.Optimizer, not {optimizer!r}"
            )
        _check_model(model)
        if model in _PREPARED or optimizer in _PREPARED or isinstance(optimizer, SyncOptimizer):
            which = "model" if model in _PREPARED else "optimizer"
            raise RuntimeError(f"hetsync: prepare() was already called with this {which}: "
                               f"call it once, and keep the optimizer it returns")
        self.runtime = runtime or current_runtime()
        config = self.runtime.config
        protocol_class = get_protocol(protocol or config.protocol)
        if needs_closure(optimizer) and protocol_class.closures is Closures.REFUSED:
            raise _closure_refused(protocol_class, optimizer)
        if contiguous:  # every protocol then packs, averages and unpacks the model in one
            lay_out(model_tensors(model))  # operation, not one per tensor (transport.contiguous)
        if self.runtime.world_size > 1 and not self.runtime.rejoining:  # from rank 0's model
            broadcast_model(model, self.runtime.links.direct)  # (a restarted one: a live one)
        self.optimizer = optimizer
        self.protocol: Protocol = protocol_class(self.runtime, model, optimizer)
        self.protocol.network.background_wait = self._emulated_wait  # its threads' waits too
        _PREPARED.update((model, optimizer))
        self._stepping = False  # inside step(): the inner optimizer's own step is ours
        self._left_at: torch.Tensor | None = None  # LBFGS's model after its last local step
        optimizer.register_step_pre_hook(self._refuse_inner_step)
        self.model = model  # the user's own module, under every protocol
        self._raw_model = model
        self._slowdown = config.slowdown_spec()
        self._step_time_s = config.step_time / 1000.0
        self.iteration = 0
        self._resumed_at = 0  # the iteration a resumed run went on from (Step counts from it)
        self._base = 0  # the iteration --max-iterations counts the steps from: common to all
        self.should_stop = False
        self.stop_reason: str | None = None
        self._stop_requested = False
        self._diverged: str | None = None  # the stop reason once a loss was NaN or infinite
        self._closed = False
        self._control = self.runtime.open_control()
        run_dir = self.runtime.run_dir
        self._log = IterationLog(run_dir, self.runtime.rank) if run_dir else None
        self._snapshots = (
            Snapshotter(run_dir, self.runtime.rank, config.eval_every) if run_dir else None
        )
        self._periodic_snapshots = snapshots or evaluate is not None
        if self._snapshots is not None:  # its buffer's first touch before the clock
            self._snapshots.prepare(model)
        if all(p.device.type == "cpu" for p in model.parameters()):  # the first steps' too
            touch_heap(_FRESH_MODELS * model_bytes(model))
        self._evaluation = self._start_evaluation(evaluate) if not snapshots else None
        # From here: the rows' CPU is the run's, not the set-up's (a touched heap among it).
        self._thread_cpu = ThreadCpu() if run_dir else None
        if self.runtime.membership is not None:  # a donor hands its state to restarted workers
            self.runtime.membership.state_source = self._live_state
        self.runtime.start_clock()
        join_cpu_quota()  # a `cpu:` straggler's quota acts on its training, not its start-up
        self._step: Step | None = self._new_step()
        if self.runtime.rejoining:
            self._rejoin()
        self._heartbeat("compute")
        self.runtime.exit_hooks.append(self._close_at_exit)  # a script that never closes it

    # --- the inner optimizer's surface ------------------------------------------------------
    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.optimizer.state

    def __repr__(self) -> str:
        return f"SyncOptimizer({self.protocol.name}, {self.optimizer!r})"

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise NotImplementedError(
            "hetsync: add the parameter group to the optimizer before hetsync.prepare(): the "
            "protocol synchronises the parameters it was built with"
        )

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict plus, under "hetsync", what a resumed run needs:
        the iteration, the run time and the protocol's state. It still loads into the inner
        optimizer (which ignores the extra key); save it with the model's, torch.save both."""
        if self._log is not None:
            self._log.flush()  # the rows up to the checkpoint, which a resume keeps
        return {**self.optimizer.state_dict(),
                "hetsync": {"iteration": self.iteration, "elapsed": self.runtime.elapsed(),
                            "protocol": self.protocol.state_dict()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this optimizer or of the inner one. With hetsync's part (from
        `state_dict()`, before the first `step()`, after the model's state is loaded), the run
        goes on from it: iterations and run time continue from the saved ones, so the rows and
        the loss curve do, and the protocol starts afresh from the loaded models."""
        saved = state_dict.get("hetsync")
        self.optimizer.load_state_dict({k: v for k, v in state_dict.items() if k != "hetsync"})
        if saved is not None:
            self._resume(saved)

    # --- the iteration ------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask to stop after the current iteration (agreed with the others where needed)."""
        self._stop_requested = True

    def step(self, closure: Callable[[], Any] | None = None, *,  # type: ignore[override]
             loss: torch.Tensor | float | None = None) -> Any:
        """Synchronise and apply one optimizer step; returns this iteration's record (a
        `Step`), or, given torch's `closure`, what torch's step returns: the closure's first
        loss, which is then the iteration's. The closure (LBFGS runs it several times a
        step) runs as the protocol's `closures` says (hetsync.protocols.base.Closures)."""
        if closure is not None and not callable(closure):
            raise TypeError(f"hetsync: step() takes torch's closure (a callable), not "
                            f"{type(closure).__name__}: pass the loss as step(loss=loss)")
        if closure is not None and self.protocol.closures is Closures.REFUSED:
            raise _closure_refused(type(self.protocol), self.optimizer)
        step = self._step
        if step is None:
            if self.stop_reason is not None or self._closed:
                self._end_script()
            raise RuntimeError("hetsync: step() after a step() that failed")
        if self.runtime.lost is not None:
            self.runtime.lost.raise_error()  # the protocol missed a loss: it may wait for good
        self._step = None  # until it completes: close() does not end a step that failed
        value = _loss_value(loss)
        self._check_finite(value, step)
        self._unscale()
        result: Any = step
        if closure is None:
            self.protocol.before_optimizer_step(step)
            if not step.skip_optimizer_step:
                self._inner_step()
        else:
            result = self._closure_step(step, closure)
            value = _loss_value(result)
        self.protocol.after_optimizer_step(step)
        self.iteration = self._resumed_at + step.iteration
        self.should_stop = step.stop
        self._record(step, value)
        # No iteration begins after the last: a protocol that starts its exchange when an
        # iteration begins (D-PSGD, AD-PSGD) would start one that nobody finishes.
        self._step = None if step.stop else self._new_step()
        return result

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
        """Write the final snapshot and logs; release the protocol's resources (idempotent).
        On rank 0 of a script's run, evaluate the final models and, without a launcher to
        do it, write `summary.json`."""
        if self._closed:
            return
        self._closed = True
        if self._close_at_exit in self.runtime.exit_hooks:
            self.runtime.exit_hooks.remove(self._close_at_exit)
        if self._log is not None:
            self._log.close()
        self._heartbeat("closing")  # a protocol may wait here for its neighbours to stop
        if self._step is not None:  # the loop ended before the run stopped (epochs ran out)
            self.protocol.loop_ended(self._step)
            self._step = None
            if self.stop_reason is None:
                self.stop_reason = f"{LOOP_ENDED} {self.iteration}"
        self.protocol.close()
        if self.runtime.lost is not None:
            self.runtime.lost.raise_error()
        if self._snapshots is not None:  # after close(): a passive AD-PSGD worker serves until
            self._snapshots.final(self._raw_model, self.runtime.elapsed(), self.iteration)
        if self.runtime.launched:
            self.runtime.store.set(f"stopped/{self.runtime.rank}", self.stop_reason or "")
        self._heartbeat("done")
        self._control.close()
        self.runtime.leave_together()  # about 1 run in 10 aborted at exit without it
        if self._evaluation is not None:
            self._evaluation.finish()  # every final snapshot exists after the barrier
            if not self.runtime.launched and self.runtime.run_dir is not None:
                config = self.runtime.config
                write_summary(self.runtime.run_dir,
                              summarize(self.runtime.run_dir, config, self.stop_reason))

    def consensus_model(self) -> nn.Module:
        """A copy of the model holding the average of every worker's final model.

        A collective: every rank calls it, after the training loop (`iterate()` has ended or
        `close()` was called). Floating-point parameters and buffers (BatchNorm statistics)
        are averaged; integer buffers (batch counters) are this worker's. Averaged BatchNorm
        statistics are not the averaged weights' own: recompute them before evaluating, as
        for any averaged model (`torch.optim.swa_utils.update_bn(loader, model)`).
        """
        if not self._closed:
            raise RuntimeError(
                "hetsync: consensus_model() averages the final models: call it after the "
                "training loop (when iterate() has ended, or after close()) on every rank"
            )
        model = copy.deepcopy(self._raw_model)
        if self.runtime.world_size > 1:
            average_model(model, self.runtime.links.direct)
        return model

    def __enter__(self) -> SyncOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------
    def _end_script(self) -> None:
        """`step()` after the run stopped: a plain loop that never reads `should_stop` ends
        its script here (`RunStopped`: exit status 0, no traceback), and the exit closes the
        run (`_close_at_exit`). Said once, by rank 0, so that a user knows why the code after
        the loop did not run."""
        reason = self.stop_reason or "closed"
        if self.runtime.rank == 0 and not self.runtime.config.quiet:
            print(f"hetsync: the run stopped ({reason}) after iteration {self.iteration}; the "
                  f"script called step() again, so it ends here (to run code after the loop, "
                  f"end it when optimizer.should_stop is set, as optimizer.iterate() does)",
                  file=sys.stderr, flush=True)
        raise RunStopped(reason)

    def _close_at_exit(self) -> None:
        """The script ended (its loop ran out, or `RunStopped`) without `close()`: close now,
        before the process group goes, as the commonest PyTorch script never calls anything
        at its end. A script that died of an exception leaves at once instead (its peers may
        wait for it in a step: the launcher names the failure). A failure while closing is
        reported as an uncaught one would be, and the process exits 1."""
        if self.runtime.crashed:
            return
        try:
            self.close()
        except BaseException:  # noqa: BLE001 - at exit: report it and fail, as uncaught
            sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
            sys.stderr.flush()
            os._exit(1)

    def _check_finite(self, loss: float | None, step: Step) -> None:
        """A NaN or infinite loss stops every worker (through the store, as at the target): a
        diverged model has no figure left to give, and its NaNs would spread to the others'
        through the sync."""
        if loss is not None and not math.isfinite(loss) and self._diverged is None:
            self._diverged = f"diverged at iteration {self._resumed_at + step.iteration}"
            self.runtime.store.set(STOP_KEY, self._diverged)

    def _inner_step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The inner optimizer's step, which only this may take (`_refuse_inner_step`)."""
        self._stepping = True
        try:
            return self.optimizer.step() if closure is None else self.optimizer.step(closure)
        finally:
            self._stepping = False

    def _refuse_inner_step(self, optimizer: torch.optim.Optimizer, args: Any,
                           kwargs: Any) -> None:
        """The optimizer given to prepare() stepped on its own (the script kept the old name):
        its step would skip the protocol, and this worker's model would leave the others'."""
        if not self._stepping and not self._closed:
            raise RuntimeError(
                f"hetsync: step() called on the {type(optimizer).__name__} given to "
                f"hetsync.prepare(), which skips the synchronisation: step the optimizer it "
                f"returned (model, optimizer = hetsync.prepare(model, optimizer))")

    def _closure_step(self, step: Step, closure: Callable[[], Any]) -> Any:
        """The inner `step(closure)` under the protocol (`Closures`): LOCAL, between its two
        hooks; AVERAGED, each evaluation's gradients and loss averaged, the first through
        `before_optimizer_step`. Returns the closure's first result, as torch's step does."""
        averaged = self.protocol.closures is Closures.AVERAGED
        first: list[Any] = []
        evaluations = 0

        def evaluate() -> Any:
            nonlocal evaluations
            result = closure()
            evaluations += 1
            if evaluations == 1:
                first.append(result)
                self._check_finite(_loss_value(result), step)
            if not averaged:
                return result
            if evaluations == 1:
                self.protocol.before_optimizer_step(step)
            else:
                self.protocol.closure_evaluated(step)
            return self._average_loss(step, result, evaluations)

        if not averaged:
            self.protocol.before_optimizer_step(step)
            self._forget_a_broken_path()
        after_sync, began = step.synced, time.perf_counter()
        self._inner_step(evaluate)
        if not averaged and isinstance(self.optimizer, torch.optim.LBFGS):
            self._left_at = _flat_params(self.optimizer)
        if after_sync:  # the protocol synchronised first (D-PSGD, Hop): the closure is compute
            step.compute_s += time.perf_counter() - began
        if not first:
            raise RuntimeError(f"hetsync: {type(self.optimizer).__name__}.step(closure) did "
                               f"not call the closure, so the protocol had no gradients")
        return first[0]

    def _forget_a_broken_path(self) -> None:
        """LBFGS's state (its curvature pairs, last direction and gradient) is differences
        along its own path. Where an exchange moved the model since its last step left it,
        the path broke, and steps from that state can diverge (tests/launch/scripts/
        lbfgs_sequence.py's model with 12 units on 40-step waves, two workers: loss 0.54 to
        2.1 in five steps under dpsgd, 0.54 to 4.5 averaged in one process, where starting
        afresh reached 0.013): its state is dropped, and the step starts from the exchanged
        model as from a new one. It is kept while no exchange moved the model (local SGD's
        steps between rounds)."""
        if self._left_at is not None and not torch.equal(self._left_at,
                                                         _flat_params(self.optimizer)):
            self.optimizer.state.clear()

    def _average_loss(self, step: Step, loss: Any, evaluation: int) -> Any:
        """Every worker's mean `loss` at this evaluation, for the inner optimizer (LBFGS's
        line search and tolerances compare losses: every worker must read the same). It rides
        with the evaluation's number and its square, whose sums show that every worker is at
        the same one: an optimizer whose arithmetic differed on some worker (another torch,
        device kind or thread count) fails here in one line, rather than pairing collectives
        from different evaluations or waiting for good."""
        world = self.runtime.world_size
        if world == 1:
            return loss
        link, value = self.runtime.links.direct, _loss_value(loss)
        sums = torch.tensor([0.0 if value is None else value / world, evaluation,
                             evaluation ** 2], dtype=torch.float64, device=link.device)
        with step.blocking():
            link.all_reduce(sums)
        mean, count, squares = sums.tolist()
        if count != world * evaluation or squares != world * evaluation ** 2:
            raise RuntimeError(
                f"hetsync: the workers' {type(self.optimizer).__name__} took different "
                f"decisions: this worker is at evaluation {evaluation} of its closure in "
                f"iteration {self._resumed_at + step.iteration}, another is not (their "
                f"arithmetic differed: the same torch, device and threads on every worker)")
        if isinstance(loss, torch.Tensor):
            return loss.detach().new_tensor(mean)
        return None if loss is None else mean

    def _new_step(self) -> Step:
        step = Step(
            iteration=self.iteration - self._resumed_at + 1,
            on_begin_sync=self._begin_sync,
            on_phase=self._heartbeat if self.runtime.launched else None,
            on_wait=self._emulated_wait,
        )
        self.protocol.begin_iteration(step)
        step.begin_s = time.perf_counter() - step.start - step.sync_wait_s - step.network_s
        return step

    def _resume(self, saved: dict[str, Any]) -> None:
        step = self._step
        if self.iteration != 0 or step is None:
            raise RuntimeError("hetsync: load_state_dict() with a run's state must come before "
                               "the first step()")
        # The protocol starts afresh, as a new run from these models would: its steps count
        # from 1 again, so that workers resumed from different iterations agree on them, and
        # --max-iterations counts them from one base that all share (the launcher's: the
        # earliest checkpoint's), so all go on for the same number (docs/failures.md).
        self.iteration = self._resumed_at = int(saved["iteration"])
        self._base = int(saved.get("base", self.iteration))
        step.start, step.begin_s = time.perf_counter(), 0.0  # the load is not the compute
        self.runtime.t0 = time.time() - float(saved["elapsed"])
        if self._log is not None:
            self._log.resume_after(self.iteration)
        if self._snapshots is not None:
            self._snapshots.resume(float(saved["elapsed"]))
        self.protocol.load_state_dict(saved["protocol"])
        self.protocol.go_on_from(self._base)
        self._heartbeat("compute")

    def _live_state(self) -> dict[str, Any]:
        """What a restarted worker needs to go on with the run from this worker's state, at
        a step boundary (a collective of the step given up: the model not yet stepped): the
        model, the inner optimizer's state, and where the step counts are."""
        with self.protocol.model_lock():
            model = {k: v.detach().cpu().clone() for k, v in self._raw_model.state_dict().items()}
        return {"model": model, "optimizer": self.optimizer.state_dict(),
                "iteration": self.iteration,
                "base": self._base + self.iteration - self._resumed_at}

    def _rejoin(self) -> None:
        """A restarted worker takes a member's live state (hetsync.transport.membership) and
        goes on from its iteration, as a resumed run goes on from a checkpoint's."""
        assert self.runtime.membership is not None
        live = self.runtime.membership.receive_state()
        self._raw_model.load_state_dict(live["model"])
        self.optimizer.load_state_dict(live["optimizer"])
        self._resume({"iteration": live["iteration"], "base": live["base"],
                      "elapsed": self.runtime.elapsed(), "protocol": {}})
        print(f"hetsync: rank {self.runtime.rank} rejoined the run at iteration "
              f"{self.iteration} with rank {self.runtime.membership.current.donor}'s model "
              f"(generation {self.runtime.membership.current.number})", file=sys.stderr,
              flush=True)

    def _begin_sync(self, step: Step) -> None:
        """Pad the compute to the emulated step time, inject the slowdown, decide stopping.
        The compute is the user's: from the end of the protocol's `begin_iteration` on; on a
        GPU, until the kernels it queued have run (else only their launch would count, and a
        slowdown's factor would scale that)."""
        if self.runtime.device.type == "cuda":
            torch.cuda.current_stream(self.runtime.device).synchronize()
        compute = (time.perf_counter() - step.start - step.sync_wait_s - step.network_s
                   - step.begin_s)
        iteration = self._resumed_at + step.iteration
        factor = self._slowdown.factor(self.runtime.rank, iteration)
        pad, delay = pacing(compute, self._step_time_s, factor)
        self._announce(pad + delay)  # a large factor on a warm-up iteration is no hang
        if pad + delay > 0:
            time.sleep(pad + delay)
        step.compute_s, step.injected_delay_s = compute + pad, delay
        step.wants_stop = self._wants_stop(self._base + step.iteration)

    def _emulated_wait(self, seconds: float) -> float:
        """An emulated network wait about to start (`Step.on_wait`): cut at the run's
        --max-time, so that a link too slow for the run ends it at its time rather than days
        later, and announced when long."""
        max_time = self.runtime.config.max_time
        if max_time is not None:
            seconds = min(seconds, max(0.0, max_time - self.runtime.elapsed()))
        self._announce(seconds)
        return seconds

    def _announce(self, seconds: float) -> None:
        """Tell the launcher this worker will be silent `seconds` (an emulated compute or
        transfer), where that is long enough to be taken for a hang."""
        if self.runtime.launched and seconds > self.runtime.config.hang_timeout / 4:
            self._heartbeat("delay", f" {seconds:.3f}")

    def _unscale(self) -> None:
        """Under `GradScaler.step(optimizer)`: unscale the gradients before they are shared.
        A worker whose gradients overflowed contributes zeros instead of skipping the step,
        since the others are waiting for it; its scaler still backs off its scale."""
        scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if scale is None and found_inf is None:  # no scaler: nothing to gather, every step
            return
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        with torch.no_grad():
            if found_inf is not None and float(found_inf) > 0:
                torch._foreach_zero_(grads)
            elif scale is not None:
                torch._foreach_mul_(grads, 1.0 / float(scale))

    def _start_evaluation(self, evaluate: EvaluateFn | None) -> EvaluationThread | None:
        """Rank 0 of a script's run evaluates the consensus of the snapshots (see
        hetsync.metrics.script_evaluation); the launcher does it for built-in workloads."""
        rt = self.runtime
        if rt.rank != 0 or rt.run_dir is None:
            return None
        if not rt.launched:
            (rt.run_dir / "config.json").write_text(rt.config.to_json() + "\n")
        on_consensus = stop_at_target(rt.config, partial(rt.store.set, STOP_KEY))
        measure = ScriptMeasure(self._raw_model, evaluate) if evaluate is not None else None
        evaluator = Evaluator(rt.run_dir, rt.world_size, measure, per_worker=False,
                              keep_snapshots=rt.config.keep_snapshots, on_consensus=on_consensus,
                              target_loss=rt.config.target_loss)
        # Pinned, rank 0's core is its own: its evaluation takes only what training leaves.
        return EvaluationThread(evaluator, poll=evaluate is not None, yield_cpu=rt.config.pin)

    def _wants_stop(self, steps: int) -> bool:
        """`steps`: the base and the protocol's steps since it (the iteration, unresumed)."""
        config = self.runtime.config
        reason = None
        if self._diverged is not None:
            reason = self._diverged
        elif self._stop_requested:
            reason = "script"
        elif config.max_iterations is not None and steps >= config.max_iterations:
            reason = "max_iterations"
        elif config.max_time is not None and self.runtime.elapsed() >= config.max_time:
            reason = "max_time"
        else:
            reason = self._control.stop_reason()  # polled off this thread
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
        return reason is not None

    def _record(self, step: Step, loss: float | None) -> None:
        elapsed = self.runtime.elapsed()
        step.network_s += self.protocol.network.take_background()
        if not self.protocol.codec.lossless:  # compression's own cost, off the wire
            step.extra["codec_s"] = round(self.protocol.codec_time.take(), 6)
        if self._log is not None:
            row = {
                "t": round(elapsed, 4),
                "iteration": self.iteration,
                "loss": loss,
                "compute_s": round(step.compute_s, 6),
                "injected_delay_s": round(step.injected_delay_s, 6),
                "sync_wait_s": round(step.sync_wait_s, 6),
                "network_s": round(step.network_s, 6),
                "bytes_sent": step.bytes_sent,
                **step.extra,
            }
            cpu = self._thread_cpu.sample(force=step.stop) if self._thread_cpu else None
            if cpu is not None:
                row["cpu_s"] = cpu
            self._log.append(row)
        if self._snapshots is not None and self._periodic_snapshots:
            self._snapshots.maybe_snapshot(self._raw_model, elapsed, self.iteration,
                                           hold=self.protocol.model_lock)
        self._heartbeat("compute")

    def _heartbeat(self, phase: str, extra: str = "") -> None:
        """Tell the launcher's monitor where this worker is: recorded here, sent by the
        control thread (`closing` and `done` at once). Once it closes it stays closing: a
        protocol that waits as it closes (Hop sending a deferred update) through its last
        step's `blocking()` would otherwise beat `sync` then `compute`, and a worker that
        finished first and waits for a slow neighbour would be taken for a hung one."""
        if self._closed and phase not in ("closing", "done"):
            return
        if self.runtime.launched:
            self._control.beat(f"{self.iteration} {phase} {self.runtime.elapsed():.3f}{extra}")
            if self._closed:
                self._control.flush()


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's step takes a closure it cannot do without (LBFGS's)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # no signature to read: assume the optional one
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def _closure_refused(protocol: type[Protocol], optimizer: torch.optim.Optimizer) -> ConfigError:
    name = type(optimizer).__name__
    return ConfigError(
        f"hetsync: {protocol.name} cannot run {name}.step(closure): its update is not this "
        f"worker's optimizer step, so the closure's evaluations would have no part in it; "
        f"for a closure use allreduce or ddp (each evaluation averaged) or a model-averaging "
        f"protocol (dpsgd, adpsgd, hop, prague, localsgd: local steps)")


def _check_model(model: nn.Module) -> None:
    """A model hetsync can synchronise: real floating-point tensors, at least one parameter
    (the links move those only: a complex tensor would be left out of every exchange)."""
    for kind, named in (("parameter", model.named_parameters()),
                        ("buffer", model.named_buffers())):
        for name, tensor in named:
            if tensor.is_complex():
                raise TypeError(
                    f"hetsync: the model's {kind} {name!r} is {tensor.dtype}, and hetsync "
                    f"synchronises real floating-point tensors only: keep it as a real one "
                    f"(torch.view_as_real) and view it as complex in forward()")
    if not any(p.is_floating_point() for p in model.parameters()):
        raise TypeError(f"hetsync: the model {type(model).__name__} has no floating-point "
                        f"parameters, so there is nothing to train or synchronise")


def _flat_params(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """A copy of the optimizer's parameters, in one vector."""
    return torch.cat([p.detach().reshape(-1) for g in optimizer.param_groups
                      for p in g["params"]])


def _loss_value(loss: Any) -> float | None:
    """A loss as the row logs it (a tensor's value, a number, or None)."""
    if isinstance(loss, torch.Tensor):
        return float(loss.detach())
    return None if loss is None else float(loss)


def prepare(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    protocol: str | None = None,
    *,
    evaluate: EvaluateFn | None = None,
    contiguous: bool = True,
) -> tuple[nn.Module, SyncOptimizer]:
    """Return the model, the script's own module under every protocol (DDP's wrapper stays
    inside its driver), and the synchronising optimizer (`contiguous`: as `SyncOptimizer`'s).

    `evaluate(model)`, given on every rank, measures a model on held-out data (return the
    loss, `(loss, accuracy)` or `{"loss": ..., "accuracy": ...}`): rank 0 calls it on the
    consensus model every `--eval-every` seconds, off the training path, which gives the run
    loss and accuracy against time, a time to target and the final figures in summary.json.
    """
    sync = SyncOptimizer(optimizer, model, protocol, evaluate=evaluate, contiguous=contiguous)
    return sync.model, sync
