"""`optimizer.step(closure)` (LBFGS), dtypes and prepare's bad input, in a world of one (this
process): alone, every protocol that takes a closure must step exactly as torch's optimizer.
The two-worker runs are in test_closure_runs.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hetsync
from hetsync.step import Step

#: Every protocol that runs a closure and can run alone (Prague's Group Generator needs peers).
ALONE = ["allreduce", "ddp", "dpsgd", "adpsgd", "hop", "localsgd"]


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    hetsync.init(protocol="allreduce", device="cpu")
    yield
    hetsync.shutdown()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g, dtype=torch.float64)
    return x, torch.sin(x @ torch.tensor([[1.0], [2.0], [-1.0]], dtype=torch.float64))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _closure(model: nn.Module, optimizer: torch.optim.Optimizer, calls: list[torch.Tensor]):
    x, y = _data()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        calls.append(loss)
        return loss

    return closure


@pytest.mark.parametrize("protocol", ALONE)
def test_lbfgs_alone_steps_as_torchs_and_returns_the_closures_first_loss(protocol):
    plain, synced = _model(), _model()
    settings = {"lr": 0.5, "max_iter": 4, "line_search_fn": "strong_wolfe"}
    lbfgs = torch.optim.LBFGS(plain.parameters(), **settings)
    model, sync = hetsync.prepare(synced, torch.optim.LBFGS(synced.parameters(), **settings),
                                  protocol)
    assert model is synced  # the script's own module under every protocol, ddp's too
    for _ in range(2):
        theirs, ours = [], []
        lbfgs.step(_closure(plain, lbfgs, theirs))
        returned = sync.step(_closure(model, sync, ours))
        assert returned is ours[0]  # what torch's step returns: the closure's first loss
        assert len(ours) == len(theirs) > 1  # the line search evaluated it again
    sync.close()
    assert sync.iteration == 2
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), synced.parameters(),
                                                 strict=True))
    assert all(p.dtype == torch.float64 for p in synced.parameters())


def test_a_closure_with_an_optional_one_and_the_loss_keyword_still_give_the_step():
    net = _model()
    model, sync = hetsync.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    calls: list[torch.Tensor] = []
    assert sync.step(_closure(model, sync, calls)) is calls[0]
    x, y = _data()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    assert isinstance(sync.step(loss=loss), Step)
    with pytest.raises(TypeError, match=r"not Tensor: pass the loss as step\(loss=loss\)"):
        sync.step(loss)
    sync.close()


def test_the_parameter_server_refuses_a_closure_in_one_line():
    net = _model()
    with pytest.raises(hetsync.ConfigError, match=r"ps cannot run LBFGS\.step\(closure\)"):
        hetsync.prepare(net, torch.optim.LBFGS(net.parameters()), "ps")
    model, sync = hetsync.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), "ps")
    assert model is net
    with pytest.raises(hetsync.ConfigError, match=r"ps cannot run SGD\.step\(closure\)"):
        sync.step(_closure(model, sync, []))
    sync.close()


def _integer_model() -> nn.Module:
    model = nn.Module()
    model.table = nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)
    return model


@pytest.mark.filterwarnings("ignore:Complex modules are a new feature")
@pytest.mark.parametrize(
    ("build", "match"),
    [(lambda: nn.Linear(2, 2).to(torch.complex64), r"parameter 'weight' is torch\.complex64"),
     (nn.ReLU, "ReLU has no floating-point parameters"),
     (_integer_model, "Module has no floating-point parameters")],
    ids=["complex", "no-parameters", "integer"],
)
def test_a_model_hetsync_cannot_synchronise_is_refused_in_one_line(build, match):
    with pytest.raises(TypeError, match=match):
        hetsync.prepare(build(), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))


def test_prepare_twice_is_refused_and_the_given_optimizer_cannot_step_alone():
    net = _model()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    model, sync = hetsync.prepare(net, sgd)
    with pytest.raises(RuntimeError, match="already called with this model"):
        hetsync.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="already called with this optimizer"):
        hetsync.prepare(_model(), sgd)
    with pytest.raises(RuntimeError, match="already called with this optimizer"):
        hetsync.prepare(_model(), sync)
    x, y = _data()
    nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError, match="step the optimizer it returned"):
        sgd.step()
    sync.step()  # which steps the inner optimizer
    sync.close()
    sgd.step()  # after close(), the optimizer is the script's again


def test_lbfgs_starts_afresh_where_an_exchange_moved_the_model():
    """Its history is differences along its own path: kept while the model stays where its
    last step left it, dropped once something else (an exchange) moved it."""
    net = _model()
    model, sync = hetsync.prepare(net, torch.optim.LBFGS(net.parameters(), max_iter=2),
                                  "dpsgd")
    state = sync.optimizer.state

    def iterations() -> int:
        sync.step(_closure(model, sync, []))
        return state[next(net.parameters())]["n_iter"]

    first = iterations()
    assert iterations() == 2 * first  # counted on
    with torch.no_grad():  # as a neighbour's average would
        next(net.parameters()).add_(0.01)
    assert iterations() == first  # counted afresh
    sync.close()
