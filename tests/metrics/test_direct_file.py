"""The snapshot's in-memory image and its write past the page cache (with the page cache's
write where the file system refuses O_DIRECT)."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import pytest
import torch

from hetsync.metrics.direct_file import DIRECT_FROM, DirectFile


def _state(n: int) -> dict[str, torch.Tensor]:
    return {"w": torch.arange(n, dtype=torch.float32), "step": torch.tensor(n)}


def _check(path: Path, state: dict[str, torch.Tensor]) -> None:
    loaded = torch.load(path)
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def _images_load_back(folder: Path) -> None:
    image = DirectFile(size_hint=100)  # too small at first: it grows
    path = folder / "snap.pt"
    big = DIRECT_FROM // 4 + 1000  # float32s: an image past the page cache
    for n in (big, 5, 3 * big):  # bigger, then smaller over it, then bigger again
        state = _state(n)
        image.rewind()
        torch.save(state, image)
        image.save(path)
        assert path.stat().st_size == len(image)  # nothing left of a longer image
        _check(path, state)


def test_images_of_any_size_load_back_whole_one_after_another(tmp_path):
    _images_load_back(tmp_path)


def test_where_o_direct_is_refused_the_page_cache_takes_the_write(tmp_path, monkeypatch):
    """As a file system without O_DIRECT refuses it (EINVAL at the open)."""
    real_open = os.open
    refused = []

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    _images_load_back(tmp_path)
    assert len(refused) == 2  # the small image did not ask


def test_only_an_image_of_direct_from_bytes_or_more_asks_for_o_direct(tmp_path, monkeypatch):
    real_open, asked = os.open, []

    def spy(path, flags, *args):
        asked.append(bool(flags & os.O_DIRECT))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", spy)
    for n in (DIRECT_FROM // 4 - 1000, DIRECT_FROM // 4 + 1000):
        image = DirectFile()
        torch.save(_state(n), image)
        image.save(tmp_path / f"{n}.pt")
        _check(tmp_path / f"{n}.pt", _state(n))
    assert asked == [True]  # the small image went through the page cache (no os.open)


def test_a_failure_other_than_a_refused_o_direct_is_raised(tmp_path):
    image = DirectFile()
    torch.save(_state(10), image)
    with pytest.raises(FileNotFoundError):
        image.save(tmp_path / "no such folder" / "snap.pt")


def test_the_first_image_touches_no_new_page():
    """Its pages are touched as it is made (before a run's clock), not by the first image."""
    state = _state(4 << 20)  # 16 MB
    image = DirectFile(size_hint=17 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.save(state, image)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 64  # 4,096 untouched
