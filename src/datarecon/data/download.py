"""Optional download of datasets from their canonical sources, md5-verified.

* ``cifar10``: the official python-version tarball
  (https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz), extracted to
  ``<data_dir>/cifar-10-batches-py/``.
* ``mnist``: the four official gzip IDX files into ``<data_dir>/mnist/``,
  from a mirror (the original yann.lecun.com host refuses most downloads).
* ``digits``: ships with scikit-learn; nothing to download.

Each file is streamed into a temporary file next to its destination, its md5
compared with the published value, and only then renamed into place (and a
tarball extracted into a temporary folder that is renamed into place), so an
interrupted or corrupt download never leaves a half-written dataset.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from datarecon.data.datasets import DATASETS, MNIST_FILES, resolve_data_dir
from datarecon.errors import DataMissingError, DataReconError
from datarecon.utils.atomic import current_umask


@dataclass(frozen=True)
class RemoteFile:
    """A published file: its name, where to get it (tried in order) and its md5."""

    filename: str
    urls: tuple[str, ...]
    md5: str


CIFAR10_PY = RemoteFile(
    "cifar-10-python.tar.gz",
    ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    "c58f30108f718f92721af3b95e74349a",
)

MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_REMOTE = tuple(
    RemoteFile(f"{stem}.gz", tuple(m + f"{stem}.gz" for m in MNIST_MIRRORS),
               _MNIST_MD5[f"{stem}.gz"])
    for pair in MNIST_FILES.values() for stem in pair
)

_CHUNK = 1 << 20
_urlopen = urllib.request.urlopen  # replaced in tests; called as opener(url, timeout=...)


def md5_file(path: str | os.PathLike) -> str:
    """Hex md5 of a file's contents."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_md5(path: str | os.PathLike, expected: str) -> None:
    """Check a file's md5.

    Raises:
        DataReconError: the md5 differs (one line naming the file, both sums and the fix).
    """
    got = md5_file(path)
    if got != expected.lower():
        raise DataReconError(
            f"checksum mismatch for {Path(path).name}: md5 {got}, expected {expected}; "
            "the download is corrupt, delete it and retry"
        )


def fetch(remote: RemoteFile, dest: Path, *, opener: Callable | None = None,
          timeout: float = 60.0, progress: Callable[[str], None] | None = None) -> Path:
    """Download ``remote`` to ``dest`` atomically after verifying its md5.

    Mirrors are tried in order; a network failure or a checksum mismatch moves
    on to the next one.

    Raises:
        DataReconError: every mirror served a file with the wrong checksum.
        DataMissingError: no mirror could be reached (e.g. no network).
    """
    opener = opener or _urlopen
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    mismatch: DataReconError | None = None
    for url in remote.urls:
        if progress:
            progress(f"downloading {url}")
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~current_umask())  # shared data folder: mode as open() would give
        try:
            try:
                with os.fdopen(fd, "wb") as out, opener(url, timeout=timeout) as resp:
                    for chunk in iter(lambda: resp.read(_CHUNK), b""):
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            # URLError, HTTPError and timeouts are OSErrors; ValueError: malformed URL
            except (OSError, ValueError, http.client.HTTPException) as exc:
                errors.append(f"{url}: {getattr(exc, 'reason', exc)}")
                continue
            try:
                verify_md5(tmp, remote.md5)
            except DataReconError as exc:
                mismatch = exc
                continue
            os.replace(tmp, dest)
            return dest
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if mismatch is not None:
        raise mismatch
    raise DataMissingError(
        f"could not download {remote.filename} ({'; '.join(errors)}); "
        f"without network, fetch it yourself and put it in {dest.parent}"
    )


