"""The cost model against the kernel's own traffic shaping, on the smallest case: one transfer
between two gloo processes in network namespaces whose NICs `tc` limits (experiments/shaping.py;
experiments/network_validation.py runs the all-reduce and the incast too)."""

from __future__ import annotations

import importlib
import statistics

import pytest

from hetsync.network.model import NetworkModel
from hetsync.network.patterns import point_to_point
from hetsync.network.spec import parse_network

SIZE = 4_000_000  # 0.32 s at 100 Mbit/s


@pytest.fixture(scope="module")
def scripts(experiments_on_path):
    return importlib.import_module("shaping"), importlib.import_module("shaped_timing")


@pytest.mark.integration
def test_a_shaped_transfer_takes_what_the_model_says(scripts):
    shaping, timing = scripts
    reason = shaping.unavailable_reason()
    if reason:
        pytest.skip(f"no traffic shaping here: {reason}")
    spec = parse_network("bandwidth=100Mbit")
    with shaping.ShapedNetwork(2) as net:
        net.shape(spec.default.egress * 8)
        result = timing.time_cases(net, ["p2p"], SIZE, repeats=2, timeout_s=60)
    shaped = statistics.median(result["cases"]["p2p"]["durations_s"])
    modelled = NetworkModel(spec, 2).duration(point_to_point(0, 1, SIZE))
    assert shaped == pytest.approx(modelled, rel=0.15)
