"""Parameter server: real multi-process runs in both modes, plus its server object alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.launch.launcher import run
from hetsync.metrics.summary import read_jsonl
from hetsync.network.emulator import FreeNetwork
from hetsync.protocols.ps.core import PSServerCore
from hetsync.protocols.ps.server import LocalPush, Server
from hetsync.protocols.ps.wire import PushHeader
from hetsync.transport.channel import Channel
from hetsync.transport.links import Link
from hetsync.transport.lost_workers import LOST_KEY, LostWorkers
from hetsync.transport.runtime import Runtime

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parents[1] / "scripts"


def _launch(script: str, out: Path, **options: object) -> None:
    out.mkdir()
    run(RunConfig(script=[str(SCRIPTS / script), str(out)], out=out, quiet=True,
                  hang_timeout=20.0, device="cpu", **options))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _server(optimizer: torch.optim.Optimizer, buffers: list[torch.Tensor], core: PSServerCore,
            lost: LostWorkers | None = None) -> Server:
    """A server on rank 0 of a run of one process, with no process group and no network."""
    runtime = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                      backend="gloo", config=RunConfig(protocol="ps"), store=dist.HashStore(),
                      t0=time.time(), run_dir=None, launched=False, hang_timeout=20.0,
                      lost=lost)
    return Server(optimizer, buffers, core, Channel(Link.default(), runtime, FreeNetwork()))


def _push(server: Server, grad: list[float], version: int = 0,
          delta: tuple[float, ...] = ()) -> torch.Tensor:
    """A push as a worker sends it: kind, version and vote as int64 words, then its values."""
    return server.channel.link.pack(server.frame, (1, version, 0),
                                    [torch.tensor([*grad, *delta])])


def _round(server: Server, push: torch.Tensor | LocalPush) -> torch.Tensor:
    """Rank 0's push and the reply it waits for."""
    server.push(push)
    return server.reply()


def _read(server: Server, reply: torch.Tensor) -> list[float]:
    """A reply's header words (version, staleness, stop), then its values."""
    return [*server.frame.header(reply), *server.frame.payload(reply).tolist()]


def test_sync_workers_hold_the_server_model_and_stop_together(train_run):
    result = train_run(protocol="ps", ps_mode="sync", workers=3, max_iterations=60,
                       stop_at_target=False)
    summary = result.summary
    assert summary["iterations"] == [60] * 3
    assert summary["stop_reason"] == "max_iterations"
    for rank in range(3):
        rows = read_jsonl(result.run_dir / "workers" / f"rank{rank}.jsonl")
        losses = [row["loss"] for row in rows]
        assert _mean(losses[-10:]) < 0.6 * _mean(losses[:10])
        assert all(row["staleness"] == 0 for row in rows)
    assert summary["final_accuracy"] > 0.7
    assert read_jsonl(result.run_dir / "eval.jsonl")[-1]["consensus_distance"] < 1e-10


def test_async_workers_go_at_their_own_pace_with_stale_gradients(train_run):
    result = train_run(protocol="ps", ps_mode="async", workers=4,
                       slowdown="deterministic:ranks=3,factor=4", step_time=10.0, max_time=8,
                       stop_at_target=False)
    iterations = result.summary["iterations"]
    assert result.summary["stop_reason"] == "max_time"
    assert iterations[3] < 0.6 * iterations[1]
    for rank in range(4):
        rows = read_jsonl(result.run_dir / "workers" / f"rank{rank}.jsonl")
        assert len(rows) == iterations[rank]
        assert all(row["staleness"] >= 0 for row in rows)
        if rank != 3:
            assert any(row["staleness"] > 0 for row in rows)
        losses = [row["loss"] for row in rows]
        assert _mean(losses[-10:]) < 0.6 * _mean(losses[:10])
    assert result.summary["final_accuracy"] > 0.7


