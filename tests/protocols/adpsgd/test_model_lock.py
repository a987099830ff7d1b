"""AD-PSGD's driver in a world of one, serving a client that the test plays: a passive
worker's snapshots and checkpoints are copies of a model no served average is half-way
through (review 4, finding 6)."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from torch import nn

import hetsync
from hetsync.api import SyncOptimizer
from hetsync.launch.worker import _checkpoint
from hetsync.metrics.worker_log import Snapshotter, snapshot_path
from hetsync.protocols.adpsgd.core import ADPSGDCore, RequestReceived, Served
from hetsync.protocols.adpsgd.driver import ADPSGD
from hetsync.transport.flat import model_tensors
from hetsync.transport.mixing import average_pair_into

ITERATIONS = 10
SNAPSHOTS = 10


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    hetsync.init(protocol="adpsgd", workers=1, device="cpu", out=str(out), eval_every=0.05)
    yield out
    hetsync.shutdown()


class _Client:
    """Rank 1's requests, served on a thread of the test as the driver's own serving thread
    does (`ADPSGD._serve`): each Serve the core grants averages a model of twos into the
    model (the reply the real thread sends), then writes zeros, as the next average would,
    `rounds` times over (a long average, as a large model's is) before `Served`; between two
    serves the model is all zeros. Another request follows the reply at once, as from a
    client whose gradient took no time."""

    def __init__(self, driver: ADPSGD, rounds: int = 1) -> None:
        self.driver, self.rounds, self.served = driver, rounds, 0
        self._other = torch.full_like(torch.cat([t.reshape(-1) for t in driver.tensors]), 2.0)
        self._reply = torch.empty_like(self._other)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-client")

    def __enter__(self) -> _Client:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _serve(self) -> None:
        driver, iteration = self.driver, 0
        while not self._stop.is_set():
            iteration += 1
            with driver.cond:
                driver._execute(driver.core.handle(RequestReceived(src=1, iteration=iteration)))
                driver.cond.wait_for(lambda: driver._serve_granted == 1)
                driver._serve_granted = None
            model = [t.data for t in driver.tensors]
            for _ in range(self.rounds):
                average_pair_into(driver.link, model, self._other, self._reply)
                torch._foreach_zero_(model)
            with driver.cond:
                driver._execute(driver.core.handle(Served(src=1)))
            self.served += 1
            self._stop.wait(0.002)  # the reply's send, the next request's arrival


def _passive_optimizer() -> SyncOptimizer:
    """A laid-out 16 MB model of zeros on a passive worker with one client, rank 1; lr 0, so
    that only the served averages change it."""
    model = nn.Sequential(*[nn.Linear(1000, 1000) for _ in range(4)])
    opt = SyncOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model, snapshots=True)
    driver = opt.protocol
    assert isinstance(driver, ADPSGD)
    driver.core = ADPSGDCore(0, [1], naive=False, rng=random.Random(0))
    with torch.no_grad():
        torch._foreach_zero_([t.data for t in model_tensors(model)])
    return opt


def _mixed(state: dict[str, torch.Tensor]) -> bool:
    """Whether a copy of the model holds anything but zeros: part of an average."""
    return any(bool(t.any()) for t in state.values() if t.is_floating_point())


def test_snapshots_of_a_passive_worker_between_its_steps_hold_no_part_of_a_served_average(
        run_dir):
    """The serving goes on while the trainer writes snapshots, as between its steps (the
    review's torn_snapshot.py: without the lock, 4 of 20 were mixed, and 6 to 10 of 20 here)."""
    opt = _passive_optimizer()
    snapshots = Snapshotter(run_dir / "between-steps", 0, every=1.0)
    snapshots.prepare(opt.model)
    with _Client(opt.protocol) as client:
        for index in range(SNAPSHOTS):
            snapshots.maybe_snapshot(opt.model, float(index), 0, hold=opt.protocol.model_lock)
    opt.close()
    assert client.served > SNAPSHOTS // 2  # the averages went on meanwhile
    mixed = [index for index in range(SNAPSHOTS) if _mixed(torch.load(
        snapshot_path(run_dir / "between-steps", index, 0), weights_only=True)["state"])]
    assert mixed == []


def test_snapshots_and_checkpoints_of_a_training_passive_worker_hold_no_part_of_a_served_average(
        run_dir):
    """A snapshot is due every step (`eval_every` 0.05 s), a checkpoint is taken every other
    step (without the lock, 6 to 8 of 8 were mixed), and the client's averages go on
    throughout, three averages long: every copy must be all zeros."""
    opt = _passive_optimizer()
    model = opt.model
    checkpoints = []  # whether each was mixed
    with _Client(opt.protocol, rounds=3) as client:
        for _ in range(ITERATIONS):
            opt.zero_grad()
            model(torch.ones(1, 1000)).sum().backward()
            opt.step()
            time.sleep(0.06)  # a step as long as `eval_every`: the next one's snapshot is due
            if opt.iteration % 2 == 0:
                checkpoints.append(_mixed(_checkpoint(opt, model, (0, 0), None)["model"]))
    opt.close()
    files = {path.stat().st_ino: path for path in (run_dir / "snapshots").glob("0*/rank0.pt")}
    snapshots = [torch.load(path, weights_only=True)["state"] for path in files.values()]
    assert client.served > ITERATIONS and len(snapshots) > ITERATIONS // 2
    assert [state for state in snapshots if _mixed(state)] == []
    assert len(checkpoints) == ITERATIONS // 2 and not any(checkpoints)
