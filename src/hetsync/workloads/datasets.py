"""Real datasets that exist on this machine without a download.

Fashion-MNIST comes from Debian's `dataset-fashion-mnist` package (or any folder holding the
standard IDX files); the 8x8 digits ship inside scikit-learn. Everything is returned as
in-memory tensors, normalised, with a fixed train/test split independent of the run's seed.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hetsync.errors import ConfigError

__all__ = ["DataSplit", "FASHION_MNIST_DIRS", "load_digits", "load_fashion_mnist", "read_idx"]

#: Searched in order when no --data-dir is given.
FASHION_MNIST_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)
_FASHION_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
_FASHION_MEAN, _FASHION_STD = 0.2860, 0.3530


@dataclass(frozen=True)
class DataSplit:
    """Training and held-out tensors: x is float32 (N, ...), y is int64 (N,)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped), the format MNIST-like datasets ship in."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = bytearray(f.read())  # writable, so torch can share the buffer
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError; a cut one, EOF
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise ConfigError(f"cannot read {path}: {reason}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ConfigError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ConfigError(f"{path} is truncated: header says {shape}, found {body.size} bytes")
    return body.reshape(shape)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def load_fashion_mnist(data_dir: Path | None = None) -> DataSplit:
    """Load Fashion-MNIST as (N, 1, 28, 28) normalised images; raise a clear error if absent."""
    folders = (Path(data_dir),) if data_dir else FASHION_MNIST_DIRS
    for folder in folders:
        paths = {key: _find(folder, stem) for key, stem in _FASHION_FILES.items()}
        if all(paths.values()):
            arrays = {key: read_idx(p) for key, p in paths.items() if p is not None}
            _check_split(arrays, paths)
            return DataSplit(
                train_x=_images(arrays["train_x"]),
                train_y=torch.from_numpy(arrays["train_y"].astype(np.int64)),
                test_x=_images(arrays["test_x"]),
                test_y=torch.from_numpy(arrays["test_y"].astype(np.int64)),
            )
    where = ", ".join(str(f) for f in folders)
    raise ConfigError(
        f"Fashion-MNIST not found in {where}: install it with "
        "'sudo apt-get install dataset-fashion-mnist' or pass --data-dir with the IDX files "
        "(or use --workload digits)"
    )


def _check_split(arrays: dict[str, np.ndarray], paths: dict[str, Path | None]) -> None:
    """ConfigError naming the file whose shape is not Fashion-MNIST's (a labels file under an
    images name would fail deep inside the first forward pass)."""
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if images.ndim != 3 or images.shape[1:] != (28, 28):
            raise ConfigError(f"{paths[f'{split}_x']} holds an array of shape {images.shape}, "
                              "not 28x28 images")
        if labels.ndim != 1 or len(labels) != len(images):
            raise ConfigError(f"{paths[f'{split}_y']} holds an array of shape {labels.shape}, "
                              f"not the {len(images)} labels of its images")


def _images(raw: np.ndarray) -> torch.Tensor:
    # In place: every worker loads the dataset at start-up, and temporaries of 188 MB made
    # this a quarter of an 8-worker run's start-up on 2 cores.
    x = torch.from_numpy(raw).float().div_(255.0).sub_(_FASHION_MEAN).div_(_FASHION_STD)
    return x.unsqueeze(1)


def load_digits(data_dir: Path | None = None) -> DataSplit:
    """scikit-learn's 8x8 digits (1797 images) as (N, 1, 8, 8); 300 held out, fixed split."""
    images, target = _digits()
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    test, train = order[:300], order[300:]
    return DataSplit(train_x=x[train], train_y=y[train], test_x=x[test], test_y=y[test])


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits' (N, 8, 8) images and labels, read from the file scikit-learn ships them in
    (`sklearn/datasets/data/digits.csv.gz`: 64 pixels, then the label, per row), found without
    importing scikit-learn: its import costs about 3 s of CPU, in every worker of a run, more
    than a short run's training. Through scikit-learn's own loader where the file is not
    there (another layout)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("hetsync: the digits workload needs scikit-learn, which ships the "
                          "data: pip install scikit-learn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return bunch.images, bunch.target
    rows = np.loadtxt(path, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1]
