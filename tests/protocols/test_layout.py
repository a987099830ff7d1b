"""The tree shows the architecture: each protocol is one package whose decisions do no I/O."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import hetsync
from hetsync.config import RunConfig
from hetsync.protocols.catalog import BUILTIN, PROTOCOL_OPTIONS
from hetsync.protocols.registry import available_protocols

SRC = Path(hetsync.__file__).parent
BANNED = {"torch.distributed", "threading", "socket", "subprocess", "time"}


def _decision_modules() -> list[Path]:
    """Every module of decisions: the shared cores and each protocol package but its driver."""
    paths = list((SRC / "cores").glob("*.py"))
    for name in BUILTIN:
        paths += [p for p in (SRC / "protocols" / name).glob("*.py") if p.name != "driver.py"]
    return paths


def test_decisions_do_no_io():
    """Cores stay free of I/O so that real drivers, tests and the simulator drive them alike."""
    modules = _decision_modules()
    assert len(modules) > 10
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not any(name == b or name.startswith(b + ".") for b in BANNED), (
                    f"{path.relative_to(SRC)} imports {name}")


def test_every_builtin_protocol_is_a_package_with_a_driver_and_a_core():
    assert set(BUILTIN) == set(available_protocols())
    for name in BUILTIN:
        package = SRC / "protocols" / name
        assert (package / "driver.py").is_file()
        assert name == "ddp" or any(package.glob("core.py")) or name == "prague"


def test_run_options_come_from_the_protocols_packages():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    for options in PROTOCOL_OPTIONS:
        own = {f.name for f in dataclasses.fields(options)}
        assert own and own <= fields
        assert set(options.HELP) == own, f"{options.__module__}: every option needs its help"
    assert {"max_gap", "group_size", "ps_mode", "adpsgd_mode"} <= fields
