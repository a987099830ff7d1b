from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetsync.transport.links import Link
from hetsync.transport.lost_workers import LOST_KEY, LostWorkers, PeerLost, unless_lost


def test_subscribers_hear_of_each_loss_once_from_the_watcher_thread():
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=1.0)
    heard: list[int] = []
    both = threading.Event()
    lost.subscribe(lambda rank: (heard.append(rank), len(heard) == 2 and both.set()))
    store.set(LOST_KEY, "2")
    time.sleep(0.3)
    store.set(LOST_KEY, "2,3")
    assert both.wait(2.0)
    time.sleep(0.3)
    assert heard == [2, 3]
    assert lost.ranks == {2, 3}
    lost.close()


def test_a_failed_transfer_goes_on_only_if_the_launcher_declares_the_peer_lost():
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=0.3)
    error = RuntimeError("Connection closed by peer")
    with pytest.raises(RuntimeError, match="closed by peer"):
        lost.confirm(1, error)  # not declared within the timeout: the error is real
    threading.Timer(0.1, store.set, args=(LOST_KEY, "1")).start()
    lost.confirm_timeout = 2.0
    lost.confirm(1, error)  # declared meanwhile: returns


def test_close_stops_the_watcher_before_the_store_goes():
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=1.0)
    heard: list[int] = []
    lost.subscribe(heard.append)
    watchers = [t for t in threading.enumerate() if t.name == "hetsync-lost"]
    lost.close()
    assert not any(t.is_alive() for t in watchers)
    store.set(LOST_KEY, "1")
    time.sleep(0.3)
    assert heard == []


def test_confirm_never_runs_a_callback_on_the_callers_thread():
    # A transfer that fails may run under a lock its protocol's callback takes (the parameter
    # server sends replies under one): the callback must come from the watcher thread only.
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=2.0)
    threads: list[str] = []
    told = threading.Event()
    lost.subscribe(lambda rank: (threads.append(threading.current_thread().name), told.set()))
    store.set(LOST_KEY, "1")
    lost.confirm(1, RuntimeError("Connection closed by peer"))
    assert told.wait(2.0)
    assert threads == ["hetsync-lost"]
    lost.close()


def test_a_failing_callback_is_reported_and_later_losses_still_reach_every_subscriber(capfd):
    store = dist.HashStore()
    lost = LostWorkers(store, world_size=4, confirm_timeout=1.0)
    heard: list[int] = []
    both = threading.Event()

    def broken(rank: int) -> None:
        raise ValueError(f"cannot drop rank {rank}")

    lost.subscribe(broken)
    lost.subscribe(lambda rank: (heard.append(rank), len(heard) == 2 and both.set()))
    store.set(LOST_KEY, "1")
    time.sleep(0.3)
    store.set(LOST_KEY, "1,2")
    assert both.wait(2.0)
    assert heard == [1, 2]
    err = capfd.readouterr().err
    assert "lost rank 1" in err and "ValueError: cannot drop rank 1" in err
    with pytest.raises(RuntimeError, match="reacting to a lost worker failed.*cannot drop rank 1"):
        lost.raise_error()
    lost.close()


