"""SyncOptimizer where a torch optimizer is expected, in a world of one (this process)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import hetsync
from hetsync.api import SyncOptimizer
from hetsync.transport.runtime import current_runtime


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    hetsync.init(protocol="allreduce", device="cpu")  # the models here are on the CPU
    yield
    hetsync.shutdown()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)


def _train(opt: torch.optim.Optimizer, model: nn.Module, steps: int, scaler=None,
           scheduler=None, clip: float | None = None) -> None:
    for i in range(steps):
        x, y = _batch(i)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        if scheduler is not None:
            scheduler.step()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()
                      if t.is_floating_point()])


def _pair(**sgd: float) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, SyncOptimizer]:
    """A plain model and optimizer, and the same under hetsync."""
    plain, synced = _model(), _model()
    settings = {"lr": 0.1, "momentum": 0.9, **sgd}
    opt = torch.optim.SGD(plain.parameters(), **settings)
    _, sync = hetsync.prepare(synced, torch.optim.SGD(synced.parameters(), **settings))
    return plain, opt, synced, sync


def test_is_a_torch_optimizer_sharing_the_inner_groups():
    _, _, _, sync = _pair()
    assert isinstance(sync, torch.optim.Optimizer)
    assert sync.param_groups is sync.optimizer.param_groups
    assert sync.defaults["momentum"] == 0.9


@pytest.mark.parametrize("kind", ["step", "onecycle"])
def test_learning_rate_schedulers_drive_the_inner_optimizer(kind):
    plain, opt, synced, sync = _pair()

    def schedule(o: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        if kind == "step":
            return torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.1)
        return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=10)

    _train(opt, plain, 8, scheduler=schedule(opt))
    _train(sync, synced, 8, scheduler=schedule(sync))
    assert sync.optimizer.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    assert torch.allclose(_flat(synced), _flat(plain), atol=1e-6)


def test_grad_scaler_and_clipping_give_the_plain_result():
    plain, opt, synced, sync = _pair()
    _train(opt, plain, 6, clip=0.5)
    _train(sync, synced, 6, clip=0.5)
    assert torch.allclose(_flat(synced), _flat(plain), atol=1e-6)
    scaled = _model()
    _, sync2 = hetsync.prepare(scaled, torch.optim.SGD(scaled.parameters(), lr=0.1,
                                                       momentum=0.9))
    reference = _model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    _train(ref_opt, reference, 6)
    _train(sync2, scaled, 6, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    assert torch.allclose(_flat(scaled), _flat(reference), atol=1e-5)


def test_an_overflowing_gradient_is_not_applied_and_the_step_still_syncs():
    model = _model()
    _, sync = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(0)
    loss = nn.functional.cross_entropy(model(x), y) * float("inf")
    scaler.scale(loss).backward()
    iteration = sync.iteration
    scaler.step(sync)
    scaler.update()
    assert sync.iteration == iteration + 1  # the protocol's step ran
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() < 2.0**10


def test_state_dict_loads_into_a_plain_optimizer_and_back():
    plain, opt, synced, sync = _pair()
    _train(sync, synced, 3)
    state = sync.state_dict()
    opt.load_state_dict(state)
    assert opt.state_dict()["state"].keys() == state["state"].keys()
    sync.load_state_dict(opt.state_dict())
    assert sync.param_groups[0]["lr"] == 0.1


def test_step_after_the_stop_ends_the_script_cleanly_and_no_iteration_begins(capsys):
    """A loop that never reads `should_stop` ends at its next step: a SystemExit with status
    0 (no traceback, and a script's `except Exception` does not swallow it), said in one line."""
    model = _model()
    _, sync = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    sync.request_stop()
    _train(sync, model, 1)
    assert sync.should_stop and sync.stop_reason == "script"
    with pytest.raises(hetsync.RunStopped) as stopped:
        _train(sync, model, 1)
    assert isinstance(stopped.value, SystemExit) and not isinstance(stopped.value, Exception)
    assert stopped.value.code == 0 and stopped.value.reason == "script"
    assert sync.iteration == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "the run stopped (script) after iteration 1" in said[0]
    sync.close()


def test_the_compute_step_is_the_users_not_the_protocols_begin_iteration():
    """What a protocol does as an iteration begins (Hop's sends) is its cost, not the
    compute's: `compute_s` is what the inflation against one worker alone is read from."""
    _, _, model, sync = _pair()
    begin = sync.protocol.begin_iteration

    def slow_begin(step):  # noqa: ANN001, ANN202
        begin(step)
        time.sleep(0.3)

    sync.protocol.begin_iteration = slow_begin
    _train(sync, model, 1)  # the iteration after this one begins slowly
    x, y = _batch(1)
    sync.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    step = sync.step()
    assert step.begin_s >= 0.3 and step.compute_s < 0.3


def test_a_protocol_waiting_as_it_closes_leaves_the_worker_closing(monkeypatch):
    """The launcher takes a worker that beats `compute` and then goes quiet for a hung one. A
    worker that finished first waits in its protocol's close for slower neighbours, and may
    block there (Hop sending its deferred update): it still beats `closing`, then `done`."""
    store = dist.HashStore()
    monkeypatch.setattr(current_runtime(), "launched", True)  # heartbeats, as launched
    monkeypatch.setattr(current_runtime(), "store", store)
    model = _model()
    _, sync = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _train(sync, model, 2)
    last = sync._step
    beats = []

    def close_waiting() -> None:
        with last.blocking():
            beats.append(store.get("hb/0").decode().split()[1])
        beats.append(store.get("hb/0").decode().split()[1])

    monkeypatch.setattr(sync.protocol, "close", close_waiting)
    sync.close()
    assert beats == ["closing", "closing"]
    assert store.get("hb/0").decode().split()[:2] == ["2", "done"]


def test_consensus_model_is_a_copy_after_the_loop():
    model = _model()
    _, sync = hetsync.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _train(sync, model, 2)
    with pytest.raises(RuntimeError, match="after the training loop"):
        sync.consensus_model()
    sync.close()
    average = sync.consensus_model()
    assert average is not model
    assert torch.equal(_flat(average), _flat(model))


@pytest.mark.parametrize(
    ("model", "optimizer", "match"),
    [(None, "sgd", "torch.nn.Module"), ("model", None, "torch.optim.Optimizer")],
)
def test_prepare_names_a_wrong_argument(model, optimizer, match):
    net = _model()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=match):
        hetsync.prepare(net if model else None, sgd if optimizer else None)
