"""Load a run directory (see docs/run-directory.md) into memory.

Runs may have been killed mid-write, so missing optional files and a truncated last
JSON line are tolerated; only summary.json is required.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsync.errors import ConfigError
from hetsync.metrics.summary import read_jsonl

_RANK_FILE = re.compile(r"rank(\d+)\.jsonl")


@dataclass(frozen=True)
class Run:
    """One finished run: its summary, its evaluations and each worker's iteration rows."""

    path: Path
    summary: dict[str, Any]
    eval_rows: list[dict[str, Any]]
    worker_rows: dict[int, list[dict[str, Any]]]

    @property
    def label(self) -> str:
        """The short name used in plots and tables."""
        return self.summary.get("label") or self.summary["protocol"]


def _read_workers(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Map each rank to its rows, in rank order."""
    if not folder.is_dir():
        return {}
    ranks = {}
    for file in folder.iterdir():
        match = _RANK_FILE.fullmatch(file.name)
        if match:
            ranks[int(match.group(1))] = read_jsonl(file)
    return dict(sorted(ranks.items()))


def load_run(path: str | Path) -> Run:
    """Load the run directory at `path`; raise FileNotFoundError if it is not one, ConfigError
    if its summary.json cannot be read."""
    path = Path(path)
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        raise FileNotFoundError(
            f"{path}: not a hetsync run directory (summary.json missing)"
        )
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{summary_file} cannot be read (truncated or not JSON: "
                          f"{error}): a damaged file, or one still being written") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{summary_file} is not a run summary (not a JSON object)")
    return Run(
        path=path,
        summary=summary,
        eval_rows=read_jsonl(path / "eval.jsonl"),
        worker_rows=_read_workers(path / "workers"),
    )
