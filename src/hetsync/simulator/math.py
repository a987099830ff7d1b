"""`--math`: the real numerical updates of every simulated worker, on real data.

All workers' parameters are one tensor of shape (workers, parameters), and so are their
momentum buffers and gradients: an average over a group is one indexed mean, and memory grows
as 3 x workers x parameters floats plus one buffered copy per update in flight (Hop's queues),
about 10 KB per worker for `svm`. The workload is `svm` (the linear SVM of hetsync.workloads:
hinge loss, L2 on the weight, SGD with momentum, each worker on its own shard of
Fashion-MNIST, exactly the minibatches a real worker of the same rank and seed draws); its
gradient is written out by hand, which is what makes a step cost microseconds rather than an
autograd pass. Other workloads are refused: their models are too large to hold per worker for
a thousand workers.

The protocol simulations call these operations where the real drivers touch the model
(gradient at the end of a step's compute, `step` where the optimizer steps, `average` for a
collective or a P-Reduce, `mix` for a weighted neighbourhood average of published models).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.transport.flat import flatten
from hetsync.transport.mixing import mix
from hetsync.workloads import SVM_L2, get_workload
from hetsync.workloads.datasets import DataSplit
from hetsync.workloads.sharding import Shard

__all__ = ["MATH_WORKLOADS", "MathModel"]

MATH_WORKLOADS = ("svm",)
_DATA: dict[tuple[str, Path | None], DataSplit] = {}  # loaded once per process (fuzzing runs many)


def check_math(config: RunConfig) -> None:
    """ConfigError unless `config`'s workload is one `MathModel` holds."""
    if config.workload not in MATH_WORKLOADS:
        raise ConfigError(f"--math supports --workload {', '.join(MATH_WORKLOADS)} (got "
                          f"{config.workload!r}): it holds every worker's model at once")