def test_backup_workers_leave_the_straggler_behind_and_count_its_dropped_gradients(
        train_run, loss_fell):
    result = train_run(protocol="ps", ps_mode="sync", ps_backup=1, workers=4, step_time=20.0,
                       slowdown="deterministic:ranks=3,factor=5", max_time=4,
                       stop_at_target=False)
    summary = result.summary
    assert min(summary["iterations"][:3]) > 2 * summary["iterations"][3]
    assert summary["dropped_gradients"] > 0
    assert summary["final_consensus_distance"] < 1e-10  # all end on the server's model
    assert loss_fell(result)


@pytest.mark.parametrize(("options", "match"), [
    ({"ps_mode": "async", "ps_backup": 1}, "--ps-backup applies to --ps-mode sync"),
    ({"ps_backup": 4}, "--ps-backup must be < --workers 4"),
    ({"ps_backup": -1}, "--ps-backup must not be negative"),
    ({"protocol": "allreduce", "ps_backup": 1}, "--ps-backup applies to --protocol ps"),
])
def test_ps_backup_is_checked_before_starting(options, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**{"protocol": "ps", "workers": 4, "workload": "digits", **options}).validate()


@pytest.mark.parametrize("sync", [True, False])
def test_server_applies_each_push_with_the_worker_optimizer(sync):
    param = nn.Parameter(torch.tensor([1.0, 2.0]))
    buffer = torch.tensor([5.0])
    server = _server(torch.optim.SGD([param], lr=0.5), [buffer],
                     PSServerCore(1, "sync" if sync else "async"))
    reply = _round(server, _push(server, [2.0, -2.0], delta=(1.5,)))
    assert _read(server, reply) == [1.0, 0.0, 0.0, 0.0, 3.0, 6.5]
    server.close()


@pytest.mark.parametrize("sync", [True, False])
def test_rank_0_s_tensors_pushed_as_they_are_step_the_server_as_its_packed_message(sync):
    # Rank 0 hands the server its gradients and buffer change unpacked (`LocalPush`): the
    # server's model after a few rounds is the one packed messages give, bit for bit.
    generator = torch.Generator().manual_seed(0)
    shapes = [(3, 5), (7,), (2, 2, 2)]
    start = [torch.randn(shape, generator=generator) for shape in shapes]
    pushes = [([torch.randn(shape, generator=generator) for shape in shapes],
               torch.randn(4, generator=generator)) for _ in range(3)]
    replies = []
    for unpacked in (False, True):
        params = [nn.Parameter(t.clone()) for t in start]
        server = _server(torch.optim.SGD(params, lr=0.3, momentum=0.9), [torch.zeros(4)],
                         PSServerCore(1, "sync" if sync else "async"))
        for version, (grads, delta) in enumerate(pushes):
            header = PushHeader(version, False)
            assert server.takes_tensors(grads)
            push = (LocalPush(header, grads, delta) if unpacked
                    else server.channel.link.pack(server.frame, header.encode(), [*grads, delta]))
            reply = _round(server, push)
            server.release(reply)
        replies.append(reply.clone())
        server.close()
    assert torch.equal(replies[0], replies[1])


def test_a_server_of_parameters_of_two_dtypes_steps_them_from_the_mean_too():
    # The gradients are views of the summed one where every parameter has its dtype; where
    # not (a float64 parameter beside float32 ones) the mean is copied into each.
    weight, scale = nn.Parameter(torch.tensor([1.0, 2.0])), nn.Parameter(torch.tensor([4.0],
                                                                           dtype=torch.float64))
    server = _server(torch.optim.SGD([weight, scale], lr=0.5), [], PSServerCore(1))
    reply = _round(server, _push(server, [2.0, -2.0, 1.0]))
    assert _read(server, reply) == [1.0, 0.0, 0.0, 0.0, 3.0, 3.5]
    reply = _round(server, _push(server, [2.0, 2.0, 2.0], version=1))  # the sums start afresh
    assert _read(server, reply) == [2.0, 0.0, 0.0, -1.0, 2.0, 2.5]
    server.close()


