"""The tree shows the architecture: each protocol is one package (whose decisions do no I/O:
tests/test_layering.py checks that with the rest of the layers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hetsync
from hetsync.config import RunConfig
from hetsync.protocols.catalog import BUILTIN, PROTOCOL_OPTIONS
from hetsync.protocols.registry import available_protocols

SRC = Path(hetsync.__file__).parent


def test_every_builtin_protocol_is_a_package_with_a_driver_and_a_core():
    assert set(BUILTIN) == set(available_protocols())
    for name in BUILTIN:
        package = SRC / "protocols" / name
        assert (package / "driver.py").is_file() or (package / "driver" / "__init__.py").is_file()
        assert name == "ddp" or any(package.glob("core.py")) or name == "prague"


def test_run_options_come_from_the_protocols_packages():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    for options in PROTOCOL_OPTIONS:
        own = {f.name for f in dataclasses.fields(options)}
        assert own and own <= fields
        assert set(options.HELP) == own, f"{options.__module__}: every option needs its help"
    assert {"max_gap", "group_size", "ps_mode", "adpsgd_mode"} <= fields
