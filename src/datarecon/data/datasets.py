"""Where datasets live and how to load them by name.

The data folder is resolved by :func:`resolve_data_dir` (explicit argument,
else ``$DATARECON_DATA``, else the user cache folder). Under it each dataset
has its published layout::

    <data_dir>/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin [+ batches.meta.txt]
    <data_dir>/cifar-10-batches-py/{data_batch_1..5,test_batch} [+ batches.meta]
    <data_dir>/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]

``digits`` ships with scikit-learn and needs no files. Datasets are entries of
the :data:`DATASETS` registry; :func:`load_dataset` returns a
:class:`~datarecon.data.formats.RawDataset` and keeps a small in-process cache
keyed by the files' paths, sizes and modification times.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from datarecon.data import formats
from datarecon.data.formats import RawDataset
from datarecon.errors import DataMissingError, DataReconError
from datarecon.registry import Registry

ENV_VAR = "DATARECON_DATA"
SPLITS = ("train", "test")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$DATARECON_DATA``, else the user cache.

    The folder need not exist; loaders raise :class:`DataMissingError` naming it.
    The user cache is ``platformdirs.user_cache_dir("datarecon")`` (e.g.
    ``~/.cache/datarecon`` on Linux).
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("datarecon"))


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset known to datarecon.

    Attributes:
        name: registry key.
        title: human name for messages.
        input_shape: (C, H, W) of one image.
        class_names: the ten class names, index = label.
        locate: ``(root, split) -> files`` returning the files a split reads;
            raises :class:`DataMissingError` saying what to put where.
        read: ``(files, split) -> RawDataset`` (pure; no lookup).
        count: ``(files, split) -> int`` the number of images, cheaply.
        needs_files: False for datasets bundled with a dependency.
    """

    name: str
    title: str
    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
    locate: Callable[[Path, str], tuple[Path, ...]]
    read: Callable[[tuple[Path, ...], str], RawDataset]
    count: Callable[[tuple[Path, ...], str], int]
    needs_files: bool = True


DATASETS: Registry[DatasetInfo] = Registry("dataset")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DataReconError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def _describe_data_dir(root: Path) -> str:
    """The data folder as messages name it, with what is wrong with it (a file, nothing there)."""
    if root.is_dir():
        return f"{root}"
    return f"{root}" + (" (which is a file, not a folder)" if root.exists() else " (which does not exist)")


# ---------------------------------------------------------------------------
# CIFAR-10

_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = ("test_batch",)


def _cifar_locate(root: Path, split: str) -> tuple[Path, ...]:
    names = _CIFAR_TRAIN if split == "train" else _CIFAR_TEST
    layouts = (
        (root / "cifar-10-batches-bin", tuple(f"{n}.bin" for n in names), "batches.meta.txt"),
        (root / "cifar-10-batches-py", names, "batches.meta"),
    )
    for folder, fnames, meta in layouts:  # the first complete layout wins
        files = tuple(folder / n for n in fnames)
        if all(f.is_file() for f in files):
            return files + ((folder / meta,) if (folder / meta).is_file() else ())
    for folder, fnames, _ in layouts:  # a present but incomplete layout
        if folder.is_dir():
            missing = [n for n in fnames if not (folder / n).is_file()]
            raise DataMissingError(
                f"CIFAR-10 incomplete: {', '.join(missing)} missing from {folder}; copy them "
                "there or run `datarecon data download cifar10`"
            )
    raise DataMissingError(
        "CIFAR-10 not found: put cifar-10-batches-bin/ (data_batch_1.bin ... data_batch_5.bin, "
        f"test_batch.bin) or cifar-10-batches-py/ under {_describe_data_dir(root)}, set {ENV_VAR}, "
        "or run `datarecon data download cifar10`"
    )


def _cifar_read(files: tuple[Path, ...], split: str) -> RawDataset:
    batches = [f for f in files if not f.name.startswith("batches.meta")]
    metas = [f for f in files if f.name.startswith("batches.meta")]
    binary = batches[0].suffix == ".bin"
    if metas:  # the class order is fixed; a different meta file means different data
        read_meta = formats.read_cifar_meta_txt if binary else formats.read_cifar_pickle_meta
        names = read_meta(metas[0])
        if names != formats.CIFAR10_CLASSES:
            raise DataReconError(
                f"{metas[0]} lists classes {', '.join(names)}, not CIFAR-10's "
                f"{', '.join(formats.CIFAR10_CLASSES)}; re-download it"
            )
    load = formats.load_cifar_bin if binary else formats.load_cifar_pickle
    return load(batches, class_names=formats.CIFAR10_CLASSES, split=split)


def _cifar_count(files: tuple[Path, ...], split: str) -> int:
    """Images of a split, from a full read: every check :func:`_cifar_read` makes (sizes, label
    bytes, the class names of the meta file) applies, so a damaged file is reported, not counted."""
    return len(_cifar_read(files, split))