def test_rank_0_takes_its_reply_after_the_remote_ones_are_sent_even_if_one_fails(monkeypatch):
    param = nn.Parameter(torch.zeros(2))
    server = _server(torch.optim.SGD([param], lr=0.1), [], PSServerCore(1))
    seen: list[tuple[int, bool]] = []

    def send(reply: torch.Tensor, rank: int, tag: int = 0) -> None:
        seen.append((rank, server.local_reply is not None))
        if rank == 2:
            raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(server.channel.link, "send", send)
    local = torch.zeros(4)
    with pytest.raises(RuntimeError, match="closed by peer"):
        server._send([(1, torch.zeros(4)), (2, torch.zeros(4)), (0, local)])
    assert seen == [(1, False), (2, False)]  # rank 0's reply was not out during the sends
    assert server.local_reply is local  # and is out after them, though one failed
    server.close()


def test_server_steps_each_group_with_the_workers_current_hyper_parameters():
    weight, bias = nn.Parameter(torch.tensor([1.0])), nn.Parameter(torch.tensor([1.0]))
    worker = torch.optim.SGD([{"params": [weight], "weight_decay": 1.0},
                              {"params": [bias], "weight_decay": 0.0}], lr=0.5)
    server = _server(worker, [], PSServerCore(1))
    assert _read(server, _round(server, _push(server, [0.0, 0.0]))) == [1.0, 0.0, 0.0, 0.5, 1.0]
    for group in worker.param_groups:  # as a scheduler does, after the optimizer was wrapped
        group["lr"] = 0.1
    reply = _round(server, _push(server, [1.0, 1.0], version=1))
    assert _read(server, reply) == pytest.approx([2.0, 0.0, 0.0, 0.35, 0.9])
    server.close()


def test_async_pushes_of_a_round_move_an_adam_model_as_far_as_one_sync_step():
    # n pushes at 1/n of the rate: one step's worth, for Adam too (scaling the gradient by
    # 1/n instead would take n full Adam steps, since Adam normalises the gradient away).
    param = nn.Parameter(torch.zeros(2))
    server = _server(torch.optim.Adam([param], lr=0.1), [], PSServerCore(2, "async"))
    with server.cond:  # the serving thread died at once (no process group); pushes go direct
        for version in range(2):
            server._accept(_push(server, [1.0, -2.0], version=version), 1)
    assert server.params[0].tolist() == pytest.approx([-0.1, 0.1], rel=1e-3)


def test_the_servers_host_copy_drops_a_gpu_optimizers_gpu_only_settings():
    # A GPU model's Adam may be capturable (CUDA graphs) and take its lr as a tensor: the
    # server steps its copy on the host, where capturable would fail at the first step.
    param = nn.Parameter(torch.zeros(2))
    betas = (torch.tensor(0.9), torch.tensor(0.999))
    adam = torch.optim.Adam([param], lr=torch.tensor(0.1), betas=betas, capturable=True)
    server = _server(adam, [], PSServerCore(2, "async"))
    hyper = server.optimizer.param_groups[0]
    assert hyper["capturable"] is False and hyper["lr"] == pytest.approx(0.1)
    assert hyper["betas"] == pytest.approx((0.9, 0.999))
    with server.cond:
        for version in range(2):
            server._accept(_push(server, [1.0, -2.0], version=version), 1)
    assert server.params[0].tolist() == pytest.approx([-0.1, 0.1], rel=1e-3)


def test_a_dead_server_thread_is_reported_not_waited_for():
    # No process group: the serving thread's first receive fails.
    param = nn.Parameter(torch.zeros(2))
    server = _server(torch.optim.SGD([param], lr=0.1), [], PSServerCore(2))
    with pytest.raises(RuntimeError, match="parameter server thread died"):
        _round(server, _push(server, [1.0, 1.0]))


