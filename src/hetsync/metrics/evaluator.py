"""Evaluation of model snapshots off the critical path.

Workers only write snapshots; this evaluator (a thread of the launcher, or rank 0 at the end
of a torchrun run) averages each complete set into the consensus model and measures it, and
each worker's own model, on the held-out split. When it falls behind it skips to the newest
complete set, and it measures the workers' own models only on every `WORKER_EVAL_PERIOD`-th
set it evaluates (they cost `world` times a consensus evaluation), so it never slows the run
down by more than the CPU it uses, which `CPU_SHARE` bounds.

Snapshots are cheap and evaluations are not (a LeNet on 10k images takes about a second), so
the time to target is resolved by bisection rather than by evaluating every set: until the
consensus loss first reaches the target, the sets skipped since the last evaluation are kept,
and once an evaluation is at or below the target, they are bisected down to two consecutive
sets, one above and one at or below. The crossing is then known to one snapshot period
(`--eval-every`) for the price of log2(skipped sets) extra evaluations.

An average of models has no BatchNorm statistics of its own: the average of the workers'
running statistics is not what the averaged weights produce, and the farther apart the
workers (a straggler's model steps behind), the worse that consensus model measures (a
ResNet's held-out loss 1.21 as saved, 0.48 once its statistics were recomputed). So, as
`torch.optim.swa_utils.update_bn` does for an averaged model, a consensus model's BatchNorm
statistics are recomputed on a fixed sample of the training split before it is measured
(`--eval-bn recompute`, the default; `saved` measures the averaged statistics). A worker's own
model is measured as it is: its statistics come from its own weights.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.swa_utils import update_bn

from hetsync.metrics import strict_json
from hetsync.metrics.worker_log import snapshot_path
from hetsync.workloads import Workload

__all__ = ["BN_SAMPLES", "Evaluator", "Measure", "WorkloadMeasure", "average_states",
           "consensus_distance", "has_batchnorm"]

WORKER_EVAL_PERIOD = 5

BN_SAMPLES = 1024
"""Training samples an averaged model's BatchNorm statistics are recomputed from (in the
workload's batches); a fixed sample, the same for every consensus model of a run."""

#: The share of one core the evaluator may use while workers run: an evaluation that used c
#: seconds of CPU is followed by the next one c / CPU_SHARE seconds after it started, at the
#: earliest. On the 2-core machine the suites run on, more would take CPU from the workers it
#: measures.
CPU_SHARE = 0.5


def consensus_distance(states: list[dict[str, torch.Tensor]]) -> float:
    """Mean over workers of the squared distance of their models to the average model."""
    keys = [k for k, v in states[0].items() if v.is_floating_point()]
    flat = torch.stack([torch.cat([s[k].double().reshape(-1) for k in keys]) for s in states])
    return float(((flat - flat.mean(0)) ** 2).sum(1).mean())


def average_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts (integer buffers are rounded back)."""
    averaged = {}
    for key, first in states[0].items():
        stacked = torch.stack([s[key].double() for s in states])
        mean = stacked.mean(0)
        averaged[key] = mean.round().to(first.dtype) if not first.is_floating_point() else (
            mean.to(first.dtype)
        )
    return averaged


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Measure(Protocol):
    """Loss and accuracy of a model state: the whole held-out split, or a fixed subset."""

    def __call__(
        self, state: dict[str, torch.Tensor], subset: bool, averaged: bool = False
    ) -> tuple[float | None, float | None]:
        """`averaged`: `state` is an average of models (its BatchNorm statistics are not
        its own)."""


class WorkloadMeasure:
    """A built-in workload's held-out split, measured with its loss and accuracy."""

    def __init__(self, workload: Workload, eval_samples: int, data_dir: Path | None = None,
                 device: str = "cpu", recompute_bn: bool = True) -> None:
        """`device`: where to evaluate; the workers' device where they compute on a GPU, since
        a full-width ResNet-18 takes the CPU minutes per held-out pass and seconds on a GPU.
        `recompute_bn`: an averaged model's BatchNorm statistics are recomputed (the module's
        doc) where the model has any."""
        data = workload.load(data_dir)
        self.test_x, self.test_y = data.test_x.to(device), data.test_y.to(device)
        order = torch.randperm(len(self.test_y), generator=torch.Generator().manual_seed(0))
        self.subset = order[: min(eval_samples, len(order))].to(device)
        self.workload = workload
        self.model: nn.Module = workload.build_model().to(device)
        self.bn_batches: list[torch.Tensor] = []
        """The training batches an averaged model's BatchNorm statistics come from; none where
        they are not recomputed."""
        if recompute_bn and has_batchnorm(self.model):
            picked = torch.randperm(len(data.train_y), generator=torch.Generator().manual_seed(1))
            sample = data.train_x[picked[:BN_SAMPLES]].to(device)
            self.bn_batches = list(sample.split(workload.batch_size))

    @torch.no_grad()
    def __call__(self, state: dict[str, torch.Tensor], subset: bool,
                 averaged: bool = False) -> tuple[float, float]:
        self.model.load_state_dict(state)
        if averaged and self.bn_batches:
            update_bn(self.bn_batches, self.model)
        self.model.eval()
        x = self.test_x[self.subset] if subset else self.test_x
        y = self.test_y[self.subset] if subset else self.test_y
        total_loss, correct = 0.0, 0
        for start in range(0, len(y), 1000):
            out = self.model(x[start : start + 1000])
            target = y[start : start + 1000]
            total_loss += float(self.workload.loss(out, target)) * len(target)
            correct += self.workload.correct(out, target)
        return total_loss / len(y), correct / len(y)


