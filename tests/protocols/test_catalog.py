"""The catalog finds each protocol's pieces in its package: the variants every suite and fuzz
runs, the simulations, the protocols that tolerate a loss; no central list names them."""

from __future__ import annotations

import importlib
from pathlib import Path

from hetsync.config import RunConfig
from hetsync.protocols.catalog import BUILTIN, SIMULATED, TOLERATE_LOSS, all_variants
from hetsync.protocols.registry import available_protocols

PACKAGES = Path(importlib.import_module("hetsync.protocols").__file__).parent


def test_every_package_declares_one_default_and_unique_labels():
    variants = all_variants()
    assert set(BUILTIN) == set(available_protocols())
    for name in BUILTIN:
        assert [v.default for v in variants if v.protocol == name].count(True) == 1, name
    assert len({v.label for v in variants}) == len(variants)


def test_every_variant_is_a_valid_run():
    for variant in all_variants():  # 6: Group Division 2 of groups of 3
        RunConfig(**variant.run_options, workers=6).validate()


def test_simulations_are_the_packages_with_one():
    assert SIMULATED == tuple(n for n in BUILTIN if (PACKAGES / n / "simulation.py").is_file())
    for name in SIMULATED:
        assert callable(importlib.import_module(f"hetsync.protocols.{name}.simulation")
                        .build_workers)


def test_the_fault_fuzzed_variants_tolerate_a_loss():
    assert {"hop", "prague", "adpsgd", "ps"} <= set(TOLERATE_LOSS)
    assert {v.protocol for v in all_variants() if v.fault_fuzz} <= set(TOLERATE_LOSS)
