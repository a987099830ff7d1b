"""The tree shows the architecture: each protocol is one package (whose decisions do no I/O:
tests/test_layering.py checks that with the rest of the layers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hetsync
from hetsync.config import option_fields
from hetsync.protocols.catalog import BUILTIN, PROTOCOL_OPTIONS
from hetsync.protocols.registry import available_protocols

SRC = Path(hetsync.__file__).parent


def test_every_builtin_protocol_is_a_package_with_a_driver_and_a_core():
    assert set(BUILTIN) == set(available_protocols())
    for name in BUILTIN:
        package = SRC / "protocols" / name
        assert (package / "driver.py").is_file() or (package / "driver" / "__init__.py").is_file()
        assert name == "ddp" or any(package.glob("core.py")) or name == "prague"


def test_every_protocols_options_are_flags():
    """Each package's `Options` reach the command line (tests/protocols/test_options.py:
    declared, and without clashes)."""
    names = {f.name for f in option_fields()}
    for options in PROTOCOL_OPTIONS:
        own = {f.name for f in dataclasses.fields(options)}
        assert own and own <= names, options.__module__
