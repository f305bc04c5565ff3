"""Readers for the datasets' own published file formats (pure functions).

Each reader takes file paths and returns a :class:`RawDataset`; none of them
looks anywhere else, downloads anything or caches anything (that is
:mod:`datarecon.data.datasets`' job).

Formats:

* CIFAR-10 *binary version* (``cifar-10-batches-bin/*.bin``): records of
  3073 bytes, 1 label byte then 3072 pixel bytes (1024 red, 1024 green,
  1024 blue, each row-major 32x32). A file may hold any whole number of
  records; a size that is not a multiple of 3073 is refused as truncated.
* CIFAR-10 *python version* (``cifar-10-batches-py/data_batch_*``): pickled
  dicts ``{"data": uint8 (N, 3072), "labels": [int] * N, ...}``. They are read
  with a restricted unpickler (:func:`restricted_unpickle`) that only builds
  dicts, lists, bytes and numpy arrays and refuses every other global, so a
  tampered file cannot run code.
* MNIST IDX (``train-images-idx3-ubyte[.gz]`` ...): big-endian header, magic
  2051 (images: count, rows, cols) or 2049 (labels: count), then uint8 data;
  gzip-compressed or plain.
* scikit-learn's bundled ``digits`` (1797 images 8x8, values 0..16).
"""

from __future__ import annotations

import codecs
import gzip
import io
import math
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:  # numpy >= 2 keeps the pickle helpers in numpy._core ...
    from numpy._core import multiarray as np_multiarray
    from numpy._core import numeric as np_numeric
except ImportError:  # ... numpy 1.x in numpy.core (pickles name either module)
    from numpy.core import multiarray as np_multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as np_numeric  # type: ignore[no-redef]

from datarecon.errors import DataReconError

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
MNIST_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
DIGITS_CLASSES: tuple[str, ...] = MNIST_CLASSES

CIFAR_RECORD_BYTES = 1 + 3 * 32 * 32
MNIST_IMAGES_MAGIC = 2051
MNIST_LABELS_MAGIC = 2049

#: scikit-learn digits has no official split: the first ``DIGITS_TRAIN_SIZE``
#: images (in the bundled order) are "train", the remaining 297 are "test".
DIGITS_TRAIN_SIZE = 1500