def has_batchnorm(model: nn.Module) -> bool:
    """Whether `model` keeps BatchNorm running statistics."""
    return any(isinstance(m, _BatchNorm) and m.track_running_stats for m in model.modules())


class Evaluator:
    """Turns `snapshots/` into rows of `eval.jsonl` (see docs/run-directory.md)."""

    def __init__(
        self,
        run_dir: Path,
        world: int,
        measure: Measure | None,
        per_worker: bool = True,
        keep_snapshots: bool = False,
        on_consensus: Callable[[float, float], None] | None = None,
        target_loss: float | None = None,
    ) -> None:
        """`measure` None: rows carry only the consensus distance (a script without an
        evaluation function). `target_loss`: the loss whose first crossing is bisected."""
        self.run_dir, self.world, self.measure = run_dir, world, measure
        self.ranks = list(range(world))
        """The workers whose snapshots make a set: all but those lost (`lose`)."""
        self.per_worker = per_worker and measure is not None
        self.keep = keep_snapshots
        self.on_consensus = on_consensus
        self.target_loss = target_loss
        self._out = (run_dir / "eval.jsonl").open("a")
        self.latest_loss: float | None = None
        self._sets_evaluated = 0
        self._last_index: str | None = None
        """The newest consensus set evaluated (the lower end of a crossing's bracket)."""
        self._crossed = target_loss is None or measure is None
        self._next_due = 0.0
        self._newest: tuple[dict[str, torch.Tensor], tuple[float | None, float | None]] | None = (
            None)
        """The newest set's consensus model and its measure: the final set is often the same
        models (a run that ends right after a snapshot), and a full evaluation costs seconds."""

    def lose(self, rank: int) -> None:
        """Go on without `rank` (`--on-failure continue`): later sets, and any still waiting
        for its snapshot, are the consensus of the others."""
        self.ranks = [r for r in self.ranks if r != rank]

    def rejoin(self, rank: int) -> None:
        """`rank` is back (`--on-failure rejoin`): later sets count it again."""
        self.ranks = sorted({*self.ranks, rank})

    @classmethod
    def for_workload(
        cls, run_dir: Path, workload: Workload, world: int, eval_samples: int,
        data_dir: Path | None = None, device: str = "cpu", recompute_bn: bool = True,
        **options: Any,
    ) -> Evaluator:
        measure = WorkloadMeasure(workload, eval_samples, data_dir, device, recompute_bn)
        return cls(run_dir, world, measure, **options)

    def poll(self, every_set: bool = False, throttle: bool = True) -> int:
        """Evaluate the newest complete snapshot set (or all, post hoc) and drop the evaluated
        and older ones, unless `CPU_SHARE` says to wait. Returns the number of sets evaluated."""
        complete = self._complete_indexes()
        if throttle and not every_set and time.monotonic() < self._next_due:
            if self._crossed:  # else the skipped sets are kept: the crossing may be among them
                for index in complete[:-1]:
                    self._discard(index)
            return 0
        started, cpu = time.monotonic(), time.thread_time()
        chosen = complete if every_set else complete[-1:]
        for index in chosen:
            skipped = [n for n in complete if (self._last_index or "") < n < index]
            if self._crossed_at(self._evaluate_set(index)["loss"]):
                self._bisect(skipped)
            self._last_index = index
        for index in complete:
            self._discard(index)
        self._next_due = started + (time.thread_time() - cpu) / CPU_SHARE
        return len(chosen)

    def _crossed_at(self, loss: float | None) -> bool:
        """Whether `loss` is the first consensus loss at or below the target."""
        if self._crossed or loss is None or self.target_loss is None or loss > self.target_loss:
            return False
        self._crossed = True
        return True

    def _bisect(self, between: list[str]) -> None:
        """Narrow the crossing down to two consecutive sets of `between` (the sets after the
        last evaluation above the target, before the first at or below it)."""
        assert self.target_loss is not None
        above, below = -1, len(between)
        while below - above > 1:
            middle = (above + below) // 2
            loss = self._evaluate_set(between[middle], extras=False)["loss"]
            if loss is not None and loss <= self.target_loss:
                below = middle
            else:
                above = middle

    def finish(self, every_set: bool = False) -> dict[str, float] | None:
        """Evaluate what is left, then the final models on the whole held-out split."""
        self.poll(every_set, throttle=False)
        if not all(snapshot_path(self.run_dir, "final", r).is_file() for r in self.ranks):
            self._out.close()
            return None
        row = self._evaluate_set("final")
        self._discard("final")
        self._out.close()
        if not self.keep:
            shutil.rmtree(self.run_dir / "snapshots", ignore_errors=True)
        return row

    def _complete_indexes(self) -> list[str]:
        root = self.run_dir / "snapshots"
        if not root.is_dir():
            return []
        names = sorted(p.name for p in root.iterdir() if p.name.isdigit())
        return [
            n for n in names
            if all(snapshot_path(self.run_dir, n, r).is_file() for r in self.ranks)
        ]

    def _evaluate_set(self, index: str, extras: bool = True) -> dict[str, Any]:
        """One row for the consensus of set `index`. `extras` False (a bisection's look back):
        no workers' own models, no `on_consensus`, no progress-bar loss."""
        ranks = self.ranks
        loaded = [torch.load(snapshot_path(self.run_dir, index, r)) for r in ranks]
        states = [item["state"] for item in loaded]
        iterations = [int(item["iteration"]) for item in loaded]
        t = max(float(item.get("t", 0.0)) for item in loaded)
        average = average_states(states)
        name = "final" if index == "final" else "consensus"
        newest = self._newest
        if name == "final" and newest is not None and _same_state(average, newest[0]):
            loss, accuracy = newest[1]  # the run ended right after its last snapshot
        else:
            loss, accuracy = self._measure(average, subset=False, averaged=True)
        if extras and name == "consensus":
            self._newest = (average, (loss, accuracy))
        row = {"t": t, "model": name, "loss": loss, "accuracy": accuracy, "iterations": iterations,
               "consensus_distance": consensus_distance(states)}
        if len(ranks) < self.world:
            row["ranks"] = ranks
        self._write(row)
        if not extras:
            return row
        if name == "consensus" and loss is not None:
            self.latest_loss = loss
            if self.on_consensus is not None:
                self.on_consensus(t, loss)
        due = self._sets_evaluated % WORKER_EVAL_PERIOD == 0
        if self.per_worker and name == "consensus" and due:
            for rank, state in zip(ranks, states, strict=True):
                w_loss, w_acc = self._measure(state, subset=True)
                self._write({**row, "model": f"rank{rank}", "loss": w_loss, "accuracy": w_acc})
        self._sets_evaluated += 1
        return row

    def _measure(
        self, state: dict[str, torch.Tensor], subset: bool, averaged: bool = False
    ) -> tuple[float | None, float | None]:
        """The loss and accuracy of `state`; a NaN or infinite one (a diverged model) is None,
        so it is written as null and never taken for a loss at or below the target."""
        if self.measure is None:
            return None, None
        loss, accuracy = self.measure(state, subset, averaged)
        return strict_json.finite(loss), strict_json.finite(accuracy)

    def _write(self, row: dict[str, object]) -> None:
        self._out.write(strict_json.dumps(row) + "\n")
        self._out.flush()

    def _discard(self, index: str) -> None:
        if not self.keep:
            shutil.rmtree(self.run_dir / "snapshots" / index, ignore_errors=True)
