"""Receives from each peer on its own (hetsync.transport.peer_streams), in three real processes:
a peer that dies in the middle of its message takes no other peer's messages with it.

With gloo's receive from any source, the same schedule fails every receive after the death
(each on the dead peer's closed connection), so the live peer's sends never complete: the
parameter server's defect that the fault fuzz found (seed 11, case 24)."""

from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetsync.transport.links import Link
from hetsync.transport.lost_workers import LOST_KEY, LostWorkers
from hetsync.transport.peer_streams import PeerStreams

NUMEL = 1_000_000  # 4 MB: the dying peer is cut off in the middle of its message
LIVE_MESSAGES = 3


def _delivered(link: Link, peers: list[int], last) -> list:
    """The items `PeerStreams` hands to `deliver` until every stream has ended (or one
    failed), each with the thread it came on."""
    items: list = []
    done = threading.Condition()

    def deliver(item) -> None:
        with done:
            items.append((item, threading.current_thread().name))
            done.notify_all()

    PeerStreams(link, peers, 6, lambda: torch.empty(NUMEL), last, reuse=False, name="test",
                deliver=deliver)
    with done:
        done.wait_for(lambda: any(isinstance(i, BaseException) for i, _ in items)
                      or sum(i[1] is None for i, _ in items) == len(peers), timeout=20)
    return items


def _peers(rank: int, port: int, declared: bool, delivered: bool, out: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3, timeout=timeout)
    link = Link("host", None, torch.device("cpu"), LostWorkers(store, 3, confirm_timeout=3.0))
    dist.barrier()
    if rank == 2:  # dies while its message is on the wire; "the launcher" declares it lost
        message = torch.full((NUMEL,), 2.0)
        threading.Thread(target=link.send, args=(message, 0, 6), daemon=True).start()
        time.sleep(0.05)
        if declared:
            store.set(LOST_KEY, "2")
        os._exit(0)
    if rank == 1:  # sends while the receiver is busy, after rank 2's death
        time.sleep(0.3)
        for k in range(LIVE_MESSAGES):
            link.send(torch.full((NUMEL,), 10.0 + k), 0, tag=6)
        link.send(torch.full((NUMEL,), -1.0), 0, tag=6)
        os._exit(0)
    time.sleep(1.0)  # busy: every message comes while no receive is posted
    got: list[tuple[int, float]] = []
    if delivered:  # on each peer's thread, as it arrives
        items = _delivered(link, [1, 2], lambda m: float(m[0]) < 0)
        errors = [item for item, _ in items if isinstance(item, BaseException)]
        got = [(item[0], float(item[1][0])) for item, _ in items
               if not isinstance(item, BaseException) and item[1] is not None]
        assert all(thread == f"test-from-{item[0]}" for item, thread in items
                   if not isinstance(item, BaseException))
        outcome = f"raised: {errors[0]}" if errors else "ended"
    else:
        try:
            for src, message in PeerStreams(link, [1, 2], 6, lambda: torch.empty(NUMEL),
                                            lambda m: float(m[0]) < 0, reuse=True,
                                            name="test"):
                got.append((src, float(message[0])))
            outcome = "ended"
        except RuntimeError as error:
            outcome = f"raised: {error}"
    torch.save({"got": got, "outcome": outcome}, out / "rank0.pt")
    os._exit(0)


@pytest.mark.integration
@pytest.mark.parametrize(("declared", "delivered"), [(True, False), (False, False), (True, True)],
                         ids=["declared-lost", "not-declared", "declared-lost-delivered"])
def test_a_dead_peer_fails_only_its_own_stream(tmp_path, declared, delivered, spawn):
    spawn(_peers, 3, declared, delivered, tmp_path).join()
    result = torch.load(tmp_path / "rank0.pt")
    live = [(src, value) for src, value in result["got"] if src == 1]
    assert live == [(1, 10.0), (1, 11.0), (1, 12.0), (1, -1.0)]
    if declared:  # its stream ends quietly: the protocol hears of the loss by subscription
        assert result["outcome"] == "ended"
    else:  # nobody says it is lost: the failed receive is a real error
        assert result["outcome"].startswith("raised") and "Connection" in result["outcome"]


def test_a_peer_outside_the_group_is_refused_before_any_receive():
    # gloo aborts the whole process on a receive from a rank it does not have.
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"peers \[1, 2\] are not all ranks of the host "
                                             r"link's group of 1"):
            PeerStreams(Link("host", None, torch.device("cpu")), [1, 2], 6,
                        lambda: torch.empty(1), lambda m: True, reuse=True, name="test")
    finally:
        if made:
            dist.destroy_process_group()


def test_delivered_messages_have_no_iterator_and_no_reused_buffer():
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        link = Link("host", None, torch.device("cpu"))
        with pytest.raises(ValueError, match="a delivered message cannot reuse its buffer"):
            PeerStreams(link, [], 6, lambda: torch.empty(1), lambda m: True, reuse=True,
                        name="test", deliver=print)
        streams = PeerStreams(link, [], 6, lambda: torch.empty(1), lambda m: True,
                              reuse=False, name="test", deliver=print)
        with pytest.raises(TypeError, match="hand their messages to `deliver`"):
            iter(streams)
    finally:
        if made:
            dist.destroy_process_group()