def test_a_reply_to_a_worker_that_just_died_neither_deadlocks_nor_misses_its_loss(monkeypatch):
    # Snippet 6 of review 3: the reply to rank 2 fails (its process died); the launcher has
    # just declared it lost. The server's loss handling also sends replies, under the same
    # lock as this failed send: it must run on the watcher thread, after the lock is let go.
    param = nn.Parameter(torch.zeros(2))
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=3, confirm_timeout=5.0)
    server = _server(torch.optim.SGD([param], lr=0.1), [], PSServerCore(1), lost)
    server.core, server.remote = PSServerCore(3, "sync"), {1, 2}

    def closed(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(dist, "isend", closed)
    store.set(LOST_KEY, "2")
    sender = threading.Thread(target=server._send, args=([(2, torch.zeros(4))],), daemon=True)
    sender.start()
    sender.join(timeout=5.0)
    assert not sender.is_alive(), "the reply to a lost worker deadlocked the server"
    deadline = time.monotonic() + 5.0
    while server.remote != {1} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.remote == {1}  # the watcher told the server: rounds no longer wait for 2
    assert server.send_lock.acquire(timeout=1.0)
    lost.close()


def test_sync_follows_param_groups_and_the_workers_lr_schedule_like_allreduce(tmp_path):
    # Two param groups (weight decay on weights only) and StepLR on the worker's optimizer:
    # the server must step with the same groups and the current lr, as allreduce does.
    finals = {}
    for protocol in ("ps", "allreduce"):
        _launch("schedule.py", tmp_path / protocol, protocol=protocol, workers=2,
                max_iterations=8)
        finals[protocol] = [torch.load(tmp_path / protocol / f"final_rank{r}.pt")
                            for r in range(2)]
    for ps_model, allreduce_model in zip(finals["ps"], finals["allreduce"], strict=True):
        assert torch.equal(ps_model, finals["ps"][0])  # sync: every worker holds the server's
        assert torch.allclose(ps_model, allreduce_model, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_batchnorm_running_statistics_are_shared_through_the_server(tmp_path, mode):
    # Rank r's batches have mean 2r: running means kept locally differ by rank. Paced, so
    # that async workers finish within a few server versions of each other.
    _launch("batchnorm.py", tmp_path / mode, protocol="ps", ps_mode=mode, workers=2,
            max_iterations=20, step_time=50.0)
    saved = [torch.load(tmp_path / mode / f"running_mean_rank{r}.pt") for r in range(2)]
    shared = torch.stack([s["shared"] for s in saved])
    local = torch.stack([s["local"] for s in saved])
    assert (shared.abs().max(1).values > 0.2).all()  # every worker's moved from its initial 0
    spread = (shared - shared.mean(0)).abs().max()
    assert spread < 0.3 * (local - local.mean(0)).abs().max()
    if mode == "sync":
        assert spread == 0


@pytest.mark.slow  # two launches: about 20 s of CPU
def test_a_resumed_run_starts_every_worker_from_the_servers_saved_model(tmp_path):
    # Each worker checkpoints a different version (async); on resume every worker, not only
    # rank 0, must hold the server's model, or its first gradient, computed on its own older
    # model, is applied as a fresh one.
    files = tmp_path / "files"
    files.mkdir()
    for phase in ("save", "resume"):
        run(RunConfig(script=[str(SCRIPTS / "ps_resume.py"), str(files), phase], workers=2,
                      protocol="ps", ps_mode="async", max_iterations=12, out=tmp_path / phase,
                      quiet=True, hang_timeout=20.0, device="cpu"))
    server = torch.load(files / "ckpt_rank0.pt", weights_only=False)
    server = server["optimizer"]["hetsync"]["protocol"]["server"]
    expected = torch.cat([*(p.reshape(-1) for p in server["params"]), server["buffers"]])
    for rank in range(2):
        assert torch.equal(torch.load(files / f"loaded_rank{rank}.pt"), expected), rank
