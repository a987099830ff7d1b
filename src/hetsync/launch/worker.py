"""The training loop of hetsync's built-in workloads, written against the public API.

Run as `python -m hetsync.launch.worker` by the launcher, or under torchrun through
`hetsync train` (which detects torchrun's environment and runs this loop directly).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hetsync
from hetsync.api import SyncOptimizer
from hetsync.config import RunConfig
from hetsync.data import DynamicSampler
from hetsync.errors import ConfigError
from hetsync.faults import FaultPlan, parse_faults
from hetsync.launch.checkpoint import (
    ENV_RESUME_AT,
    ENV_RESUME_BASE,
    Checkpointer,
    checkpoint_path,
    prepare_resume,
)
from hetsync.malloc_settings import keep_freed_memory
from hetsync.metrics.evaluator import Evaluator
from hetsync.metrics.summary import summarize, write_summary
from hetsync.transport.lost_workers import LOST_KEY
from hetsync.transport.runtime import Runtime
from hetsync.workloads import Shard, get_workload


def train(config: RunConfig | None = None) -> SyncOptimizer:
    """Train the configured workload until the run's stop conditions agree to stop."""
    runtime = hetsync.init(**config.to_dict()) if config else hetsync.init()
    config = runtime.config
    workload = get_workload(config.workload)
    torch.manual_seed(config.seed)  # the same initial model on every worker
    model = workload.build_model().to(runtime.device)
    data = workload.load(config.data_dir)
    batch_size = config.batch_size or workload.batch_size
    shard = Shard(len(data.train_y), runtime.rank, runtime.world_size, config.seed)
    inner = torch.optim.SGD(
        model.parameters(),
        lr=config.lr if config.lr is not None else workload.lr,
        momentum=config.momentum if config.momentum is not None else workload.momentum,
        fused=True,  # one pass over the model, not three: mlp-wide's step 8 -> 5 ms on one core
    )
    lost = _lost_before_resume(runtime)
    saved = _saved(runtime) if ENV_RESUME_AT in os.environ and not lost else None
    sampler = None
    if config.sampler == "dynamic":  # any sample may come to this worker: it keeps them all
        sampler = DynamicSampler(range(len(data.train_y)), seed=config.seed, drop_last=True,
                                 batch_size=batch_size, name="train")
        if saved is not None:  # before the optimizer's collectives: every worker's counters
            sampler.load_state_dict(saved["data"]["sampler"])  # raised before anyone claims
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = _dealt(
            data.train_x, data.train_y, batch_size, sampler, config.epochs)
    else:
        # Gathered before the run's clock starts (in SyncOptimizer), not in the first step: a
        # worker alone gathers Fashion-MNIST's 188 MB in 0.5 s of CPU, 2.2 s at a quarter
        # core, and Hop's staleness bound made a quarter-core straggler's neighbours wait.
        local = shard.take(data.train_x, data.train_y)
    del data  # static: the shard is all this worker reads (dynamic: _dealt keeps the set)
    opt = hetsync.SyncOptimizer(inner, model, snapshots=True)
    if lost:
        os._exit(0)  # leave at once, as a lost worker left: no steps, rows or snapshots
    per_epoch = shard.batches_per_epoch(batch_size)
    if saved is not None:
        epoch, batch = _resume(opt, model, saved)
    else:  # a restarted worker goes on in its shard where the others are in theirs
        epoch, batch = divmod(opt.iteration, per_epoch) if runtime.rejoining else (0, 0)
    drawn = epoch * per_epoch + batch
    if config.sampler == "static":
        batches = itertools.islice(local.batches(batch_size, epoch, batch), None
                                   if config.epochs is None else config.epochs * per_epoch - drawn)
    checkpoints = None
    if config.checkpoint_every is not None and runtime.run_dir is not None:
        checkpoints = Checkpointer(runtime.run_dir, runtime.rank, config.checkpoint_every,
                                   runtime.elapsed())
    faults = FaultPlan(parse_faults(config.fault))  # --fault's raise and hang (kill, stop:
    while not opt.should_stop:                      # the launcher's)
        x, y = next(batches, (None, None))
        if x is None or y is None:  # --epochs ran out
            break
        drawn += 1
        opt.zero_grad()
        loss = workload.loss(opt.model(x.to(runtime.device)), y.to(runtime.device))
        loss.backward()
        fault = faults.inside_due(runtime.rank, opt.iteration + 1, runtime.elapsed())
        if fault is not None:
            fault.act()
        opt.step(loss=loss)
        elapsed = runtime.elapsed()
        if checkpoints is not None and not opt.should_stop and checkpoints.due(elapsed):
            checkpoints.write(_checkpoint(opt, model, shard.position(drawn, batch_size),
                                          sampler), elapsed)
    opt.close()
    return opt


