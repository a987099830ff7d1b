"""A file image built in memory that is reused, then written past the page cache.

Why: a worker writes a snapshot of its model every few seconds, and `torch.save` straight into
a new file fills fresh page-cache pages, whose first touch on a VM costs the training thread
more CPU than the snapshot itself. Serialized into memory this object keeps (its pages touched
once) and written with `O_DIRECT` from there, the write waits on the disk, not on the CPU. A
small image (under `DIRECT_FROM` bytes) goes through the page cache, where it costs less than a
wait for the disk, as does one that the file system refuses `O_DIRECT` for (EINVAL: tmpfs
before Linux 6.6, some network file systems).

Its pages are touched as the buffer is made (`madvise(MADV_POPULATE_WRITE)`, or a byte a page
on a kernel older than 5.14), so that a worker that makes it before its run's clock starts
(`Snapshotter.prepare`) does not pay the first touch inside its first snapshot. The figures:
docs/design.md, "Snapshots past the page cache".
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

__all__ = ["DIRECT_FROM", "DirectFile"]

_BLOCK = 4096  # O_DIRECT wants offsets, lengths and memory aligned to the device's block
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # <sys/mman.h>, Linux 5.14+
DIRECT_FROM = 4 << 20
"""Images of at least this many bytes are written past the page cache."""


class DirectFile:
    """A growing in-memory file (`write`, for `torch.save`) whose image `save` puts on disk.

    The buffer is an anonymous mapping (page-aligned), its pages touched as it is made and
    kept from image to image: only an image bigger than `size_hint` touches new ones."""

    def __init__(self, size_hint: int = 0) -> None:
        self._map = _touched(size_hint)
        self._length = 0

    def rewind(self) -> None:
        """Start a new image, over the old one."""
        self._length = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        end = self._length + len(view)
        if end > len(self._map):
            self._grow(end)
        self._map[self._length:end] = view
        self._length = end
        return len(view)

    def flush(self) -> None:
        """Nothing to flush: `save` writes the image."""

    def __len__(self) -> int:
        return self._length

    def save(self, path: Path) -> None:
        """Write the image to `path` (created or truncated), past the page cache where the
        file system allows it and the image is big enough to gain by it."""
        if self._length < DIRECT_FROM:
            self._save_buffered(path)
            return
        try:
            self._save_direct(path)
        except OSError as error:
            if error.errno != errno.EINVAL:  # not a refusal of O_DIRECT: a real failure
                raise
            self._save_buffered(path)

    def _save_buffered(self, path: Path) -> None:
        with memoryview(self._map) as view:
            path.write_bytes(view[:self._length])

    def _save_direct(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            with memoryview(self._map) as view:
                padded = _round_up(self._length)  # the tail past the image: cut off below
                done = 0
                while done < padded:
                    done += os.write(fd, view[done:padded])
            os.ftruncate(fd, self._length)
        finally:
            os.close(fd)

    def _grow(self, needed: int) -> None:
        bigger = _touched(max(needed, 2 * len(self._map)))
        bigger[:self._length] = self._map[:self._length]
        self._map.close()
        self._map = bigger


def _touched(size: int) -> mmap.mmap:
    """An anonymous mapping of at least `size` bytes, every page of it touched now."""
    mapping = mmap.mmap(-1, _round_up(max(size, 1)))
    try:
        mapping.madvise(_MADV_POPULATE_WRITE)
    except OSError:  # a kernel before 5.14 (EINVAL): a byte a page
        for offset in range(0, len(mapping), mmap.PAGESIZE):
            mapping[offset] = 0
    return mapping


def _round_up(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK
