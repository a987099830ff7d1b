"""Per-thread CPU time: a protocol thread's work is charged to it, not to the training
thread, and the summary turns the rows' samples into milliseconds per iteration."""

from __future__ import annotations

import threading
import time

from hetsync.metrics.summary import thread_cpu_per_iteration
from hetsync.metrics.thread_cpu import OTHER, TRAINING, ThreadCpu


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_named_thread_s_cpu_is_charged_to_it_not_to_the_training_thread():
    cpu, burnt, done = ThreadCpu(), threading.Event(), threading.Event()

    def receiver() -> None:  # long-lived, as protocol threads are: sampled while it runs
        _burn(0.3)
        burnt.set()
        done.wait()

    worker = threading.Thread(target=receiver, name="hop-updates")
    worker.start()
    burnt.wait()
    _burn(0.1)
    spent = cpu.sample(force=True)
    done.set()
    worker.join()
    assert spent is not None
    assert spent["hop-updates"] >= 0.2
    assert 0.05 <= spent[TRAINING] < spent["hop-updates"]


def test_a_thread_per_peer_counts_under_its_kind():
    cpu, burnt, done = ThreadCpu(), threading.Barrier(3), threading.Event()

    def receiver() -> None:
        _burn(0.15)
        burnt.wait()
        done.wait()

    workers = [threading.Thread(target=receiver, name=f"hop-tokens-from-{peer}")
               for peer in (1, 7)]
    for worker in workers:
        worker.start()
    burnt.wait()
    spent = cpu.sample(force=True)
    done.set()
    for worker in workers:
        worker.join()
    assert spent is not None
    assert spent["hop-tokens"] >= 0.25
    assert not any("-from-" in role for role in spent)


def test_samples_are_taken_at_most_every_interval_and_count_from_the_previous_one():
    cpu = ThreadCpu(every=60.0)
    assert cpu.sample() is None
    _burn(0.2)
    first = cpu.sample(force=True)
    second = cpu.sample(force=True)
    assert first is not None and first[TRAINING] >= 0.1
    assert second is not None and second.get(TRAINING, 0.0) < 0.05


def test_the_summary_gives_cpu_ms_per_iteration_by_role_over_all_workers():
    rank0 = [{"iteration": 1}, {"iteration": 2, "cpu_s": {TRAINING: 0.2, OTHER: 0.02}}]
    rank1 = [{"iteration": 1, "cpu_s": {TRAINING: 0.1}}, {"iteration": 2,
                                                          "cpu_s": {"hop-updates": 0.04}}]
    assert thread_cpu_per_iteration([rank0, rank1]) == {
        "hop-updates": 10.0, OTHER: 5.0, TRAINING: 75.0}
    assert thread_cpu_per_iteration([[{"iteration": 3}]]) is None
