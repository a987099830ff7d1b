"""The cost model's rule on the cases the issue names: each against its closed form."""

import sys
import threading
import time

import pytest

from hetsync.network.emulator import NetworkEmulator
from hetsync.network.model import Message, NetworkModel
from hetsync.network.patterns import (
    fan_out,
    leader_reduce,
    mesh_reduce,
    point_to_point,
    push_pull,
    ring_allreduce,
    scatter_gather,
)
from hetsync.network.spec import parse_network

B, L = 1.25e9, 50e-6  # 10 Gbit/s and 50 us
SPEC = parse_network("bandwidth=10Gbit,latency=50us")
MB = 1e6


def model(world: int = 16, text: str = "bandwidth=10Gbit,latency=50us") -> NetworkModel:
    spec = parse_network(text)
    assert spec is not None
    return NetworkModel(spec, world)


def test_a_lone_transfer_takes_size_over_bandwidth_plus_latency():
    net = model()
    assert net.duration(point_to_point(0, 1, 100 * MB)) == pytest.approx(100 * MB / B + L)
    assert net.transfer_time(0, 1, 100 * MB) == pytest.approx(100 * MB / B + L)
    assert net.egress_free == [0.0] * 16  # nothing booked


def test_a_transfer_takes_the_slower_nic_and_the_longer_latency():
    net = model(4, "bandwidth=10Gbit,latency=50us;ranks=3:bandwidth=1Gbit,latency=1ms")
    assert net.transfer_time(0, 3, MB) == pytest.approx(MB / 1.25e8 + 1e-3)


def test_two_transfers_from_one_sender_share_its_egress():
    arrivals = model().send(fan_out(0, [1, 2], 10 * MB))
    assert max(arrivals) == pytest.approx(2 * 10 * MB / B + L)


def test_incast_serializes_at_the_receiver():
    messages = [Message(s, 0, 10 * MB) for s in range(1, 8)]
    assert model().duration(messages) == pytest.approx(7 * 10 * MB / B + L)


@pytest.mark.parametrize("n", range(2, 17))
def test_ring_allreduce_matches_its_formula(n):
    expected = 2 * (n - 1) * (100 * MB / n / B + L)
    assert model().duration(ring_allreduce(list(range(n)), 100 * MB)) == pytest.approx(expected)


def test_the_slowest_link_of_a_ring_sets_its_pace():
    slow = model(8, "bandwidth=10Gbit,latency=50us;ranks=3:bandwidth=1Gbit")
    busy = 2 * 7 * 100 * MB / 8 / (B / 10)  # its 14 chunks back to back, the rest pipelined
    assert slow.duration(ring_allreduce(list(range(8)), 100 * MB)) == pytest.approx(busy, rel=1e-3)


def test_mesh_and_leader_reduce_send_what_their_algorithms_send():
    g, size = 4, 10 * MB
    assert model().duration(mesh_reduce(range(g), size)) == pytest.approx((g - 1) * size / B + L)
    assert model().duration(leader_reduce(range(g), size)) == pytest.approx(
        2 * ((g - 1) * size / B + L))


def test_a_reply_waits_for_its_request():
    assert model().duration(push_pull(0, 1, 10 * MB, 1 * MB)) == pytest.approx(
        10 * MB / B + 1 * MB / B + 2 * L)


def test_clocks_carry_over_between_sends():
    """A simulator books operations one after another on the same NICs."""
    net = model()
    first = net.send(point_to_point(0, 1, 10 * MB))[0]
    second = net.send(point_to_point(2, 1, 10 * MB))[0]
    assert second == pytest.approx(first + 10 * MB / B)


def test_per_rank_egress_override_limits_only_that_direction():
    net = model(4, "bandwidth=10Gbit,latency=0;ranks=2:egress=1Gbit")
    assert net.duration(point_to_point(2, 0, 10 * MB)) == pytest.approx(10 * MB / (B / 10))
    assert net.duration(point_to_point(0, 2, 10 * MB)) == pytest.approx(10 * MB / B)


def test_a_message_may_only_wait_for_an_earlier_one():
    with pytest.raises(ValueError, match="earlier"):
        model().send([Message(0, 1, 1.0, after=(1,)), Message(1, 0, 1.0)])


def test_a_receiver_books_a_fan_out_copy_as_a_fair_share_of_the_senders_egress():
    """Hop's updates on a ring: two senders, each sending two copies, into one receiver's
    ingress: both arrive when the senders' egress is done, 2b/B, as with fair sharing."""
    net = model()
    first = net.deliver(Message(1, 0, 10 * MB), at=0.0, copies=2)
    second = net.deliver(Message(3, 0, 10 * MB), at=0.0, copies=2)
    assert first == second == pytest.approx(2 * 10 * MB / B + L)
    third = net.deliver(Message(5, 0, 10 * MB), at=0.0, copies=1)  # behind them at the ingress
    assert third == pytest.approx(3 * 10 * MB / B + L)


def test_a_scatter_gather_sends_a_ring_s_bytes_in_two_rounds():
    """Each member sends 2(k-1)/k of the buffer, as a ring does; each second-round message
    waits for the k-1 shares its sender owns."""
    k, nbytes = 4, 1000.0
    messages = scatter_gather(range(k), nbytes)
    assert len(messages) == 2 * k * (k - 1)
    for r in range(k):
        assert sum(m.nbytes for m in messages if m.src == r) == pytest.approx(
            sum(m.nbytes for m in ring_allreduce(range(k), nbytes) if m.src == r))
    second = messages[k * (k - 1):]
    assert all(len(m.after) == k - 1 and all(messages[i].dst == m.src for i in m.after)
               for m in second)
    spec = parse_network("bandwidth=8kbit,latency=0s")  # 1000 bytes/s a NIC
    assert NetworkModel(spec, k).duration(messages) == pytest.approx(2 * (k - 1) * 0.25)


def test_receiving_threads_book_a_nic_without_losing_a_booking():
    """Hop's receiving threads, one per in-neighbour, book arrivals on one NIC clock
    (`NetworkEmulator.deliver`): with a thread switch forced between a booking's read and its
    write, two unlocked bookings could share one ingress slot (review 4, item 5: 617 of
    20,000 lost)."""
    emulator = NetworkEmulator(parse_network("bandwidth=8Mbit,latency=0s"), 3, time.time)
    per_thread, nbytes = 5000, 1000.0  # 1 ms each at 1 MB/s

    def book(src: int) -> None:
        for _ in range(per_thread):
            emulator.deliver(Message(src, 0, nbytes), 1, 0.0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=book, args=(src,)) for src in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert emulator.model.ingress_free[0] == pytest.approx(2 * per_thread * 1e-3)
