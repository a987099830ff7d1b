from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from hetsync.errors import ConfigError
from hetsync.workloads import available_workloads, get_workload
from hetsync.workloads.datasets import _digits, load_fashion_mnist, read_idx


def _write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_fashion(tmp_path):
    rng = np.random.default_rng(0)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (20, 28, 28)))
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(20) % 10)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (10, 28, 28)))
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(10))
    return tmp_path


def test_idx_round_trip(tiny_fashion):
    labels = read_idx(tiny_fashion / "train-labels-idx1-ubyte.gz")
    assert labels.tolist() == [i % 10 for i in range(20)]


def test_fashion_mnist_from_data_dir(tiny_fashion):
    split = load_fashion_mnist(tiny_fashion)
    assert split.train_x.shape == (20, 1, 28, 28) and split.test_x.shape == (10, 1, 28, 28)
    assert split.train_y.dtype == torch.int64


def test_svm_labels_are_signs(tiny_fashion):
    split = get_workload("svm").load(tiny_fashion)
    assert set(split.train_y.tolist()) == {-1, 1}
    assert split.train_x.shape == (20, 784)


def test_missing_dataset_names_the_install_command(tmp_path):
    with pytest.raises(ConfigError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)


def test_truncated_idx_is_reported(tmp_path):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(bytes([0, 0, 8, 1]) + (100).to_bytes(4, "big") + b"\x00" * 10)
    with pytest.raises(ConfigError, match="truncated"):
        read_idx(path)


def test_digits_workload_trains_one_step():
    workload = get_workload("digits")
    split = workload.load(None)
    assert len(split.train_y) == 1497 and len(split.test_y) == 300
    model = workload.build_model()
    loss = workload.loss(model(split.train_x[:16]), split.train_y[:16])
    loss.backward()
    assert torch.isfinite(loss)


def test_digits_are_scikit_learns_read_without_importing_it():
    sklearn = pytest.importorskip("sklearn.datasets")
    images, target = _digits()
    bunch = sklearn.load_digits()
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)


@pytest.mark.parametrize("name", ["cnn", "svm", "resnet", "resnet-wide", "digits"])
def test_models_accept_their_inputs(name):
    workload = get_workload(name)
    shape = {"cnn": (2, 1, 28, 28), "svm": (2, 784), "resnet": (2, 1, 32, 32),
             "resnet-wide": (2, 1, 32, 32), "digits": (2, 1, 8, 8)}[name]
    out = workload.build_model()(torch.zeros(shape))
    assert out.shape[0] == 2


def test_unknown_workload_lists_known():
    with pytest.raises(ConfigError, match="unknown workload 'mnist'.*cnn"):
        get_workload("mnist")
    assert {"cnn", "svm", "resnet", "digits"} <= set(available_workloads())


def test_a_damaged_gzip_is_one_line_naming_the_file(tiny_fashion):
    images = tiny_fashion / "train-images-idx3-ubyte.gz"
    whole = images.read_bytes()
    for damaged in (bytes(range(256)) * 8, whole[: len(whole) // 2]):  # not gzip; cut short
        images.write_bytes(damaged)
        with pytest.raises(ConfigError, match=f"cannot read {images}") as error:
            load_fashion_mnist(tiny_fashion)
        assert "\n" not in str(error.value)


def test_a_file_of_the_wrong_shape_is_named(tiny_fashion):
    labels = tiny_fashion / "train-labels-idx1-ubyte.gz"
    (tiny_fashion / "train-images-idx3-ubyte.gz").write_bytes(labels.read_bytes())
    with pytest.raises(ConfigError, match="train-images-idx3-ubyte.gz holds an array of shape "
                                          r"\(20,\), not 28x28 images"):
        load_fashion_mnist(tiny_fashion)
    _write_idx(labels, np.arange(7))
    _write_idx(tiny_fashion / "train-images-idx3-ubyte.gz", np.zeros((20, 28, 28)))
    with pytest.raises(ConfigError, match="not the 20 labels of its images"):
        load_fashion_mnist(tiny_fashion)
