"""File-format readers on the real data and on small hand-built files."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from datarecon.data import formats, load_dataset
from datarecon.data.formats import (
    RawDataset,
    read_cifar_bin,
    read_cifar_pickle,
    read_idx_images,
    read_idx_labels,
    restricted_unpickle,
)
from datarecon.errors import DataReconError

# sha256 of the first image's pixel bytes (C, H, W order) of the official files.
FIRST_IMAGE_SHA256 = {
    ("cifar10", "train"): "e052de7deb775f78e5e3b718032db5e72434ae6f0d34152c7ad434521631b17c",
    ("cifar10", "test"): "73eefb0106f2b7a2660668be6875682f6aa9c20820633725642b0cc87dc59198",
    ("mnist", "train"): "23ceaef5eb61f0e70d64ac18fdf0f60df3d5971cf30bbadac7b6ebf07f782d2c",
    ("mnist", "test"): "8f6a418c9a639f9e14e96feca47a97df2a35a0a68ae2875431c5c80e05536941",
}


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


# --------------------------------------------------------------------- CIFAR-10 binary

def test_cifar_subset_counts(data_dir):
    train = load_dataset("cifar10", split="train", data_dir=data_dir)
    test = load_dataset("cifar10", split="test", data_dir=data_dir)
    assert (len(train), len(test)) == (8068, 1017)
    assert train.images.shape == (8068, 3, 32, 32) and train.images.dtype == np.uint8
    assert train.labels.dtype == np.int64
    assert set(np.unique(train.labels)) == set(range(10))
    assert train.class_names == formats.CIFAR10_CLASSES
    assert (train.name, train.split, test.split) == ("cifar10", "train", "test")


def test_cifar_batch1_class_counts_match_readme(data_dir):
    _, labels = read_cifar_bin(data_dir / "cifar-10-batches-bin" / "data_batch_1.bin")
    assert len(labels) == 4000
    assert np.bincount(labels).tolist() == [396, 366, 420, 384, 422, 393, 414, 385, 407, 413]


@pytest.mark.parametrize("split", ["train", "test"])
def test_cifar_first_image_pinned(data_dir, split):
    raw = load_dataset("cifar10", split=split, data_dir=data_dir)
    assert _sha(raw.images[0]) == FIRST_IMAGE_SHA256[("cifar10", split)]
    fname = "data_batch_1.bin" if split == "train" else "test_batch.bin"
    with open(data_dir / "cifar-10-batches-bin" / fname, "rb") as fh:
        record = fh.read(3073)  # independent reading: label byte, then R, G, B planes
    assert raw.labels[0] == record[0]
    assert hashlib.sha256(record[1:]).hexdigest() == FIRST_IMAGE_SHA256[("cifar10", split)]
    # the official first labels: frog (train), cat (test)
    assert raw.class_names[raw.labels[0]] == ("frog" if split == "train" else "cat")


def test_cifar_truncated_file_refused(tmp_path, data_dir):
    src = (data_dir / "cifar-10-batches-bin" / "data_batch_2.bin").read_bytes()
    bad = tmp_path / "data_batch_2.bin"
    bad.write_bytes(src[:-3072])
    with pytest.raises(DataReconError) as err:
        read_cifar_bin(bad)
    assert str(err.value) == (
        f"{bad} is truncated or corrupt: 3122169 bytes is not a whole number of "
        "3073-byte CIFAR-10 records; re-download it"
    )


def test_cifar_truncated_file_refused_by_loader(tmp_path, data_dir):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for f in (data_dir / "cifar-10-batches-bin").iterdir():
        os.symlink(f, folder / f.name)
    (folder / "data_batch_3.bin").unlink()
    (folder / "data_batch_3.bin").write_bytes(b"\x00" * (3073 * 2 + 1))
    with pytest.raises(DataReconError,
                       match=r"data_batch_3.bin is truncated or corrupt.*re-download"):
        load_dataset("cifar10", split="train", data_dir=tmp_path)


def test_cifar_any_whole_number_of_records(tmp_path):
    rng = np.random.default_rng(0)
    recs = rng.integers(0, 256, size=(3, 3073), dtype=np.uint8)
    recs[:, 0] = [2, 0, 9]
    f = tmp_path / "x.bin"
    f.write_bytes(recs.tobytes())
    images, labels = read_cifar_bin(f)
    assert labels.tolist() == [2, 0, 9]
    assert images.shape == (3, 3, 32, 32)
    # planes: red = bytes 1..1024 row-major, then green, then blue
    assert np.array_equal(images[1, 1].ravel(), recs[1, 1025:2049])


# --------------------------------------------------------------------- CIFAR-10 python

def _py2_style_batch(n: int, seed: int, protocol: int) -> tuple[bytes, np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    obj = {b"batch_label": b"training batch 1 of 5", b"labels": labels, b"data": data,
           b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
    return pickle.dumps(obj, protocol=protocol), data, labels


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_pickle_batch_roundtrip(tmp_path, protocol):
    blob, data, labels = _py2_style_batch(4, seed=protocol, protocol=protocol)
    f = tmp_path / "data_batch_1"
    f.write_bytes(blob)
    images, got = read_cifar_pickle(f)
    assert got.tolist() == labels and got.dtype == np.int64
    assert np.array_equal(images.reshape(4, -1), data)


def test_cifar_pickle_layout_loads(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    expected = []
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        blob, data, labels = _py2_style_batch(2 + i, seed=i, protocol=2)
        (folder / name).write_bytes(blob)
        expected.append((data, labels))
    meta = {"label_names": list(formats.CIFAR10_CLASSES), "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    train = load_dataset("cifar10", split="train", data_dir=tmp_path)
    test = load_dataset("cifar10", split="test", data_dir=tmp_path)
    assert len(train) == 2 + 3 + 4 + 5 + 6 and len(test) == 7
    assert train.labels.tolist() == sum((lab for _, lab in expected[:5]), [])
    assert np.array_equal(test.images.reshape(7, -1), expected[5][0])
    assert train.class_names == formats.CIFAR10_CLASSES


def _binstring(b: bytes) -> bytes:
    return b"T" + struct.pack("<i", len(b)) + b


def _py2_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled the way the official (Python 2, numpy 1.x) files are.

    Strings are BINSTRING opcodes and the array refers to ``numpy.core.multiarray``.
    """
    n = data.shape[0]
    dtype = (b"cnumpy\ndtype\n" + _binstring(b"u1") + b"K\x00K\x01\x87R"
             + b"(K\x03" + _binstring(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    arr = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + b"K\x00\x85"
           + _binstring(b"b") + b"\x87R" + b"(K\x01"
           + b"M" + struct.pack("<H", n) + b"M" + struct.pack("<H", 3072) + b"\x86"
           + dtype + b"\x89" + _binstring(data.tobytes()) + b"tb")
    labs = b"](" + b"".join(b"K" + bytes([v]) for v in labels) + b"e"
    return (b"\x80\x02}(" + _binstring(b"data") + arr + _binstring(b"labels") + labs
            + _binstring(b"batch_label") + _binstring(b"training batch 1 of 5") + b"u.")


def test_cifar_pickle_python2_official_style(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, size=(3, 3072), dtype=np.uint8)
    f = tmp_path / "data_batch_1"
    f.write_bytes(_py2_pickle(data, [3, 7, 0]))
    images, labels = read_cifar_pickle(f)
    assert labels.tolist() == [3, 7, 0]
    assert np.array_equal(images.reshape(3, -1), data)
    assert images.shape == (3, 3, 32, 32)


class _Evil:
    marker = Path("/nonexistent")

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvilEval:
    def __reduce__(self):
        return (eval, ("1+1",))


@pytest.mark.parametrize("payload", [_Evil(), _EvilEval(), {"data": _Evil()}],
                         ids=["os.system", "builtins.eval", "nested"])
def test_malicious_pickle_refused(tmp_path, monkeypatch, payload):
    monkeypatch.setattr(_Evil, "marker", tmp_path / "pwned")
    f = tmp_path / "data_batch_1"
    f.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(DataReconError,
                       match=r"refusing to load (posix|os|__builtin__)\.(system|eval) "
                             r"from a pickle"):
        read_cifar_pickle(f)
    assert not (tmp_path / "pwned").exists()


def test_garbage_pickle_is_one_line_error():
    with pytest.raises(DataReconError, match="is not a readable pickle"):
        restricted_unpickle(b"\x80\x02not a pickle", source="blob")


def test_pickle_without_data_key(tmp_path):
    f = tmp_path / "data_batch_1"
    f.write_bytes(pickle.dumps({"labels": [1]}, protocol=2))
    with pytest.raises(DataReconError, match="is not a CIFAR-10 python batch"):
        read_cifar_pickle(f)


# --------------------------------------------------------------------- MNIST

@pytest.mark.parametrize("split,n,first_label", [("train", 60000, 5), ("test", 10000, 7)])
def test_mnist_shapes_and_first_image(data_dir, split, n, first_label):
    raw = load_dataset("mnist", split=split, data_dir=data_dir)
    assert raw.images.shape == (n, 1, 28, 28) and raw.images.dtype == np.uint8
    assert raw.labels.shape == (n,) and set(np.unique(raw.labels)) == set(range(10))
    assert raw.labels[0] == first_label
    assert _sha(raw.images[0]) == FIRST_IMAGE_SHA256[("mnist", split)]


def _idx_images(n=2, rows=3, cols=4, magic=2051, extra=b"") -> bytes:
    return struct.pack(">IIII", magic, n, rows, cols) + bytes(range(n * rows * cols)) + extra


def test_idx_plain_and_gzip(tmp_path):
    plain = tmp_path / "imgs"
    plain.write_bytes(_idx_images())
    gz = tmp_path / "imgs.gz"
    gz.write_bytes(gzip.compress(_idx_images()))
    a, b = read_idx_images(plain), read_idx_images(gz)
    assert a.shape == (2, 1, 3, 4) and np.array_equal(a, b)
    assert a[1, 0, 0, 0] == 12
    lab = tmp_path / "labels"
    lab.write_bytes(struct.pack(">II", 2049, 3) + bytes([1, 2, 9]))
    assert read_idx_labels(lab).tolist() == [1, 2, 9]


def test_mnist_bad_magic_pinned(tmp_path):
    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(_idx_images(magic=2049))
    with pytest.raises(DataReconError) as err:
        read_idx_images(f)
    assert str(err.value) == (
        f"{f} has magic number 2049, expected 2051 (IDX images); "
        "is it the right file? re-download it"
    )
    lab = tmp_path / "labels"
    lab.write_bytes(struct.pack(">II", 2051, 1) + b"\x01")
    with pytest.raises(DataReconError, match="has magic number 2051, expected 2049"):
        read_idx_labels(lab)


def test_mnist_size_mismatch(tmp_path):
    f = tmp_path / "imgs.gz"
    f.write_bytes(gzip.compress(_idx_images()[:-5]))
    with pytest.raises(DataReconError) as err:
        read_idx_images(f)
    assert str(err.value) == (
        f"{f} holds 35 bytes but its header (2 x 3 x 4) needs 40; "
        "the file is truncated or corrupt, re-download it"
    )
    lab = tmp_path / "labels"
    lab.write_bytes(struct.pack(">II", 2049, 3) + b"\x01")
    with pytest.raises(DataReconError, match=r"header \(3 labels\) needs 11"):
        read_idx_labels(lab)


def test_mnist_damaged_gzip(tmp_path):
    f = tmp_path / "imgs.gz"
    f.write_bytes(gzip.compress(_idx_images())[:-10])
    with pytest.raises(DataReconError, match="damaged gzip file"):
        read_idx_images(f)


# --------------------------------------------------------------------- digits

def test_digits_split_and_scale():
    from sklearn.datasets import load_digits

    train = load_dataset("digits", split="train")
    test = load_dataset("digits", split="test")
    assert (len(train), len(test)) == (formats.DIGITS_TRAIN_SIZE, 1797 - formats.DIGITS_TRAIN_SIZE)
    assert train.images.shape == (1500, 1, 8, 8) and train.images.dtype == np.float32
    assert float(train.images.min()) == 0.0 and float(train.images.max()) == 1.0
    ref = load_digits()
    assert np.allclose(test.images[0, 0] * 16, ref.images[1500])
    assert test.labels[0] == ref.target[1500]


# --------------------------------------------------------------------- RawDataset

def test_raw_dataset_read_only_and_float(data_dir):
    raw = load_dataset("mnist", split="test", data_dir=data_dir)
    with pytest.raises(ValueError):
        raw.images[0, 0, 0, 0] = 1
    x = raw.float_images(np.array([0, 2]))
    assert x.dtype == torch.float32 and x.shape == (2, 1, 28, 28)
    assert torch.equal(x[1], torch.from_numpy(raw.images[2].astype(np.float32)) / 255)
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0


def test_raw_dataset_checks_shapes():
    with pytest.raises(ValueError, match="labels shape"):
        RawDataset(np.zeros((2, 1, 2, 2), np.uint8), np.zeros(3, np.int64), ("a",), "x")
