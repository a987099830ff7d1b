"""Load a run directory (see docs/run-directory.md) into memory.

Runs may have been killed mid-write, so missing optional files and a truncated last
JSON line are tolerated; only summary.json is required. What the report reads of them is
checked here, once: a damaged or hand-edited file is refused in one line naming the file and
the field (ConfigError), rather than failing deep in a table or a plot.
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


#: summary.json's fields that the table and plots format as numbers; each may be null.
_SUMMARY_NUMBERS = ("wall_time_s", "samples_per_s", "time_to_target_s", "target_loss",
                    "final_loss", "final_accuracy", "final_consensus_distance",
                    "sync_wait_fraction")
#: Fields of each row the plots read: (required numbers, numbers that may be null).
_WORKER_FIELDS = (("t", "iteration"), ())
_EVAL_FIELDS = (("t",), ("loss", "accuracy", "consensus_distance"))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_summary(summary: dict[str, Any], file: Path) -> None:
    """Refuse a summary whose fields the report reads are missing or of the wrong type."""
    if "protocol" not in summary:
        raise ConfigError(f"{file} is not a run summary (no protocol)")

    def wrong(field: str, expected: str) -> ConfigError:
        return ConfigError(f"{file}: {field} must be {expected} "
                           f"(got {_shown(summary[field])})")

    for field in ("protocol", "label"):
        value = summary.get(field)
        if not (isinstance(value, str) or (field == "label" and value is None)):
            raise wrong(field, "a string")
    for field in _SUMMARY_NUMBERS:
        if summary.get(field) is not None and not _is_number(summary[field]):
            raise wrong(field, "a number or null")
    iterations = summary.get("iterations")
    if iterations is not None and not (isinstance(iterations, list)
                                       and all(_is_number(i) for i in iterations)):
        raise wrong("iterations", "a list of numbers or null")
    per_thread = summary.get("thread_cpu_ms_per_iteration")
    if per_thread is not None and not (isinstance(per_thread, dict)
                                       and all(_is_number(v) for v in per_thread.values())):
        raise wrong("thread_cpu_ms_per_iteration", "an object of numbers or null")
    lost = summary.get("lost_workers")
    if lost is not None and not (isinstance(lost, list) and all(
            isinstance(w, dict) and "rank" in w
            and (w.get("at_s") is None or _is_number(w["at_s"])) for w in lost)):
        raise wrong("lost_workers", "a list of objects with rank and at_s")


def _read_rows(file: Path, fields: tuple[tuple[str, ...], tuple[str, ...]]
               ) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (a torn last line skipped), each with `fields`' numbers."""
    try:
        rows = read_jsonl(file)
    except UnicodeDecodeError:
        raise ConfigError(f"{file} is not a text file (not UTF-8)") from None
    except OSError as error:
        raise ConfigError(f"{file} cannot be read: {error.strerror or error}") from None
    required, optional = fields
    for number, row in enumerate(rows, 1):
        for field in (*required, *optional):
            value = row.get(field)
            if not (_is_number(value) or (value is None and field in optional)):
                raise ConfigError(f"{file}, row {number}: {field} must be a number "
                                  f"(got {_shown(value)})")
    return rows


def _read_workers(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Map each rank to its rows, in rank order."""
    if not folder.is_dir():
        return {}
    ranks = {}
    for file in folder.iterdir():
        match = _RANK_FILE.fullmatch(file.name)
        if match:
            ranks[int(match.group(1))] = _read_rows(file, _WORKER_FIELDS)
    return dict(sorted(ranks.items()))


def load_run(path: str | Path) -> Run:
    """Load the run directory at `path`; raise FileNotFoundError if it is not one, ConfigError
    if a file of it cannot be read or holds what the report cannot show."""
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
    except OSError as error:
        raise ConfigError(f"{summary_file} cannot be read: {error.strerror or error}") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{summary_file} is not a run summary (not a JSON object)")
    _check_summary(summary, summary_file)
    return Run(
        path=path,
        summary=summary,
        eval_rows=_read_rows(path / "eval.jsonl", _EVAL_FIELDS),
        worker_rows=_read_workers(path / "workers"),
    )