DATASETS.register("cifar10", DatasetInfo(
    name="cifar10", title="CIFAR-10", input_shape=(3, 32, 32),
    class_names=formats.CIFAR10_CLASSES,
    locate=_cifar_locate, read=_cifar_read, count=_cifar_count,
))


# ---------------------------------------------------------------------------
# MNIST

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _mnist_locate(root: Path, split: str) -> tuple[Path, ...]:
    folder = root / "mnist"
    found, missing = [], []
    for stem in MNIST_FILES[split]:
        for cand in (folder / f"{stem}.gz", folder / stem):
            if cand.is_file():
                found.append(cand)
                break
        else:
            missing.append(f"{stem}.gz")
    if missing:
        all_names = ", ".join(f"{s}.gz" for pair in MNIST_FILES.values() for s in pair)
        if not folder.is_dir():
            raise DataMissingError(
                f"MNIST not found: put mnist/ ({all_names}; gzip or unpacked) under "
                f"{_describe_data_dir(root)}, set {ENV_VAR}, or run `datarecon data download mnist`"
            )
        raise DataMissingError(
            f"MNIST incomplete: {', '.join(missing)} missing from {folder} (gzip or unpacked); "
            "copy them there or run `datarecon data download mnist`"
        )
    return tuple(found)


def _mnist_read(files: tuple[Path, ...], split: str) -> RawDataset:
    return formats.load_mnist_idx(files[0], files[1], split=split)


def _mnist_count(files: tuple[Path, ...], split: str) -> int:
    """Images of a split: the image file's header and size (streamed, not kept) and a full read of the
    small label file (magic numbers, labels in 0..9, as many as images)."""
    images = formats.read_idx_count(files[0], magic=formats.MNIST_IMAGES_MAGIC)
    labels = formats.read_idx_labels(files[1])
    if images != len(labels):
        raise DataReconError(f"{files[0]} has {images} images but {files[1]} has {len(labels)} labels; "
                             "re-download both")
    if len(labels) and labels.max() > 9:
        raise DataReconError(f"{files[1]} has labels outside 0..9; re-download it")
    return images


DATASETS.register("mnist", DatasetInfo(
    name="mnist", title="MNIST", input_shape=(1, 28, 28), class_names=formats.MNIST_CLASSES,
    locate=_mnist_locate, read=_mnist_read, count=_mnist_count,
))


# ---------------------------------------------------------------------------
# scikit-learn digits (bundled)


def _digits_count(files: tuple[Path, ...], split: str) -> int:
    return formats.DIGITS_TRAIN_SIZE if split == "train" else 1797 - formats.DIGITS_TRAIN_SIZE


DATASETS.register("digits", DatasetInfo(
    name="digits", title="scikit-learn digits", input_shape=(1, 8, 8),
    class_names=formats.DIGITS_CLASSES,
    locate=lambda root, split: (),
    read=lambda files, split: formats.load_digits_split(split),
    count=_digits_count, needs_files=False,
))


# ---------------------------------------------------------------------------

_CACHE: OrderedDict[tuple, RawDataset] = OrderedDict()
_CACHE_SIZE = 4


def _signature(files: tuple[Path, ...]) -> tuple:
    sig = []
    for f in files:
        st = f.stat()
        sig.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(sig)


def locate_dataset(name: str, *, split: str = "train",
                   data_dir: str | os.PathLike | None = None) -> tuple[Path, ...]:
    """The files :func:`load_dataset` would read (empty for bundled datasets).

    Raises:
        DataReconError: unknown dataset or split.
        DataMissingError: files missing; the message says what to put where.
    """
    info = DATASETS.get(name)
    _check_split(split)
    return info.locate(resolve_data_dir(data_dir), split)


def load_dataset(name: str, *, split: str = "train",
                 data_dir: str | os.PathLike | None = None) -> RawDataset:
    """Load one split of a registered dataset.

    Args:
        name: a :data:`DATASETS` name ("cifar10", "mnist", "digits").
        split: "train" or "test".
        data_dir: data folder; see :func:`resolve_data_dir`.

    Returns:
        A read-only :class:`RawDataset` (cached in-process by file path, size and mtime).

    Raises:
        DataReconError: unknown dataset/split, or a corrupt file.
        DataMissingError: the files are not there.
    """
    info = DATASETS.get(name)
    _check_split(split)
    files = info.locate(resolve_data_dir(data_dir), split)
    key = (name, split, _signature(files))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    raw = info.read(files, split)
    _CACHE[key] = raw
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return raw


def clear_cache() -> None:
    """Forget cached datasets."""
    _CACHE.clear()


def dataset_counts(name: str, *, data_dir: str | os.PathLike | None = None) -> dict[str, int]:
    """``{"train": n, "test": m}`` from headers, with each file's size checked against its header
    (a gzip file is streamed once through the decompressor; nothing is kept in memory).

    Raises:
        DataMissingError: the files are not there.
        DataReconError: a file is truncated, padded or damaged.
    """
    info = DATASETS.get(name)
    root = resolve_data_dir(data_dir)
    return {split: info.count(info.locate(root, split), split) for split in SPLITS}
