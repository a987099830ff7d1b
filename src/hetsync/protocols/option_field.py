"""One protocol option, declared where it lives: `option(default, help=..., ...)` in an
`Options` dataclass puts the flag's help, its allowed values and its range on the field itself,
so that config, the command line and the checks read one place (`spec_of`, `check_values`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from hetsync.errors import ConfigError

__all__ = ["OptionSpec", "check_values", "flag", "option", "spec_of"]

_KEY = "hetsync.option"


@dataclass(frozen=True)
class OptionSpec:
    """What a protocol option means and which values it takes."""

    help: str
    choices: tuple[str, ...] = ()
    at_least: int | None = None
    """0: must not be negative; 1: must be >= 1; None: no lower bound."""
    finite: bool = False
    default_text: str | None = None
    """The default in words where it is not a value (None: 'the power-of-two schedule')."""
    at_most: float | None = None
    """None: no upper bound."""


def option(default: Any, *, help: str, choices: tuple[str, ...] = (),
           at_least: int | None = None, finite: bool = False,
           default_text: str | None = None, at_most: float | None = None) -> Any:
    """A dataclass field for an `Options` class: `max_gap: int = option(8, help=...)`."""
    spec = OptionSpec(help, tuple(choices), at_least, finite, default_text, at_most)
    return dataclasses.field(default=default, metadata={_KEY: spec})


def spec_of(f: dataclasses.Field[Any]) -> OptionSpec | None:
    """The field's declaration; None where it was not declared with `option` (a unit test,
    tests/protocols/test_options.py, refuses such a field)."""
    return f.metadata.get(_KEY)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_values(options: object) -> None:
    """Raise ConfigError naming the first field of the `Options` instance out of its range or
    choices."""
    for f in dataclasses.fields(options):  # type: ignore[arg-type]
        spec, value = spec_of(f), getattr(options, f.name)
        if spec is None or value is None:
            continue
        if spec.choices and value not in spec.choices:
            raise ConfigError(f"{flag(f.name)} must be {' or '.join(spec.choices)} "
                              f"(got {value!r})")
        if spec.at_least == 0 and value < 0:
            raise ConfigError(f"{flag(f.name)} must not be negative (got {value})")
        if spec.at_least is not None and value < spec.at_least:
            raise ConfigError(f"{flag(f.name)} must be >= {spec.at_least} (got {value})")
        if spec.finite and not math.isfinite(value):
            raise ConfigError(f"{flag(f.name)} must be a finite number (got {value})")
        if spec.at_most is not None and value > spec.at_most:
            raise ConfigError(f"{flag(f.name)} must be at most {spec.at_most:g} (got {value:g})")
