"""Parsing `--network` and `--payload`: what is accepted, and one line for what is not."""

import pytest

from hetsync.errors import ConfigError
from hetsync.network.spec import MODELS, parse_network, parse_payload


def test_default_link_and_overrides():
    spec = parse_network("bandwidth=10Gbit,latency=50us;ranks=3+5:bandwidth=1Gbit/s")
    assert spec is not None
    assert spec.nic(0).egress == spec.nic(0).ingress == pytest.approx(1.25e9)
    assert spec.nic(0).latency == pytest.approx(50e-6)
    assert spec.nic(3).egress == spec.nic(5).ingress == pytest.approx(1.25e8)
    assert spec.nic(3).latency == pytest.approx(50e-6)


@pytest.mark.parametrize("text", ["", "none", "None"])
def test_none_is_a_free_network(text):
    assert parse_network(text) is None


@pytest.mark.parametrize(("text", "names"), [
    ("bandwidth=10Gbps", "cannot read rate"),
    ("bandwidth=-1Gbit", "cannot read rate"),
    ("bandwidth=0Gbit", "must be positive"),
    ("latency=5us", "give a bandwidth"),
    ("speed=1Gbit", "unknown setting"),
    ("bandwidth=1Gbit;rank=2:bandwidth=1Mbit", "cannot read"),
    ("bandwidth=1Gbit,latency=5parsecs", "cannot read latency"),
])
def test_malformed_network_is_one_line_naming_the_problem(text, names):
    with pytest.raises(ConfigError, match=names) as error:
        parse_network(text)
    assert "\n" not in str(error.value)


def test_rank_out_of_range():
    spec = parse_network("bandwidth=1Gbit;ranks=9:bandwidth=1Mbit")
    assert spec is not None
    with pytest.raises(ConfigError, match="rank 9"):
        spec.check_ranks(8)


def test_payload_sizes_and_models():
    assert parse_payload("100MB") == 100_000_000
    assert parse_payload("1GiB") == 2**30
    assert parse_payload("5000") == 5000
    assert parse_payload("resnet50") == MODELS["resnet50"] * 4
    assert parse_payload("none") is None


@pytest.mark.parametrize("text", ["resnet51", "-5MB", "0", "12 parsecs"])
def test_bad_payload_lists_what_is_accepted(text):
    with pytest.raises(ConfigError, match="--payload"):
        parse_payload(text)
