"""P-Reduce on 8 real processes over gloo, every implementation: exact averages, non-members
untouched, concurrent disjoint groups, members with different group histories. Also the mesh's
`average_surviving`, the P-Reduce of every `--on-failure continue` Prague run, without a loss,
and the mesh and the scatter-gather with their models encoded (`--compress`)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from hetsync.errors import ConfigError
from hetsync.network.emulator import FreeNetwork
from hetsync.protocols.prague.options import PREDUCE_KINDS as KINDS
from hetsync.protocols.prague.preduce import RING_FROM_BYTES, free_network_kind, make_preducer
from hetsync.transport.channel import Channel
from hetsync.transport.codec import Codec
from hetsync.transport.links import Link

WORLD = 8
NUMEL = 1001  # a multiple of no group size: the ring's chunks are uneven
TIMEOUT = datetime.timedelta(seconds=30)
JOIN_TIMEOUT_S = 90.0
#: Rounds run one after another; the groups of a round run at the same time; a rank in no
#: group of a round skips it, so members come to a group with different histories.
SCHEDULE: list[list[tuple[int, ...]]] = [
    [(0, 3), (1, 2, 5), (4,), (6, 7)],
    [(0, 1, 6), (2, 3, 4, 5, 7)],
    [tuple(range(WORLD))],
    [(2, 6)],
    [(0, 1)],
    [(0, 2)],
    [(1, 2)],
    [(0, 3), (1, 2, 5), (4,), (6, 7)],
    [(0, 1), (2, 6), (3, 4, 5, 7)],
]
#: A cache of 2 groups makes some members keep a group that others use once, and makes
#: (0, 1) and (2, 6) one-shot groups that are created twice.
VARIANTS: dict[str, dict[str, object]] = {
    **{kind: {"kind": kind} for kind in KINDS},
    "subgroup-cache2": {"kind": "subgroup", "cache_size": 2},
    "mesh-surviving": {"kind": "mesh"},
    **{f"{kind}-from-source": {"kind": kind} for kind in ("mesh", "ring", "leader", "subgroup")},
    "mesh-surviving-from-source": {"kind": "mesh"},
    "mesh-bf16": {"kind": "mesh", "codec": "bf16"},
    "mesh-int8": {"kind": "mesh", "codec": "int8"},
    "mesh-int8-surviving": {"kind": "mesh", "codec": "int8"},
    "auto-int8": {"kind": "auto", "codec": "int8"},  # 4 members: the scatter-gather
    "auto-bf16": {"kind": "auto", "codec": "bf16"},
    "auto-int8-from-source": {"kind": "auto", "codec": "int8"},
}
#: Variants whose models travel encoded (`--compress`): averages within the codec's error.
COMPRESSED = frozenset(name for name, options in VARIANTS.items() if "codec" in options)
#: Variants that average through `average_surviving` (no member is lost: none may be refused).
SURVIVING = frozenset({"mesh-surviving", "mesh-surviving-from-source", "mesh-int8-surviving"})
#: Variants that average out of place: a new buffer each round, the last one only read.
FROM_SOURCE = frozenset(name for name in VARIANTS if name.endswith("-from-source"))


def _channel(rank: int, codec: str) -> Channel:
    """A channel of the default link in `codec`'s wire format (what a driver passes)."""
    return Channel(Link.default(), SimpleNamespace(rank=rank), FreeNetwork(),  # type: ignore[arg-type]
                   Codec(codec))


def _no_loss(peer: int, error: BaseException) -> None:
    raise AssertionError(f"average_surviving left out rank {peer}, which was not lost") from error


def _initial(rank: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(rank))


def _worker(rank: int, port: int, out: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=WORLD, timeout=TIMEOUT)
    states: dict[str, list[torch.Tensor]] = {}
    for name, options in VARIANTS.items():
        options = dict(options)
        if "codec" in options:
            options["channel"] = _channel(rank, str(options.pop("codec")))
        preducer = make_preducer(rank=rank, world=WORLD, store=dist.PrefixStore(name, store),
                                 timeout=TIMEOUT, **options)  # type: ignore[arg-type]
        flat = _initial(rank)
        states[name] = []
        for groups in SCHEDULE:
            for group in groups:
                if rank not in group:
                    continue
                source, before = flat, flat.clone()
                if name in FROM_SOURCE:
                    flat = torch.full_like(source, float("nan"))
                if name in SURVIVING:
                    assert preducer.average_surviving(flat, group, _no_loss, source) == group
                else:
                    preducer.average(flat, group, source)
                if name in FROM_SOURCE:
                    assert torch.equal(source, before), f"{name} wrote its source"
            states[name].append(flat.clone())
        preducer.close()
        dist.barrier()
    torch.save(states, out / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def states(tmp_path_factory, spawn) -> list[dict[str, list[torch.Tensor]]]:
    """Per rank, per variant: the buffer after each round of SCHEDULE (one launch for all)."""
    out = tmp_path_factory.mktemp("preduce")
    spawn(_worker, WORLD, out).join(JOIN_TIMEOUT_S)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def _before(states: list[dict[str, list[torch.Tensor]]], variant: str, i: int, rank: int):
    return _initial(rank) if i == 0 else states[rank][variant][i - 1]


@pytest.mark.integration
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in COMPRESSED])
def test_members_get_the_exact_average_and_others_keep_theirs(states, variant):
    _check_averages(states, variant, 1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(COMPRESSED))
