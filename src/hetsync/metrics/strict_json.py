"""Strict JSON for every file hetsync writes: a NaN or an infinity is written as null.

Python's `json` writes `NaN` and `Infinity` by default, which no strict reader (jq, a browser,
Go, Rust) accepts; a diverged run's losses are exactly such values. `dumps` maps every
non-finite float to None first and then refuses any that remains (`allow_nan=False`).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def finite(value: Any) -> Any:
    """`value` with every non-finite float, at any depth of dicts, lists and tuples, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps(value, **kwargs)`, with NaN and infinities written as null."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
