"""Local SGD's decisions: rounds every H steps, the stop agreed at a round, the loop's end;
DiLoCo's outer step against a hand computation and against torch's own Nesterov SGD."""

from __future__ import annotations

import pytest
import torch

from hetsync.cores.errors import LocalProtocolError, RemoteProtocolError
from hetsync.protocols.localsgd.core import (
    Average,
    Averaged,
    Finish,
    LocalSGDState,
    LocalSGDWorker,
    LoopEnded,
    StepDone,
    outer_nesterov,
)


def steps(core: LocalSGDWorker, first: int, last: int, wants_stop: bool = False) -> list:
    out = []
    for k in range(first, last + 1):
        out += core.handle(StepDone(iteration=k, wants_stop=wants_stop))
    return out


def test_a_round_every_h_steps_and_nothing_sent_between():
    core = LocalSGDWorker(0, 4, local_steps=3)
    decisions = steps(core, 1, 3)
    assert decisions[:2] == [Finish(iteration=1, stop=False), Finish(iteration=2, stop=False)]
    assert decisions[2] == Average(iteration=3, round=1, vote=0, moved=1)
    assert core.handle(Averaged(round=1, votes=0, moved=4)) == [
        Finish(iteration=3, stop=False, outer_step=True)]
    assert steps(core, 4, 6)[-1] == Average(iteration=6, round=2, vote=0, moved=1)


def test_a_vote_between_rounds_waits_for_the_next_round_and_stops_everyone():
    core = LocalSGDWorker(1, 2, local_steps=4)
    core.handle(StepDone(iteration=1, wants_stop=False))
    assert core.handle(StepDone(iteration=2, wants_stop=True)) == [
        Finish(iteration=2, stop=False)]  # no collective to stop at yet
    assert steps(core, 3, 4)[-1].vote == 1  # remembered, though no longer wanted
    assert core.handle(Averaged(round=1, votes=1, moved=2))[0].stop
    assert core.state is LocalSGDState.DONE
    with pytest.raises(LocalProtocolError, match="DONE"):
        core.handle(StepDone(iteration=5, wants_stop=False))


def test_a_peers_vote_stops_a_worker_that_did_not_vote():
    core = LocalSGDWorker(0, 3, local_steps=2)
    assert steps(core, 1, 2)[-1].vote == 0
    assert core.handle(Averaged(round=1, votes=1, moved=3)) == [
        Finish(iteration=2, stop=True, outer_step=True)]


def test_max_iterations_ends_with_a_round_where_it_falls():
    core = LocalSGDWorker(0, 2, local_steps=4, max_iterations=6)
    steps(core, 1, 4)
    core.handle(Averaged(round=1, votes=0, moved=2))
    assert steps(core, 5, 6, wants_stop=True)[-1] == Average(iteration=6, round=2, vote=1,
                                                              moved=1)


@pytest.mark.parametrize(("done", "moved"), [(5, 1), (4, 0)])
def test_the_loops_end_joins_one_last_round_voting_to_stop(done, moved):
    """Mid-round, or right after a round: a longer-running peer meets it at its next round."""
    core = LocalSGDWorker(0, 2, local_steps=4)
    steps(core, 1, 4)
    core.handle(Averaged(round=1, votes=0, moved=2))
    steps(core, 5, done)
    assert core.handle(LoopEnded(iteration=done)) == [
        Average(iteration=done, round=2, vote=1, moved=moved)]
    assert core.handle(Averaged(round=2, votes=1, moved=moved)) == [
        Finish(iteration=done, stop=True, outer_step=bool(moved))]


def test_misuse_and_bad_rounds_are_refused():
    core = LocalSGDWorker(0, 2, local_steps=2)
    with pytest.raises(LocalProtocolError, match="iteration 0"):
        core.handle(StepDone(iteration=2, wants_stop=False))  # an iteration skipped
    core = LocalSGDWorker(0, 2, local_steps=1)
    core.handle(StepDone(iteration=1, wants_stop=False))
    with pytest.raises(LocalProtocolError):
        core.handle(Averaged(round=2, votes=0, moved=2))
    core = LocalSGDWorker(0, 2, local_steps=1)
    core.handle(StepDone(iteration=1, wants_stop=False))
    with pytest.raises(RemoteProtocolError, match="votes"):
        core.handle(Averaged(round=1, votes=3, moved=2))
    assert core.state is LocalSGDState.ERROR
    with pytest.raises(ValueError, match="local_steps"):
        LocalSGDWorker(0, 2, local_steps=0)


def test_outer_nesterov_by_hand():
    """Delta = a - m; v <- mu v + Delta; x = a - lr (Delta + mu v), two rounds."""
    anchor, buffer = torch.tensor([1.0, -2.0]), torch.zeros(2)
    x = outer_nesterov(anchor, torch.tensor([0.5, -1.0]), buffer, lr=0.7, momentum=0.9)
    # Delta = [0.5, -1]; v = [0.5, -1]; x = a - 0.7 * 1.9 * Delta
    assert torch.allclose(buffer, torch.tensor([0.5, -1.0]))
    assert torch.allclose(x, torch.tensor([1.0 - 0.665, -2.0 + 1.33]))
    x2 = outer_nesterov(x, x - torch.tensor([0.1, 0.2]), buffer, lr=0.7, momentum=0.9)
    # Delta = [0.1, 0.2]; v = 0.9 [0.5, -1] + Delta = [0.55, -0.7]
    assert torch.allclose(buffer, torch.tensor([0.55, -0.7]))
    assert torch.allclose(x2, x - 0.7 * (torch.tensor([0.1, 0.2]) + 0.9 * buffer))


def test_outer_nesterov_is_torchs_nesterov_sgd_on_the_pseudo_gradient():
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(5))
    sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    anchor, buffer = param.detach().clone(), torch.zeros(5)
    for _ in range(3):
        mean = anchor + torch.randn(5)  # where the workers' average went
        param.grad = param.detach() - mean
        sgd.step()
        anchor = outer_nesterov(anchor, mean, buffer, lr=0.7, momentum=0.9)
        assert torch.allclose(anchor, param.detach(), atol=1e-6)


def test_outer_lr_one_without_momentum_is_plain_averaging():
    anchor, mean = torch.randn(4), torch.randn(4)
    assert torch.allclose(outer_nesterov(anchor, mean, torch.zeros(4), 1.0, 0.0), mean)
