"""Files that readers may open while they are written: written aside, then renamed over."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replacing", "write_text"]


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed over `path` (atomically, on one
    file system) once the block ends without an error, so a reader (`hetsync report`, the
    evaluator, a resume after a kill) sees the old file or the new one, never half of one."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:  # a full disk, an interrupt: no half-written file left behind
        partial.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """`path.write_text(text)`, atomically (see `replacing`)."""
    with replacing(path) as partial:
        partial.write_text(text)