@dataclass(frozen=True, eq=False)
class RawDataset:
    """One split of a dataset exactly as stored.

    Attributes:
        images: (N, C, H, W) numpy array, either uint8 in [0, 255] or float32
            in [0, 1] (already scaled, e.g. digits). Read-only.
        labels: (N,) int64 numpy array of class indices into ``class_names``.
        class_names: the dataset's class names, index = label.
        name: dataset name ("cifar10", "mnist", "digits").
        split: "train" or "test".
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    name: str
    split: str = "train"

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {self.images.shape}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"labels shape {self.labels.shape} does not match {self.images.shape[0]} images"
            )
        if self.images.dtype not in (np.uint8, np.float32):
            raise ValueError(f"images must be uint8 or float32, got {self.images.dtype}")
        for arr in (self.images, self.labels):
            arr.setflags(write=False)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(int(s) for s in self.images.shape[1:])  # type: ignore[return-value]

    def float_images(self, indices: np.ndarray | torch.Tensor | None = None) -> torch.Tensor:
        """Images (all, or those at ``indices``) as float32 (n, C, H, W) in [0, 1]."""
        imgs = self.images if indices is None else self.images[np.asarray(indices, dtype=np.int64)]
        t = torch.from_numpy(np.array(imgs, copy=True))
        if t.dtype == torch.uint8:
            return t.to(torch.float32).div_(255.0)
        return t.to(torch.float32)


# ---------------------------------------------------------------------------
# CIFAR-10 binary version


def read_cifar_bin(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch file.

    Args:
        path: a ``*.bin`` file of whole 3073-byte records.

    Returns:
        ``(images, labels)``: uint8 (N, 3, 32, 32) and int64 (N,).

    Raises:
        DataReconError: the size is not a multiple of 3073 (truncated file) or a
            label byte is not in 0..9.
    """
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) % CIFAR_RECORD_BYTES != 0 or not raw:
        raise DataReconError(
            f"{path} is truncated or corrupt: {len(raw)} bytes is not a whole number of "
            f"{CIFAR_RECORD_BYTES}-byte CIFAR-10 records; re-download it"
        )
    recs = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR_RECORD_BYTES)
    labels = recs[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DataReconError(
            f"{path} has label bytes > 9, so it is not a CIFAR-10 binary batch; re-download it"
        )
    images = recs[:, 1:].reshape(-1, 3, 32, 32).copy()
    return images, labels


def read_cifar_meta_txt(path: str | Path) -> tuple[str, ...]:
    """Class names from ``batches.meta.txt`` (one per line, blank lines ignored)."""
    names = tuple(line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines())
    names = tuple(n for n in names if n)
    if len(names) != 10:
        raise DataReconError(
            f"{path} should list 10 class names, found {len(names)}; re-download it"
        )
    return names


def load_cifar_bin(files: list[Path], *, class_names: tuple[str, ...] = CIFAR10_CLASSES,
                   split: str = "train") -> RawDataset:
    """Concatenate CIFAR-10 binary batch files (in the given order) into a RawDataset."""
    parts = [read_cifar_bin(f) for f in files]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return RawDataset(images, labels, class_names, "cifar10", split)


# ---------------------------------------------------------------------------
# CIFAR-10 python (pickle) version


def _safe_globals() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = np_multiarray._reconstruct
        allowed[(mod, "scalar")] = np_multiarray.scalar
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(mod, "_frombuffer")] = np_numeric._frombuffer
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    allowed[("_codecs", "encode")] = codecs.encode  # bytes in protocol-2 pickles
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can only rebuild dicts, lists, str/bytes and numpy arrays.

    Any other global (``os.system``, ``builtins.eval``, ...) is refused with
    :class:`~datarecon.errors.DataReconError`, so loading a tampered file cannot
    execute code.
    """

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        obj = _safe_globals().get((module, name))
        if obj is None:
            raise DataReconError(
                f"refusing to load {module}.{name} from a pickle: only dicts, lists, bytes and "
                "numpy arrays are allowed; this is not a genuine CIFAR-10 file, re-download it"
            )
        return obj


def restricted_unpickle(data: bytes, *, source: str = "pickle") -> Any:
    """Unpickle ``data`` with :class:`RestrictedUnpickler`.

    Python-2 pickles (the official CIFAR-10 files) are decoded with
    ``encoding="latin1"`` so numpy arrays come back intact and dict keys as str.

    Raises:
        DataReconError: a forbidden global, or the bytes are not a valid pickle.
    """
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except DataReconError:
        raise
    except Exception as exc:  # malformed pickle streams raise many types
        raise DataReconError(f"{source} is not a readable pickle ({exc}); re-download it") from None


def _item_str_or_bytes(d: dict, name: str) -> Any:
    """``d[name]``, or ``d[name.encode()]`` in a batch pickled by Python 2 (bytes keys)."""
    if name in d:
        return d[name]
    if name.encode() in d:
        return d[name.encode()]
    raise KeyError(name)


def read_cifar_pickle(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python-version batch (``data_batch_1`` ... ``test_batch``).

    Returns:
        ``(images, labels)``: uint8 (N, 3, 32, 32) and int64 (N,).

    Raises:
        DataReconError: unsafe or malformed pickle, missing keys, wrong shapes.
    """
    path = Path(path)
    obj = restricted_unpickle(path.read_bytes(), source=str(path))
    try:
        if not isinstance(obj, dict):
            raise KeyError("data")
        data = np.asarray(_item_str_or_bytes(obj, "data"))
        labels = np.asarray(_item_str_or_bytes(obj, "labels"), dtype=np.int64)
    except (KeyError, TypeError, ValueError):
        raise DataReconError(
            f"{path} is not a CIFAR-10 python batch (needs a dict with 'data' and 'labels'); "
            "re-download it"
        ) from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 \
            or labels.shape != (data.shape[0],):
        raise DataReconError(
            f"{path} has data {data.dtype} {data.shape} and {labels.shape[0]} labels, expected "
            "uint8 (N, 3072) and N labels; re-download it"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataReconError(f"{path} has labels outside 0..9; re-download it")
    return data.reshape(-1, 3, 32, 32).copy(), labels


def read_cifar_pickle_meta(path: str | Path) -> tuple[str, ...]:
    """Class names from the python-version ``batches.meta`` (key ``label_names``)."""
    path = Path(path)
    obj = restricted_unpickle(path.read_bytes(), source=str(path))
    try:
        names = tuple(n.decode() if isinstance(n, bytes) else str(n)
                      for n in _item_str_or_bytes(obj, "label_names"))
    except (KeyError, TypeError):
        raise DataReconError(f"{path} has no 'label_names'; re-download it") from None
    if len(names) != 10:
        raise DataReconError(
            f"{path} should list 10 class names, found {len(names)}; re-download it"
        )
    return names


def load_cifar_pickle(files: list[Path], *, class_names: tuple[str, ...] = CIFAR10_CLASSES,
                      split: str = "train") -> RawDataset:
    """Concatenate CIFAR-10 python-version batches (in the given order) into a RawDataset."""
    parts = [read_cifar_pickle(f) for f in files]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return RawDataset(images, labels, class_names, "cifar10", split)


# ---------------------------------------------------------------------------
# MNIST IDX


def _read_maybe_gz(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataReconError(f"{path} is a damaged gzip file ({exc}); re-download it") from None
    return raw


def read_idx_images(path: str | Path) -> np.ndarray:
    """Read an IDX3 image file (magic 2051), gzip or plain.

    Returns:
        uint8 (N, 1, rows, cols).

    Raises:
        DataReconError: wrong magic number, or the byte count does not match the header.
    """
    path = Path(path)
    raw = _read_maybe_gz(path)
    if len(raw) < 16:
        raise DataReconError(f"{path} is too short for an IDX image header; re-download it")
    magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != MNIST_IMAGES_MAGIC:
        raise DataReconError(
            f"{path} has magic number {magic}, expected {MNIST_IMAGES_MAGIC} (IDX images); "
            "is it the right file? re-download it"
        )
    expected = 16 + n * rows * cols
    if len(raw) != expected:
        raise DataReconError(
            f"{path} holds {len(raw)} bytes but its header ({n} x {rows} x {cols}) needs "
            f"{expected}; the file is truncated or corrupt, re-download it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 1, rows, cols).copy()


def read_idx_labels(path: str | Path) -> np.ndarray:
    """Read an IDX1 label file (magic 2049), gzip or plain.

    Returns:
        int64 (N,).

    Raises:
        DataReconError: wrong magic number, or the byte count does not match the header.
    """
    path = Path(path)
    raw = _read_maybe_gz(path)
    if len(raw) < 8:
        raise DataReconError(f"{path} is too short for an IDX label header; re-download it")
    magic, n = struct.unpack(">II", raw[:8])
    if magic != MNIST_LABELS_MAGIC:
        raise DataReconError(
            f"{path} has magic number {magic}, expected {MNIST_LABELS_MAGIC} (IDX labels); "
            "is it the right file? re-download it"
        )
    if len(raw) != 8 + n:
        raise DataReconError(
            f"{path} holds {len(raw)} bytes but its header ({n} labels) needs {8 + n}; "
            "the file is truncated or corrupt, re-download it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)


def read_idx_count(path: str | Path, *, magic: int | None = None) -> int:
    """The item count of an IDX file, with its size checked against the header (gzip or plain).

    Reads the header, then the file's size (plain) or streams it once through the decompressor
    (gzip), without keeping the data: a truncated or padded file is reported, not counted.

    Args:
        path: the IDX file.
        magic: the magic number the file must carry (e.g. :data:`MNIST_IMAGES_MAGIC`), or None.

    Raises:
        DataReconError: short header, wrong magic number, damaged gzip stream, or a size that does
            not match the header.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(2)
    gz = head == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:  # type: ignore[operator]
            header = fh.read(4)
            if len(header) < 4:
                raise DataReconError(f"{path} is too short for an IDX header; re-download it")
            ndim = header[3]
            dims_raw = fh.read(4 * ndim)
            if ndim < 1 or len(dims_raw) < 4 * ndim:
                raise DataReconError(f"{path} is too short for an IDX header; re-download it")
            dims = struct.unpack(f">{ndim}I", dims_raw)
            found = struct.unpack(">I", header)[0]
            if magic is not None and found != magic:
                raise DataReconError(f"{path} has magic number {found}, expected {magic}; is it the right file? "
                                     "re-download it")
            if gz:
                size = 4 + 4 * ndim
                while chunk := fh.read(1 << 20):
                    size += len(chunk)
            else:
                size = path.stat().st_size
    except (OSError, EOFError) as exc:
        raise DataReconError(f"{path} is a damaged gzip file ({exc}); re-download it") from None
    expected = 4 + 4 * ndim + math.prod(dims)
    if size != expected:
        raise DataReconError(f"{path} holds {size} bytes but its header ({' x '.join(map(str, dims))}) needs "
                             f"{expected}; the file is truncated or corrupt, re-download it")
    return int(dims[0])


def load_mnist_idx(images_path: Path, labels_path: Path, *, split: str = "train") -> RawDataset:
    """Read an MNIST images/labels IDX pair into a RawDataset (uint8 (N, 1, 28, 28))."""
    images = read_idx_images(images_path)
    labels = read_idx_labels(labels_path)
    if images.shape[0] != labels.shape[0]:
        raise DataReconError(
            f"{images_path} has {images.shape[0]} images but {labels_path} has "
            f"{labels.shape[0]} labels; re-download both"
        )
    if labels.size and labels.max() > 9:
        raise DataReconError(f"{labels_path} has labels outside 0..9; re-download it")
    return RawDataset(images, labels, MNIST_CLASSES, "mnist", split)


# ---------------------------------------------------------------------------
# scikit-learn digits


def load_digits_split(split: str = "train") -> RawDataset:
    """scikit-learn's bundled digits, scaled to float32 [0, 1] (value / 16), (N, 1, 8, 8).

    The dataset has no official split; datarecon defines "train" as the first
    ``DIGITS_TRAIN_SIZE`` (= 1500) images in the bundled order and "test" as the
    remaining 297.
    """
    from sklearn.datasets import load_digits  # lazy: scikit-learn is slow to import; only digits needs it

    bunch = load_digits()
    images = (np.asarray(bunch.images, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    sl = slice(0, DIGITS_TRAIN_SIZE) if split == "train" else slice(DIGITS_TRAIN_SIZE, None)
    return RawDataset(np.ascontiguousarray(images[sl]), labels[sl].copy(), DIGITS_CLASSES,
                      "digits", split)
