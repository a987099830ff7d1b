"""The Group Generator's wire messages round-trip exactly (review 3, item 5: as float32, group
id 2^24 + 1 arrived as 2^24)."""

from __future__ import annotations

import math

from hetsync.protocols.prague.gg_wire import FromGG, ToGG
from hetsync.protocols.prague.group_generator import Group


def _received(message, empty):
    empty.copy_(message)  # what a receive into a fresh buffer holds
    return empty


def test_an_assignment_past_float32s_integers_survives():
    group = Group(id=2**24 + 1, members=(0, 5, 7))
    sent = FromGG(group, answers_request=True, held=0.123456789)
    assert FromGG.decode(_received(sent.encode(8), FromGG.empty(8))) == sent


def test_the_end_marker_and_a_request_survive():
    assert FromGG.decode(_received(FromGG(None).encode(4), FromGG.empty(4))).group is None
    for sent in (ToGG(1, 2**24 + 1, 1.0), ToGG(3, 2**53 + 1, -math.inf),
                 ToGG(1, 7, 0.0, finished=2**40 + 3)):  # a group finished, told with it
        assert ToGG.decode(_received(sent.encode(), ToGG.empty())) == sent
