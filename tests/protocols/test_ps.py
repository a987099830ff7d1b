"""Parameter server: real multi-process runs in both modes, plus its server object alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetsync.config import RunConfig
from hetsync.errors import ConfigError
from hetsync.metrics.summary import read_jsonl
from hetsync.protocols.ps import _Server

pytestmark = pytest.mark.integration


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _push(grad: list[float], version: int = 0) -> torch.Tensor:
    return torch.tensor([1.0, version, 0.0, *grad])


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


def test_ps_refuses_nccl():
    with pytest.raises(ConfigError, match="ps needs gloo"):
        RunConfig(protocol="ps", workload="digits", backend="nccl").validate()


@pytest.mark.parametrize("sync", [True, False])
def test_server_applies_each_push_with_the_worker_optimizer(sync):
    param = nn.Parameter(torch.tensor([1.0, 2.0]))
    server = _Server([param], torch.optim.SGD([param], lr=0.5), sync=sync, world=1)
    reply = server.push(_push([2.0, -2.0]))
    assert reply.tolist() == [1.0, 0.0, 0.0, 0.0, 3.0]
    server.close()


def test_a_dead_server_thread_is_reported_not_waited_for():
    # No process group: the serving thread's first receive fails.
    param = nn.Parameter(torch.zeros(2))
    server = _Server([param], torch.optim.SGD([param], lr=0.1), sync=True, world=2)
    with pytest.raises(RuntimeError, match="parameter server thread died"):
        server.push(_push([1.0, 1.0]))