def _dealt(x: torch.Tensor, y: torch.Tensor, batch_size: int, sampler: DynamicSampler,
           epochs: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of (x, y) as `sampler` deals them to this worker, epoch after epoch from its
    own (`epochs` of them, or endless): whole batches only (its `drop_last`), as a static
    shard's, so that every step costs the same."""
    first = sampler.epoch  # a resumed one goes on within its pass
    for epoch in range(first, epochs) if epochs is not None else itertools.count(first):
        if epoch != sampler.epoch:
            sampler.set_epoch(epoch)
        indices = iter(sampler)
        while len(take := list(itertools.islice(indices, batch_size))) == batch_size:
            yield x[take], y[take]


def _checkpoint(opt: SyncOptimizer, model: nn.Module, position: tuple[int, int],
                sampler: DynamicSampler | None) -> dict[str, Any]:
    """What `_resume` needs to go on from this iteration boundary (with `--sampler dynamic`,
    how far the epoch was dealt)."""
    optimizer = opt.state_dict()
    with opt.protocol.model_lock():  # a copy no other thread writes into meanwhile (AD-PSGD)
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {
        "iteration": opt.iteration,
        "t": optimizer["hetsync"]["elapsed"],
        "model": state,
        "optimizer": optimizer,
        "data": {"epoch": position[0], "batch": position[1],
                 "sampler": sampler.state_dict() if sampler is not None else None},
        "rng": torch.get_rng_state(),
    }


def _lost_before_resume(runtime: Runtime) -> bool:
    """Whether this rank is one that the run lost before this resume: the launcher spawned
    it so that every rank forms the process group (and the model's broadcast and the clock's
    barrier in building the optimizer), and declared it lost from the start."""
    store = runtime.store
    return (ENV_RESUME_AT in os.environ and runtime.lost is not None
            and store.check([LOST_KEY])
            and str(runtime.rank) in store.get(LOST_KEY).decode().split(","))


def _saved(runtime: Runtime) -> dict[str, Any]:
    """This worker's checkpoint, on the host: the loads in `_resume` move each tensor where it
    belongs (the optimizer keeps a non-capturable Adam's `step` on the CPU, where each step
    reads it without a GPU sync)."""
    assert runtime.run_dir is not None
    return torch.load(checkpoint_path(runtime.run_dir, runtime.rank), weights_only=False,
                      map_location="cpu")


def _resume(opt: SyncOptimizer, model: nn.Module, saved: dict[str, Any]) -> tuple[int, int]:
    """Load this worker's checkpoint `saved`; every worker goes on at the launcher's run time,
    its steps counted from the launcher's common base (hetsync.launch.checkpoint). Returns
    the data position to go on from."""
    model.load_state_dict(saved["model"])
    saved["optimizer"]["hetsync"]["elapsed"] = float(os.environ[ENV_RESUME_AT])
    saved["optimizer"]["hetsync"]["base"] = int(os.environ[ENV_RESUME_BASE])
    opt.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"].cpu())
    return saved["data"]["epoch"], saved["data"]["batch"]


#: Set by torchrun's elastic agent in every worker: 0 at the first start, k after k restarts.
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
#: The store key (per restart: torch prefixes the agent's store by attempt) where rank 0 says
#: whether and where a restarted torchrun run goes on.
_RESUME_KEY = "torchrun_resume"


def run_under_torchrun(config: RunConfig) -> None:
    """`hetsync train` under torchrun: no launcher, so rank 0 evaluates and summarises. After
    the elastic agent restarted the workers (`--max-restarts`), they go on from the run's
    checkpoints by themselves (`_resume_after_restart`)."""
    keep_freed_memory()  # what the launcher's variables give its workers (hetsync.malloc_settings)
    restart = int(os.environ.get(ENV_RESTART_COUNT, "0") or 0)
    resumed: dict[str, Any] | None = None
    if restart > 0:
        # A fault is not repeated, as under `--resume`: it was the test of the start before
        # (an iteration's `raise` would fire again after the resume, and spend every restart).
        config = dataclasses.replace(config, fault="none")
    try:
        if restart > 0:
            given_out = config.out is not None
            runtime = hetsync.init(**config.to_dict())  # train() finds it joined
            resumed = _resume_after_restart(runtime, restart, given_out)
        opt = train(config)
        runtime = opt.runtime
        out = runtime.run_dir  # `out`, or the directory rank 0 named for every rank
        assert out is not None
        if runtime.world_size > 1:
            runtime.links.direct.barrier()
        if runtime.rank == 0:
            config = runtime.config  # its `workers` is torchrun's world size
            (out / "config.json").write_text(config.to_json() + "\n")
            evaluator = Evaluator.for_workload(
                out, get_workload(config.workload), runtime.world_size, config.eval_samples,
                data_dir=config.data_dir, device=str(runtime.device),
                recompute_bn=config.eval_bn == "recompute", keep_snapshots=config.keep_snapshots,
            )
            evaluator.finish(every_set=True)
            summary = summarize(out, config, opt.stop_reason)
            if resumed is not None:
                summary["resumed_from"] = [resumed]
            write_summary(out, summary)
    finally:
        hetsync.shutdown()


def _resume_after_restart(runtime: Runtime, restart: int,
                          given_out: bool) -> dict[str, Any] | None:
    """After torchrun's agent restarted every worker (restart `restart`): rank 0 decides from
    the run's checkpoints, as `train --resume` does (`prepare_resume`: every rank has one, the
    limits leave something to do; then the evaluations after them trimmed), and tells every
    rank through the store; each then sets the resume's environment, which `train()` reads.
    Without checkpoints the run starts afresh, the start before's files removed. Returns the
    resume (summary.json's `resumed_from` entry), None on a fresh start."""
    store = runtime.store
    run_dir = runtime.run_dir
    assert run_dir is not None
    if runtime.rank == 0:
        decision = _decide_resume(run_dir, runtime.config, restart, given_out)
        store.set(_RESUME_KEY, json.dumps(decision))
        print(f"hetsync: {decision['note']}", file=sys.stderr, flush=True)
    else:  # the checkpoints are only read meanwhile: nobody trains before rank 0 has decided
        decision = json.loads(store.get(_RESUME_KEY).decode())
    if "at_s" not in decision:
        return None
    os.environ[ENV_RESUME_AT] = repr(float(decision["at_s"]))
    os.environ[ENV_RESUME_BASE] = str(int(decision["base"]))
    return {"at_s": decision["at_s"], "iterations": decision["iterations"], "restart": restart}


def _decide_resume(run_dir: Path, config: RunConfig, restart: int,
                   given_out: bool) -> dict[str, Any]:
    """Rank 0's decision for `_resume_after_restart`: where every worker goes on, or a fresh
    start, with the one line that says which."""
    again = f"torchrun restarted the workers (restart {restart})"
    if not given_out:
        return {"note": f"{again}: they cannot resume without --out (each start gets a new "
                        f"run directory): starting afresh in {run_dir}"}
    at, reason = None, ""
    if config.checkpoint_every is None:
        reason = "the run has no --checkpoint-every to resume from"
    else:
        try:
            at = prepare_resume(run_dir, config)
        except ConfigError as error:
            reason = str(error).removeprefix(f"--resume {run_dir}: ")
    if at is None:
        for name in ("checkpoints", "snapshots", "eval.jsonl", "summary.json"):
            path = run_dir / name  # the start before's, which this one would mix with its own
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        return {"note": f"{again}: {reason}; starting afresh in {run_dir}"}
    return {"at_s": at.at_s, "base": at.base, "iterations": at.iterations,
            "note": f"{again}: the run resumes from its checkpoints at run time "
                    f"{at.at_s:.2f} s (iterations {', '.join(map(str, at.iterations))})"}


def main() -> None:
    try:
        train()
    finally:
        hetsync.shutdown()


if __name__ == "__main__":
    main()
