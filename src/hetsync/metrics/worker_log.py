"""A worker's records: one JSON line per iteration and periodic snapshots of its model.

Both stay off the critical path: log rows are buffered and flushed about once a second, and a
snapshot is one `torch.save` of the state dict every `eval_every` seconds (evaluated by another
process). A worker that was blocked across several snapshot times writes each missing one as a
hard link of the same file, so every snapshot index exists for every rank. A snapshot is
serialized into memory the worker keeps and, from 4 MiB, written past the page cache
(hetsync.metrics.direct_file): a new file's fresh pages were most of a large one's cost.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO

import torch
from torch import nn
from torch.utils.serialization import config as serialization_config

from hetsync.metrics import strict_json
from hetsync.metrics.atomic import replacing, write_text
from hetsync.metrics.direct_file import DirectFile

__all__ = ["IterationLog", "Snapshotter", "snapshot_path"]


def snapshot_path(run_dir: Path, index: int | str, rank: int) -> Path:
    """Where rank `rank` writes snapshot `index` (an int, or "final")."""
    name = index if isinstance(index, str) else f"{index:06d}"
    return run_dir / "snapshots" / str(name) / f"rank{rank}.pt"


class IterationLog:
    """Buffered writer of `workers/rank{r}.jsonl` (see docs/run-directory.md).

    The file is opened at the first flush, so that a resumed worker can say first
    (`resume_after`) that it goes on from a checkpoint: the rows up to it are kept, the later
    ones (work the failure threw away) dropped, and the new rows appended."""

    def __init__(self, run_dir: Path, rank: int, flush_every: float = 1.0) -> None:
        self.path = run_dir / "workers" / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = None
        self._mode = "w"
        self._rows: list[str] = []
        self._flush_every = flush_every
        self._last_flush = time.monotonic()

    def resume_after(self, iteration: int) -> None:
        """Keep the rows of iterations up to `iteration` and append after them."""
        if self._file is not None:
            raise RuntimeError("hetsync: resume before the first iteration is logged")
        if self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if _iteration(line) <= iteration]
            write_text(self.path, "".join(line + "\n" for line in kept))
        self._mode = "a"

    def append(self, row: dict[str, float | int]) -> None:
        self._rows.append(strict_json.dumps(row))
        if time.monotonic() - self._last_flush >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if self._file is None:
            self._file = self.path.open(self._mode)
        if self._rows:
            self._file.write("\n".join(self._rows) + "\n")
            self._file.flush()
            self._rows.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        assert self._file is not None
        self._file.close()


def _image_size(state: Mapping[str, torch.Tensor]) -> int:
    """What `torch.save` of a snapshot of `state` takes at most: the tensors' bytes, and room
    for the archive's records (1.8 kB and 285-445 bytes a tensor for the built-in models),
    so that the first image does not outgrow its buffer (growing copies it into one twice
    its size, every page of it new)."""
    return sum(t.numel() * t.element_size() for t in state.values()) + 4096 + 1024 * len(state)


def _iteration(row: str) -> float:
    """A row's iteration; inf for a line cut short by the failure (dropped)."""
    try:
        return float(json.loads(row)["iteration"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


class Snapshotter:
    """Writes the model's state every `every` seconds of run time, and once at the end."""

    def __init__(self, run_dir: Path, rank: int, every: float) -> None:
        self.run_dir, self.rank, self.every = run_dir, rank, every
        self._next_index = 0  # index 0: the model right after the first iteration
        self._image: DirectFile | None = None  # each snapshot's bytes, before the file

    def prepare(self, model: nn.Module) -> None:
        """Make the buffer the snapshots are serialized into, its pages touched, now: before
        the run's clock, not inside the first snapshot (11,000 page faults for a 45 MB model,
        0.15-0.45 s of a quarter-core worker's first seconds; metrics.direct_file)."""
        self._image = DirectFile(_image_size(model.state_dict()))

    def maybe_snapshot(self, model: nn.Module, elapsed: float, iteration: int,
                       hold: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        """Snapshot the model if one is due; `hold()` is held while it is read (the protocol's
        `model_lock`: no other thread writes into it meanwhile)."""
        due = int(elapsed // self.every)
        if due < self._next_index:
            return
        self._write(model, self._next_index, iteration, elapsed,
                    also=range(self._next_index + 1, due + 1), hold=hold)
        self._next_index = due + 1

    def resume(self, elapsed: float) -> None:
        """Go on from run time `elapsed`: the next snapshot is the first due after it (the
        earlier ones belong to the run before)."""
        self._next_index = int(elapsed // self.every) + 1

    def final(self, model: nn.Module, elapsed: float, iteration: int) -> None:
        self._write(model, "final", iteration, elapsed)

    def _write(self, model: nn.Module, index: int | str, iteration: int, elapsed: float,
               also: range = range(0),
               hold: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        """Snapshot `index`, and the indexes `also` as hard links of it, made before `index`
        appears: the evaluator may take a complete set, and drop it, as soon as it does."""
        target = snapshot_path(self.run_dir, index, self.rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        # No copy on the CPU: torch.save writes the tensors as they are (a clone of a 45 MB
        # model was as many page faults and a pass more, each snapshot, on the training thread),
        # into the image in memory, under `hold`: no other thread writes the model until the
        # image is whole (10-25 ms at 45 MB, as long as a flat copy; the file is written after).
        with hold():
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            if self._image is None:
                self._image = DirectFile(_image_size(state))
            self._image.rewind()
            # No zip checksum either: a snapshot is written once, whole (`replacing`), and
            # read back within the run; the CRC was 10 of 23 ms of CPU a 45 MB snapshot, on
            # the training thread every few seconds (four times that on a worker at a quarter
            # core). The setting is patched for this thread only.
            with serialization_config.patch({"save.compute_crc32": False}):
                torch.save({"iteration": iteration, "t": elapsed, "state": state}, self._image)
        with replacing(target) as partial:
            self._image.save(partial)  # a large one past the page cache (direct_file)
            for other in also:
                link = snapshot_path(self.run_dir, other, self.rank)
                link.parent.mkdir(parents=True, exist_ok=True)
                os.link(partial, link)
