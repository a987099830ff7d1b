"""hetsync's modules form layers: a module imports only from its own layer or lower ones.

The layers, bottom to top (DEVELOPERS.md says what each holds):

    base       errors, the step record (step), cores, topology, the network model (network,
               but its emulator), faults, slowdowns, CPU affinity, glibc's malloc settings,
               users' files (user_files), workloads, file formats (metrics.strict_json,
               metrics.atomic), where a worker computes (transport.placement: a rule over
               counts), and the protocols' low half: the
               empty package inits, variant, catalog, run_options and each package's decisions,
               options and variants (every module of hetsync.protocols.<x> but those below)
    config     the run's options, with the chosen protocol's
    metrics    what a run measures and writes
    transport  moving bytes: transport, network.emulator, the protocols' wire formats (*wire),
               Prague's P-Reduce (protocols.prague.preduce)
    drivers    protocols.base, protocols.registry, each protocol's driver (a module, or a package)
    session    joining a run: hetsync.init (session); the data dealt to its workers
               (hetsync.data, but its arithmetic, data.dealing: base)
    api        SyncOptimizer (api) and the public names (the hetsync package)
    launch     the launcher, its workers, monitor and checkpoints
    simulator  the simulator and each protocol's simulation and fuzzed invariants
               (protocols.<x>.simulation, protocols.<x>.invariants)
    report     reports and plots of finished runs
    bench      the benchmark suites (they run, simulate and report)
    cli        the command line and the demo

Every import counts: at the top, inside a function (late) or under TYPE_CHECKING; `from
hetsync.x import y` where y is a module imports hetsync.x.y, and importing a module imports its
packages' `__init__` too (a package `__init__` that imports nothing of hetsync is base). Imports
by name at run time (importlib: the registry's drivers, the catalog's options, the hetsync
package's public names) are not seen, and each goes within the layers anyway.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from functools import cache
from pathlib import Path

import hetsync

SRC = Path(hetsync.__file__).parent

LAYERS = ("base", "config", "metrics", "transport", "drivers", "session", "api", "launch",
          "simulator", "report", "bench", "cli")
#: (pattern, layer): a module is in the layer of the first pattern it matches.
RULES = (
    ("hetsync.protocols.*.driver", "drivers"),
    ("hetsync.protocols.*.driver.*", "drivers"),  # a driver of several modules: a package
    ("hetsync.protocols.*.simulation", "simulator"),
    ("hetsync.protocols.*.invariants", "simulator"),
    ("hetsync.protocols.*.server", "drivers"),  # a driver's serving side (the ps server)
    ("hetsync.protocols.*.*wire", "transport"),
    ("hetsync.protocols.prague.preduce", "transport"),
    ("hetsync.protocols.base", "drivers"),
    ("hetsync.protocols.registry", "drivers"),
    ("hetsync.protocols*", "base"),
    ("hetsync.network.emulator", "transport"),
    ("hetsync.network*", "base"),
    ("hetsync.transport.placement", "base"),
    ("hetsync.transport.codec*", "base"),  # the wire format: pure arithmetic, no I/O
    ("hetsync.transport*", "transport"),
    ("hetsync.metrics.strict_json", "base"),
    ("hetsync.metrics.atomic", "base"),
    ("hetsync.metrics*", "metrics"),
    ("hetsync.errors", "base"),
    ("hetsync.step", "base"),
    ("hetsync.cores*", "base"),
    ("hetsync.topology", "base"),
    ("hetsync.faults", "base"),
    ("hetsync.slowdown", "base"),
    ("hetsync.affinity", "base"),
    ("hetsync.malloc_settings", "base"),
    ("hetsync.user_files", "base"),
    ("hetsync.workloads*", "base"),
    ("hetsync.config", "config"),
    ("hetsync.session", "session"),
    ("hetsync.data.dealing", "base"),
    ("hetsync.data*", "session"),
    ("hetsync.api", "api"),
    ("hetsync", "api"),
    ("hetsync.launch*", "launch"),
    ("hetsync.simulator*", "simulator"),
    ("hetsync.report*", "report"),
    ("hetsync.bench*", "bench"),
    ("hetsync.cli", "cli"),
    ("hetsync.demo", "cli"),
)
#: What a module of decisions must not reach, directly or through hetsync's modules: cores stay
#: free of I/O so that real drivers, tests and the simulator drive them alike.
BANNED = ("torch.distributed", "threading", "socket", "subprocess", "time")


@cache
def _modules() -> dict[str, Path]:
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = ("hetsync", *path.relative_to(SRC).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@cache
def _imported_names(module: str) -> frozenset[str]:
    """Every absolute name `module` imports, anywhere in it (`from x import y`: x and x.y)."""
    path = _modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


@cache
def _imports(module: str) -> frozenset[str]:
    """The hetsync modules `module` imports, with their packages (but its own)."""
    modules = _modules()
    found = set()
    for name in _imported_names(module):
        while name and name not in modules:  # from m import attribute: m
            name = name.rpartition(".")[0]
        while name:
            if name in modules and name != module and not module.startswith(name + "."):
                found.add(name)
            name = name.rpartition(".")[0]
    return frozenset(found)


def _layer(module: str) -> str | None:
    if _modules()[module].name == "__init__.py" and not _imports(module):
        return "base"  # an empty package: any import of its modules runs it
    return next((layer for pattern, layer in RULES if fnmatch.fnmatchcase(module, pattern)),
                None)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if _layer(m) is None)
    assert not unplaced, f"add to RULES (and to DEVELOPERS.md's layers): {unplaced}"


def test_no_module_imports_from_a_higher_layer():
    upward = []
    for module in sorted(_modules()):
        own = LAYERS.index(_layer(module) or "cli")
        for imported in sorted(_imports(module)):
            theirs = LAYERS.index(_layer(imported) or "cli")
            if theirs > own:
                upward.append(f"{module} -> {imported} ({LAYERS[theirs]} above {LAYERS[own]})")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def _cycle() -> list[str] | None:
    """One import cycle, as the modules along it (the first again at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(_imports(module)):
            if (cycle := visit(imported)) is not None:
                return cycle
        path.pop()
        done.add(module)
        return None

    return next((c for m in sorted(_modules()) if (c := visit(m)) is not None), None)


def test_the_imports_have_no_cycle():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_decisions_do_no_io():
    """The cores and the protocols' decisions (the base layer of hetsync.cores and
    hetsync.protocols.<x>) reach no I/O module, directly or through what they import."""
    decisions = [m for m in _modules() if _layer(m) == "base"
                 and (m.startswith("hetsync.cores.") or m.count(".") >= 3)]
    assert len(decisions) > 10
    for module in decisions:
        reached, todo = {module}, [module]
        while todo:
            current = todo.pop()
            for name in _imported_names(current):
                if any(name == b or name.startswith(b + ".") for b in BANNED):
                    via = "" if current == module else f" (through {current})"
                    raise AssertionError(f"{module} imports {name}{via}")
            for imported in _imports(current) - reached:
                reached.add(imported)
                todo.append(imported)


def test_reading_the_options_imports_no_torch():
    """The CLI reads and checks options (and `hetsync --help` answers) without torch."""
    code = "import sys, hetsync.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=SRC.parent)