def _gloo_pair(store: dist.Store) -> list[dist.ProcessGroupGloo]:
    """Two ranks of a real gloo group in this process (each made on a thread of its own)."""
    groups: list[dist.ProcessGroupGloo] = [None, None]  # type: ignore[list-item]

    def make(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("pg", store), rank, 2,
                                             datetime.timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return groups


def test_a_send_that_never_ends_is_given_up_once_its_peer_is_declared_lost():
    # gloo's send to a peer killed mid-message never returns; here rank 1 simply never
    # receives, and the launcher's word must release the wait all the same.
    store = dist.HashStore()
    sender, receiver = _gloo_pair(store)
    lost = LostWorkers(store, world_size=2, confirm_timeout=2.0)
    unanswered = sender.send([torch.zeros(1000)], 1, 5)
    threading.Timer(0.3, store.set, args=(LOST_KEY, "1")).start()
    began = time.monotonic()
    assert not unless_lost(lost, 1, lambda: lost.wait_for(unanswered, 1))
    assert 0.3 <= time.monotonic() - began < 2.0
    after = sender.send([torch.zeros(1000)], 1, 6)
    with pytest.raises(PeerLost, match="rank 1 was declared lost"):  # lost: not waited again
        lost.wait_for(after, 1)
    for tag in (5, 6):  # end the sends: a gloo group destroyed under a pending send aborts
        receiver.recv([torch.zeros(1000)], 0, tag).wait()


def test_a_blocked_wait_holds_up_no_other_threads_wait_with_the_same_peer():
    # AD-PSGD's trainer waits for its partner's reply while its serving thread replies to
    # that partner: a wait queued behind the other would stall the serving for nothing.
    store = dist.HashStore()
    sender, receiver = _gloo_pair(store)
    lost = LostWorkers(store, world_size=2, confirm_timeout=2.0)
    blocked = sender.send([torch.zeros(1000)], 1, 5)  # rank 1 receives it only at the end
    trainer = threading.Thread(target=lost.wait_for, args=(blocked, 1))
    trainer.start()
    time.sleep(0.2)
    received = receiver.recv([torch.zeros(10)], 0, 9)
    lost.wait_for(sender.send([torch.ones(10)], 1, 9), 1)  # returns while the trainer waits
    lost.wait_for(received, 0)
    assert trainer.is_alive()
    receiver.recv([torch.zeros(1000)], 0, 5).wait()
    trainer.join(timeout=5.0)
    assert not trainer.is_alive()


def test_a_transfer_with_a_live_peer_is_waited_for_and_its_error_raised():
    store = dist.HashStore()
    sender, receiver = _gloo_pair(store)
    lost = LostWorkers(store, world_size=2, confirm_timeout=0.2)
    message, into = torch.arange(1000.0), torch.zeros(1000)
    received = receiver.recv([into], 0, 7)
    lost.wait_for(sender.send([message], 1, 7), 1)
    lost.wait_for(received, 0)
    assert torch.equal(into, message)
    gone, left = _gloo_pair(dist.PrefixStore("other", store))
    del gone  # closes its connections: a failed transfer, whose peer nobody declared lost
    with pytest.raises(RuntimeError, match="Connection closed by peer") as raised:
        lost.wait_for(left.recv([into], 0, 8), 0)
    assert not isinstance(raised.value, PeerLost)


BIG = 20_000_000  # 80 MB: a message is still on the wire when its receiver is killed


def _sender_and_victim(rank: int, port: int, out: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=2, timeout=timeout)
    message = torch.ones(BIG)
    dist.barrier()
    if rank == 1:  # receives until it is killed, in the middle of a message
        threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
        while True:
            dist.recv(message, 0, tag=3)
    link = Link("host", None, torch.device("cpu"), LostWorkers(store, 2, confirm_timeout=30.0))
    sent = 0
    while unless_lost(link.lost, 1, partial(link.send, message, 1, 3)):
        sent += 1
    (out / "rank0").write_text(f"{sent} {time.time()}")
    os._exit(0)


@pytest.mark.integration
def test_a_send_to_a_peer_killed_mid_message_ends_when_the_launcher_declares_it_lost(tmp_path,
                                                                                     spawn):
    # gloo fails the killed peer's receives, but the sender's wait can block for good.
    run = spawn(_sender_and_victim, 2, tmp_path)
    sender, victim = run.processes  # joined one by one: the victim's death is the test
    victim.join(timeout=60.0)
    assert victim.exitcode == -signal.SIGKILL
    declared = time.time()
    run.store.set(LOST_KEY, "1")  # as the launcher does
    sender.join(timeout=30.0)
    if sender.is_alive():
        sender.kill()
        pytest.fail("the sender still waited for its peer 30 s after it was declared lost")
    sent, given_up = (tmp_path / "rank0").read_text().split()
    assert int(sent) >= 1  # messages went through before the kill
    assert float(given_up) - declared < 5.0
