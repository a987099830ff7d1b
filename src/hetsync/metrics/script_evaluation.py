"""Evaluation of a user's script: its own `evaluate(model)` on the consensus of the snapshots.

hetsync cannot rebuild a user's model in another process, so rank 0 evaluates it, in a thread
beside its own training: every `--eval-every` seconds it averages the newest complete set of
the workers' snapshots into a copy of the model and calls the script's function on it. That
keeps evaluation off every worker's critical path but costs rank 0 the CPU the function uses;
a heavy evaluation wants a larger `--eval-every`. Under `--pin` it runs at the lowest priority
instead, so that rank 0 keeps its cores (fewer evaluations while it trains). Without a
function, only the final set is read, for the consensus distance of the final models.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Mapping

import torch
from torch import nn

from hetsync.config import RunConfig
from hetsync.errors import OutputFailed
from hetsync.metrics.evaluator import Evaluator

__all__ = ["EvaluateFn", "EvaluationThread", "ScriptMeasure", "lowest_priority", "parse_result",
           "stop_at_target"]

#: A script's evaluation: the model (in eval mode, without gradients) -> its held-out loss, as
#: a number, a `(loss, accuracy)` pair or a mapping with "loss" and optionally "accuracy".
EvaluateFn = Callable[[nn.Module], object]


def parse_result(result: object) -> tuple[float, float | None]:
    """Loss and accuracy from what an evaluation function returned; a clear error otherwise."""
    if isinstance(result, Mapping) and "loss" in result:
        accuracy = result.get("accuracy")
        return float(result["loss"]), None if accuracy is None else float(accuracy)
    if isinstance(result, tuple) and len(result) == 2:
        return float(result[0]), None if result[1] is None else float(result[1])
    if isinstance(result, (int, float, torch.Tensor)):
        return float(result), None
    raise TypeError(
        "hetsync: evaluate(model) must return the loss, (loss, accuracy) or "
        f"{{'loss': ..., 'accuracy': ...}}; it returned {type(result).__name__}"
    )


class ScriptMeasure:
    """Loads a state into a private copy of the script's model and calls its function."""

    def __init__(self, template: nn.Module, evaluate: EvaluateFn) -> None:
        self.model = copy.deepcopy(template)
        self.evaluate = evaluate

    def __call__(self, state: dict[str, torch.Tensor], subset: bool,
                 averaged: bool = False) -> tuple[float, float | None]:
        """`averaged` changes nothing: the script's function gets the average as it is (its
        BatchNorm statistics averaged too; it may recompute them, as
        `torch.optim.swa_utils.update_bn` does, from data only the script has)."""
        self.model.load_state_dict(state)
        self.model.eval()
        with torch.no_grad():
            return parse_result(self.evaluate(self.model))


def stop_at_target(
    config: RunConfig, request_stop: Callable[[str], None]
) -> Callable[[float, float], None]:
    """An Evaluator's `on_consensus` that asks every worker to stop once the consensus model
    reaches the run's target loss (unless `--no-stop-at-target`)."""

    def on_consensus(_t: float, loss: float) -> None:
        target = config.target_loss
        if config.stop_at_target and target is not None and loss <= target:
            request_stop("target_loss")

    return on_consensus


def lowest_priority() -> None:
    """Give the calling thread (only it: Linux's priorities are per thread) nice 19."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux: the evaluation keeps its share
        pass


class EvaluationThread:
    """Polls an Evaluator beside training (`poll`), then `finish()` evaluates what is left
    and the final set."""

    def __init__(self, evaluator: Evaluator, poll: bool = True, period_s: float = 0.3,
                 yield_cpu: bool = False) -> None:
        """`yield_cpu`: poll at the lowest priority (nice 19), for a launcher that shares a
        pinned worker's core: the worker then keeps its core, and the evaluation takes what it
        leaves (snapshots wait on disk; `finish` evaluates the rest once the workers are done).
        """
        self.evaluator = evaluator
        self._yield_cpu = yield_cpu
        self.error: BaseException | None = None
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hetsync-eval", daemon=True)
        if poll:
            self._thread.start()

    def _loop(self) -> None:
        if self._yield_cpu:
            lowest_priority()
        try:
            while not self._stop.wait(self._period_s):
                self.evaluator.poll()
        except BaseException as error:  # noqa: BLE001 - surfaced by raise_error()
            self.error = error

    def raise_error(self) -> None:
        if isinstance(self.error, OSError):  # its rows or snapshots: a full disk, a lost folder
            reason = self.error.strerror or str(self.error)
            raise OutputFailed(f"the evaluation could not write into {self.evaluator.run_dir}: "
                               f"{reason}") from self.error
        if self.error is not None:
            raise RuntimeError(f"the evaluation failed: {self.error!r}") from self.error

    def abandon(self) -> None:
        self._stop.set()

    def finish(self) -> dict[str, float] | None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.raise_error()
        return self.evaluator.finish()
