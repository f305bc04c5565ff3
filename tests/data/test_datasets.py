"""Data-folder resolution, missing-data messages and the dataset registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.data import DATASETS, dataset_counts, load_dataset, locate_dataset, resolve_data_dir
from datarecon.data import datasets as ds
from datarecon.errors import DataMissingError, DataReconError


def test_resolve_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("DATARECON_DATA", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir(str(tmp_path / "arg")) == tmp_path / "arg"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("DATARECON_DATA")
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda app: str(tmp_path / "cache" / app))
    assert resolve_data_dir() == tmp_path / "cache" / "datarecon"


def test_registry_names():
    assert DATASETS.names() == ["cifar10", "digits", "mnist"]
    assert DATASETS.get("cifar10").input_shape == (3, 32, 32)
    assert DATASETS.get("mnist").input_shape == (1, 28, 28)
    assert DATASETS.get("digits").input_shape == (1, 8, 8)


def test_unknown_dataset_lists_names():
    with pytest.raises(DataReconError) as err:
        load_dataset("imagenet")
    assert str(err.value) == "unknown dataset 'imagenet'; valid names: cifar10, digits, mnist"


def test_unknown_split():
    with pytest.raises(DataReconError, match="unknown split 'val'; valid splits: train, test"):
        load_dataset("digits", split="val")


def test_missing_cifar_dir_pinned(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataMissingError) as err:
        load_dataset("cifar10", data_dir=missing)
    assert str(err.value) == (
        "CIFAR-10 not found: put cifar-10-batches-bin/ (data_batch_1.bin ... data_batch_5.bin, "
        f"test_batch.bin) or cifar-10-batches-py/ under {missing} (which does not exist), "
        "set DATARECON_DATA, or run `datarecon data download cifar10`"
    )


def test_missing_mnist_dir_pinned(tmp_path):
    with pytest.raises(DataMissingError) as err:
        load_dataset("mnist", split="test", data_dir=tmp_path)
    assert str(err.value) == (
        "MNIST not found: put mnist/ (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; gzip or unpacked) under "
        f"{tmp_path}, set DATARECON_DATA, or run `datarecon data download mnist`"
    )


def test_incomplete_folders_name_missing_files(tmp_path, data_dir):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").symlink_to(
        data_dir / "mnist" / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataMissingError) as err:
        load_dataset("mnist", split="test", data_dir=tmp_path)
    assert str(err.value) == (
        f"MNIST incomplete: t10k-labels-idx1-ubyte.gz missing from {tmp_path / 'mnist'} "
        "(gzip or unpacked); copy them there or run `datarecon data download mnist`"
    )
    (tmp_path / "cifar-10-batches-bin").mkdir()
    (tmp_path / "cifar-10-batches-bin" / "test_batch.bin").symlink_to(
        data_dir / "cifar-10-batches-bin" / "test_batch.bin")
    assert len(load_dataset("cifar10", split="test", data_dir=tmp_path)) == 1017
    with pytest.raises(DataMissingError, match=r"CIFAR-10 incomplete: data_batch_1.bin, "
                       r"data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, data_batch_5.bin "
                       r"missing from .*cifar-10-batches-bin"):
        load_dataset("cifar10", split="train", data_dir=tmp_path)


def test_env_var_used(monkeypatch, data_dir):
    monkeypatch.setenv("DATARECON_DATA", str(data_dir))
    files = locate_dataset("mnist", split="train")
    assert [f.name for f in files] == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]


def test_unpacked_mnist_accepted(tmp_path, data_dir):
    import gzip

    (tmp_path / "mnist").mkdir()
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        raw = gzip.decompress((data_dir / "mnist" / f"{stem}.gz").read_bytes())
        (tmp_path / "mnist" / stem).write_bytes(raw)
    a = load_dataset("mnist", split="test", data_dir=tmp_path)
    b = load_dataset("mnist", split="test", data_dir=data_dir)
    assert (a.images == b.images).all() and (a.labels == b.labels).all()


def test_counts_and_cache(data_dir):
    assert dataset_counts("cifar10", data_dir=data_dir) == {"train": 8068, "test": 1017}
    assert dataset_counts("mnist", data_dir=data_dir) == {"train": 60000, "test": 10000}
    assert dataset_counts("digits") == {"train": 1500, "test": 297}
    a = load_dataset("cifar10", split="test", data_dir=data_dir)
    assert load_dataset("cifar10", split="test", data_dir=Path(str(data_dir))) is a
    ds.clear_cache()
    assert load_dataset("cifar10", split="test", data_dir=data_dir) is not a


def test_cifar_meta_with_other_classes_refused(tmp_path, data_dir):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    (folder / "test_batch.bin").symlink_to(data_dir / "cifar-10-batches-bin" / "test_batch.bin")
    names = (data_dir / "cifar-10-batches-bin" / "batches.meta.txt").read_text().split()
    (folder / "batches.meta.txt").write_text("\n".join(reversed(names)) + "\n")
    with pytest.raises(DataReconError, match=r"batches.meta.txt lists classes truck, ship, .* "
                                             r"not CIFAR-10's airplane, automobile, .*re-download"):
        load_dataset("cifar10", split="test", data_dir=tmp_path)