def _download_cifar10(root: Path, opener, timeout, progress) -> Path:
    target = root / "cifar-10-batches-py"
    if target.exists():
        raise DataReconError(
            f"{target} exists but is incomplete; delete it and run "
            "`datarecon data download cifar10` again"
        )
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".cifar10-download-") as tmpdir:
        tar_path = Path(tmpdir) / CIFAR10_PY.filename
        try:
            fetch(CIFAR10_PY, tar_path, opener=opener, timeout=timeout, progress=progress)
        except DataMissingError as exc:
            raise DataMissingError(
                f"{exc}: then extract it so that cifar-10-batches-py/ (data_batch_1 ... "
                f"data_batch_5, test_batch, batches.meta) lies under {root}"
            ) from None
        if progress:
            progress(f"extracting {CIFAR10_PY.filename}")
        extract = Path(tmpdir) / "extract"
        try:
            with tarfile.open(tar_path, "r:gz") as tar:
                _safe_extract(tar, extract)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataReconError(
                f"{CIFAR10_PY.filename} is corrupt or unsafe to extract ({exc}); re-download it"
            ) from None
        src = extract / "cifar-10-batches-py"
        if not src.is_dir():
            raise DataReconError(
                f"{CIFAR10_PY.filename} has no cifar-10-batches-py/; re-download it"
            )
        os.replace(src, target)
    return target


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract regular files and folders only, all inside ``dest``.

    Members that are links, devices, absolute paths or paths leaving ``dest`` are refused
    (``tarfile.TarError``) before anything is written. Python's ``filter="data"`` does the same
    but exists only from 3.11.4 on, so the check is done here for every supported Python.
    """
    dest = dest.resolve()
    members = tar.getmembers()
    for member in members:
        if not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"member {member.name!r} is not a regular file or folder")
        path = (dest / member.name).resolve()
        if member.name.startswith(("/", "\\")) or not path.is_relative_to(dest):
            raise tarfile.TarError(f"member {member.name!r} would be written outside the folder")
    dest.mkdir(parents=True, exist_ok=True)
    for member in members:
        path = dest / member.name
        if member.isdir():
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(member)
        if source is None:
            raise tarfile.TarError(f"member {member.name!r} has no data")
        with source, open(path, "wb") as fh:
            fh.write(source.read())


def _download_mnist(root: Path, opener, timeout, progress) -> Path:
    folder = root / "mnist"
    for remote in MNIST_REMOTE:
        dest = folder / remote.filename
        if dest.is_file() and md5_file(dest) == remote.md5:
            continue
        try:
            fetch(remote, dest, opener=opener, timeout=timeout, progress=progress)
        except DataMissingError as exc:
            names = ", ".join(r.filename for r in MNIST_REMOTE)
            raise DataMissingError(f"{exc} (MNIST needs {names} in {folder})") from None
    return folder


def download(name: str, *, data_dir: str | os.PathLike | None = None,
             opener: Callable | None = None, timeout: float = 60.0,
             progress: Callable[[str], None] | None = None) -> Path:
    """Download dataset ``name`` into the data folder unless it is already there.

    Args:
        name: "cifar10", "mnist" or "digits" (bundled, nothing to do).
        data_dir: see :func:`~datarecon.data.datasets.resolve_data_dir`.
        opener: ``opener(url, timeout=...)`` returning a readable context manager
            (default ``urllib.request.urlopen``); tests pass a fake.
        timeout: seconds per connection.
        progress: called with one-line status messages.

    Returns:
        The folder holding the dataset.

    Raises:
        DataReconError: unknown dataset, checksum mismatch, or a half-present folder.
        DataMissingError: the download failed (no network); the message names the
            files and the folder to put them in.
    """
    info = DATASETS.get(name)
    root = resolve_data_dir(data_dir)
    if not info.needs_files:
        if progress:
            progress(f"{name} ships with its library; nothing to download")
        return root
    try:  # already complete?
        for split in ("train", "test"):
            info.locate(root, split)
        if progress:
            progress(f"{name} already present under {root}")
        return root
    except DataMissingError:
        pass
    if name == "cifar10":
        return _download_cifar10(root, opener, timeout, progress)
    if name == "mnist":
        return _download_mnist(root, opener, timeout, progress)
    raise DataReconError(f"no download source for {name!r}; put its files under {root}")


__all__ = ["CIFAR10_PY", "MNIST_REMOTE", "RemoteFile", "download", "fetch", "md5_file",
           "verify_md5"]
