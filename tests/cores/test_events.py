"""The events several cores take are one class each, frozen, slotted and keyword-only."""

from __future__ import annotations

import dataclasses

import pytest

from hetsync.cores.events import ComputeFinished, IterationStarted
from hetsync.protocols.adpsgd import core as adpsgd
from hetsync.protocols.dpsgd import core as dpsgd
from hetsync.protocols.hop import core as hop


def test_the_cores_take_the_same_training_loop_events():
    assert dpsgd.IterationStarted is adpsgd.IterationStarted is IterationStarted
    assert dpsgd.ComputeFinished is adpsgd.ComputeFinished is hop.ComputeFinished is (
        ComputeFinished)


def test_an_event_is_a_frozen_value_named_field_by_field():
    event = ComputeFinished(iteration=3)
    assert event == ComputeFinished(iteration=3, wants_stop=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.iteration = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        IterationStarted(3)  # type: ignore[misc]
    assert not hasattr(event, "__dict__")