class MathModel:
    """Every worker's svm model, optimizer state and data position."""

    def __init__(self, config: RunConfig) -> None:
        check_math(config)
        # Each operation is tiny (a 64 x 785 product): a second intra-op thread only adds
        # hand-offs, which cost milliseconds on a busy machine instead of microseconds.
        torch.set_num_threads(1)
        workload = get_workload(config.workload)
        key = (config.workload, config.data_dir)
        data = _DATA[key] if key in _DATA else _DATA.setdefault(key, workload.load(config.data_dir))
        world = config.workers
        torch.manual_seed(config.seed)  # the same initial model as a real run's
        initial = flatten(list(workload.build_model().parameters())).detach()
        self.features = initial.numel() - 1
        self.x = initial.repeat(world, 1)
        """Row r: worker r's weight (all but the last entry) and bias (the last)."""
        self.momentum_buffer = torch.zeros_like(self.x)
        self.grad = torch.zeros_like(self.x)
        self.lr = float(config.lr if config.lr is not None else workload.lr)
        self.momentum = float(config.momentum if config.momentum is not None
                              else workload.momentum)
        self._stepped = [False] * world
        self.gradients = True
        """False: skip the gradients (they stay 0), for runs where only averaging matters
        (fuzzing with lr 0)."""
        self.last_loss: list[float | None] = [None] * world
        batch = config.batch_size or workload.batch_size
        n = len(data.train_y)
        self._batches: list[Iterator[tuple[torch.Tensor, torch.Tensor]]] = [
            Shard(n, r, world, config.seed).batches(data.train_x, data.train_y.float(), batch)
            for r in range(world)]
        self._test_x, self._test_y = data.test_x, data.test_y.float()
        self.published: dict[tuple[int, int], list[Any]] = {}
        self.copies: torch.Tensor | None = None
        self.handed: torch.Tensor | None = None
        """Prague with overlap: the copies the P-Reduces average, and each as last handed over."""
        self.sent: dict[int, torch.Tensor] = {}
        """A worker's model as it sent it in a request (AD-PSGD), by rank."""
        self.server = initial.clone()
        """The parameter server's model, its momentum buffer and its sum of pushed gradients."""
        self._server_buffer = torch.zeros_like(initial)
        self._server_sum = torch.zeros_like(initial)
        self._server_stepped = False

    # --- one worker ------------------------------------------------------------------------
    def gradient(self, rank: int, model: torch.Tensor | None = None) -> None:
        """The gradient of `rank`'s next minibatch at its model (or at `model`)."""
        if not self.gradients:
            return
        x, y = next(self._batches[rank])
        params = self.x[rank] if model is None else model
        w, b = params[:-1], params[-1]
        margin = y * (x @ w + b)
        active = (margin < 1).float() * y
        grad = self.grad[rank]
        grad[:-1] = -(active @ x) / len(y) + SVM_L2 * w
        grad[-1] = -active.sum() / len(y)
        self.last_loss[rank] = float(torch.clamp(1 - margin, min=0).mean())

    def step(self, rank: int, grad: torch.Tensor | None = None) -> None:
        """SGD with momentum, as torch.optim.SGD (no dampening): buf = m buf + g; x -= lr buf."""
        g = self.grad[rank] if grad is None else grad
        buf = self.momentum_buffer[rank]
        if self._stepped[rank]:
            buf.mul_(self.momentum).add_(g)
        else:
            buf.copy_(g)
            self._stepped[rank] = True
        self.x[rank].sub_(self.lr * buf)

    # --- averaging -------------------------------------------------------------------------
    def average(self, members: tuple[int, ...] | list[int]) -> None:
        """Every member's model becomes the members' mean (a collective, a P-Reduce)."""
        index = torch.tensor(members)
        self.x[index] = self.x[index].mean(0)

    def average_copies(self, members: tuple[int, ...] | list[int]) -> None:
        """A P-Reduce beside the compute (Prague's `--overlap`): the members' copies, not
        their models, become the mean."""
        assert self.copies is not None, "a copy is averaged only after its first merge"
        index = torch.tensor(members)
        self.copies[index] = self.copies[index].mean(0)

    def merge(self, rank: int) -> None:
        """Prague's `MergeModels`: x <- c + (x - s), then c = s = x; the first merge of any
        rank makes every worker's copy (as the real driver makes its own at its first)."""
        if self.copies is None or self.handed is None:
            self.copies, self.handed = self.x.clone(), self.x.clone()
        row = self.x[rank]
        row.sub_(self.handed[rank]).add_(self.copies[rank])
        self.copies[rank] = row
        self.handed[rank] = row

    def average_gradients(self, members: tuple[int, ...] | list[int]) -> None:
        index = torch.tensor(members)
        self.grad[index] = self.grad[index].mean(0)

    def publish(self, rank: int, tag: int, receivers: int) -> None:
        """Keep a copy of `rank`'s model as sent, tagged `tag`, until each of its `receivers`
        has dropped it (an update in flight, then in a receiver's queue). Published again
        while still kept (Hop's deferred update), it is the same message to more receivers."""
        if (entry := self.published.get((rank, tag))) is not None:
            entry[1] += receivers
        else:
            self.published[rank, tag] = [self.x[rank].clone(), receivers]

    def mix(self, rank: int, self_weight: float, weights: Mapping[int, float],
            inputs: Mapping[int, int]) -> None:
        """x_rank <- self_weight x_rank + sum_j weights[j] published(j, inputs[j])."""
        mix(self.x[rank], self_weight,
            [(self.published[src, tag][0], weights[src]) for src, tag in inputs.items()])

    def drop(self, src: int, tags: tuple[int, ...]) -> None:
        """One receiver is done with `src`'s updates `tags`."""
        for tag in tags:
            entry = self.published[src, tag]
            entry[1] -= 1
            if entry[1] == 0:
                del self.published[src, tag]

    # --- the parameter server -------------------------------------------------------------
    def accumulate(self, rank: int) -> None:
        """Add `rank`'s pushed gradient to the server's sum."""
        self._server_sum.add_(self.grad[rank])

    def apply(self, divisor: int, lr_scale: float) -> None:
        """The server's optimizer steps with the sum / `divisor` at lr x `lr_scale`."""
        g = self._server_sum / divisor
        if self._server_stepped:
            self._server_buffer.mul_(self.momentum).add_(g)
        else:
            self._server_buffer.copy_(g)
            self._server_stepped = True
        self.server.sub_(self.lr * lr_scale * self._server_buffer)
        self._server_sum.zero_()

    def load_server(self, rank: int) -> None:
        self.x[rank] = self.server

    # --- pairwise averaging (AD-PSGD) ------------------------------------------------------
    def send_model(self, rank: int) -> None:
        """`rank` sends its model in a request: what its partner will average with."""
        self.sent[rank] = self.x[rank].clone()

    def serve(self, rank: int, client: int) -> torch.Tensor:
        """x_rank <- (x_rank + client's sent model) / 2; the average, for the reply."""
        row = self.x[rank]
        mix(row, 0.5, [(self.sent.pop(client), 0.5)])
        return row.clone()

    def load(self, rank: int, model: torch.Tensor) -> None:
        self.x[rank] = model

    # --- evaluation ------------------------------------------------------------------------
    def evaluate(self, rows: Any = None) -> tuple[float, float]:
        """(hinge loss, accuracy) of the consensus model (the mean of `rows`, default all)
        on the whole held-out split, as the real evaluator measures it."""
        params = (self.x if rows is None else self.x[rows]).mean(0)
        out = self._test_x @ params[:-1] + params[-1]
        loss = float(torch.clamp(1 - self._test_y * out, min=0).mean())
        accuracy = float(((out >= 0).float() * 2 - 1 == self._test_y).float().mean())
        return loss, accuracy

    def consensus_distance(self, rows: Any = None) -> float:
        """Mean squared distance of the models of `rows` (default all) from their mean."""
        x = self.x if rows is None else self.x[rows]
        return float(((x - x.mean(0)) ** 2).sum(1).mean())
