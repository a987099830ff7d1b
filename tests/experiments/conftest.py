"""The experiments' scripts are not a package: tests import them with their folder on the path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXPERIMENTS = str(Path(__file__).parents[2] / "experiments")


@pytest.fixture(scope="module")
def experiments_on_path() -> Iterator[None]:
    """experiments/ on sys.path for one test module (`importlib.import_module` its scripts)."""
    sys.path.insert(0, EXPERIMENTS)
    try:
        yield
    finally:
        sys.path.remove(EXPERIMENTS)