def test_encoded_models_average_within_the_codec_s_error(states, variant):
    """Values of randn, at most about 4: a bf16 value is within 2^-8 of it relatively, an int8
    one within half a step of its chunk's largest / 127; the error fed back into the next
    encoding adds as much again."""
    _check_averages(states, variant, 0.05)


def _check_averages(states, variant: str, tolerance: float) -> None:
    for i, groups in enumerate(SCHEDULE):
        members = {r for group in groups for r in group if len(group) > 1}
        for group in groups:
            mean = torch.stack([_before(states, variant, i, r).double() for r in group]).mean(0)
            for r in group:
                error = (states[r][variant][i].double() - mean).abs().max().item()
                assert error < tolerance, f"round {i}, group {group}, rank {r}: error {error}"
        for r in set(range(WORLD)) - members:
            assert torch.equal(states[r][variant][i], _before(states, variant, i, r))


@pytest.mark.integration
@pytest.mark.parametrize("variant", VARIANTS)
def test_members_end_bit_identical(states, variant):
    for i, groups in enumerate(SCHEDULE):
        for group in groups:
            first = states[group[0]][variant][i]
            assert all(torch.equal(states[r][variant][i], first) for r in group), (i, group)


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(FROM_SOURCE))
def test_out_of_place_averages_are_the_in_place_ones_bit_for_bit(states, variant):
    """Each round of a `-from-source` variant averaged the last one's buffer into a new one
    (its NaNs all overwritten) and left it as it was (checked on each rank as it ran)."""
    in_place = variant.removesuffix("-from-source")
    for rank in range(WORLD):
        for i, (theirs, ours) in enumerate(zip(states[rank][in_place], states[rank][variant],
                                               strict=True)):
            assert torch.equal(theirs, ours), (rank, i)


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(SURVIVING))
def test_with_nobody_lost_the_surviving_average_is_the_mesh_s_bit_for_bit(states, variant):
    """Same sums in the same order, and a pair's mean the same one pass (`pair_mean`)."""
    mesh = variant.replace("-surviving", "")
    for rank in range(WORLD):
        for i, (theirs, ours) in enumerate(zip(states[rank][mesh], states[rank][variant],
                                               strict=True)):
            assert torch.equal(theirs, ours), (rank, i)


@pytest.mark.parametrize("kind", KINDS)
def test_one_member_group_is_a_local_no_op(kind):
    """No process group exists here: any communication would raise."""
    flat = _initial(3)
    expected = flat.clone()
    make_preducer(kind, rank=3, world=8, store=dist.HashStore()).average(flat, (3,))
    assert torch.equal(flat, expected)


@pytest.mark.parametrize("group", [(0, 2), (3, 1), (1, 1), (1, 8)])
def test_bad_groups_are_refused(group):
    with pytest.raises(ValueError, match="sorted distinct ranks"):
        make_preducer("mesh", rank=1, world=8).average(torch.zeros(4), group)


def test_bad_kind_or_missing_store_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown P-Reduce kind 'x'"):
        make_preducer("x", rank=0, world=2)
    with pytest.raises(ConfigError, match="needs a store"):
        make_preducer("subgroup", rank=0, world=2)
    with pytest.raises(ConfigError, match="--compress int8 needs --preduce mesh or auto"):
        make_preducer("ring", rank=0, world=2, channel=_channel(0, "int8"))


def test_on_a_free_network_auto_takes_the_mesh_for_small_buffers_and_the_ring_for_large():
    assert free_network_kind(0.7e6) == "mesh"  # the ResNet of width 8
    assert free_network_kind(RING_FROM_BYTES - 1) == "mesh"
    assert free_network_kind(RING_FROM_BYTES) == "ring"
    assert free_network_kind(45.5e6) == "ring"  # mlp-wide, a full-width ResNet-18
