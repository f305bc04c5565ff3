"""Download logic with a fake opener: checksums, atomic placement, no-network errors."""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest

import datarecon.data.download as dl
from datarecon.data import download_dataset as download_fn
from datarecon.data import load_dataset, md5_file, verify_md5
from datarecon.data.download import RemoteFile, fetch
from datarecon.errors import DataMissingError, DataReconError


def _md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


class FakeWeb:
    """opener(url, timeout=...) serving bytes from a dict; unknown URLs fail like no network."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.calls: list[str] = []

    def __call__(self, url, timeout=None):
        self.calls.append(url)
        if url not in self.files:
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return io.BytesIO(self.files[url])


def test_md5_and_verify(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"hello")
    assert md5_file(f) == "5d41402abc4b2a76b9719d911017c592"
    verify_md5(f, "5D41402ABC4B2A76B9719D911017C592")
    with pytest.raises(DataReconError) as err:
        verify_md5(f, "0" * 32)
    assert str(err.value) == (
        f"checksum mismatch for a.bin: md5 5d41402abc4b2a76b9719d911017c592, expected {'0' * 32}; "
        "the download is corrupt, delete it and retry"
    )


def test_fetch_tries_mirrors_and_verifies(tmp_path):
    good = b"payload"
    remote = RemoteFile("f.gz", ("http://a/f.gz", "http://b/f.gz", "http://c/f.gz"), _md5(good))
    web = FakeWeb({"http://b/f.gz": b"tampered", "http://c/f.gz": good})
    dest = tmp_path / "sub" / "f.gz"
    assert fetch(remote, dest, opener=web) == dest
    assert dest.read_bytes() == good
    assert web.calls == ["http://a/f.gz", "http://b/f.gz", "http://c/f.gz"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["f.gz"]  # no temp files left


def test_fetch_checksum_mismatch_leaves_nothing(tmp_path):
    remote = RemoteFile("f.gz", ("http://a/f.gz",), _md5(b"right"))
    dest = tmp_path / "f.gz"
    with pytest.raises(DataReconError, match="checksum mismatch for .*f.gz"):
        fetch(remote, dest, opener=FakeWeb({"http://a/f.gz": b"wrong"}))
    assert list(tmp_path.iterdir()) == []


def test_no_network_mnist(tmp_path, monkeypatch):
    web = FakeWeb({})
    monkeypatch.setattr(dl, "_urlopen", web)  # the default opener
    with pytest.raises(DataMissingError) as err:
        download_fn("mnist", data_dir=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("could not download train-images-idx3-ubyte.gz (https://ossci-datasets")
    assert "Temporary failure in name resolution" in msg
    assert msg.endswith(
        f"without network, fetch it yourself and put it in {tmp_path / 'mnist'} (MNIST needs "
        "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
        f"t10k-labels-idx1-ubyte.gz in {tmp_path / 'mnist'})"
    )
    assert len(web.calls) == 2  # both mirrors tried
    assert [p.name for p in (tmp_path / "mnist").iterdir()] == []


def test_no_network_cifar(tmp_path):
    with pytest.raises(DataMissingError) as err:
        download_fn("cifar10", data_dir=tmp_path, opener=FakeWeb({}))
    msg = str(err.value)
    assert msg.startswith("could not download cifar-10-python.tar.gz "
                          "(https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz: ")
    assert msg.endswith(f"then extract it so that cifar-10-batches-py/ (data_batch_1 ... "
                        f"data_batch_5, test_batch, batches.meta) lies under {tmp_path}")
    assert list(tmp_path.iterdir()) == []


def test_mnist_download_places_files(tmp_path, data_dir, monkeypatch):
    served = {}
    for remote in dl.MNIST_REMOTE:
        served[remote.urls[1]] = (data_dir / "mnist" / remote.filename).read_bytes()
    web = FakeWeb(served)  # first mirror "down", second serves the real files
    download_fn("mnist", data_dir=tmp_path, opener=web)
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted(
        r.filename for r in dl.MNIST_REMOTE)
    assert len(load_dataset("mnist", split="test", data_dir=tmp_path)) == 10000
    web.calls.clear()
    download_fn("mnist", data_dir=tmp_path, opener=web)  # already there: no requests
    assert web.calls == []


def _fake_cifar_tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for i, name in enumerate(names):
            data = np.full((2, 3072), i, dtype=np.uint8)
            blob = pickle.dumps({b"data": data, b"labels": [i, 9 - i]}, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


def test_cifar_download_extracts_atomically(tmp_path, monkeypatch):
    blob = _fake_cifar_tarball()
    url = "https://example.invalid/cifar-10-python.tar.gz"
    monkeypatch.setattr(dl, "CIFAR10_PY", RemoteFile("cifar-10-python.tar.gz", (url,), _md5(blob)))
    out = download_fn("cifar10", data_dir=tmp_path, opener=FakeWeb({url: blob}))
    assert out == tmp_path / "cifar-10-batches-py"
    assert [p.name for p in tmp_path.iterdir()] == ["cifar-10-batches-py"]  # temp dirs cleaned
    train = load_dataset("cifar10", split="train", data_dir=tmp_path)
    assert len(train) == 10 and train.labels.tolist()[:4] == [0, 9, 1, 8]


def test_cifar_download_refuses_path_traversal(tmp_path, monkeypatch):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    blob = buf.getvalue()
    url = "https://example.invalid/c.tar.gz"
    monkeypatch.setattr(dl, "CIFAR10_PY", RemoteFile("cifar-10-python.tar.gz", (url,), _md5(blob)))
    root = tmp_path / "data"
    with pytest.raises(DataReconError, match="corrupt or unsafe to extract"):
        download_fn("cifar10", data_dir=root, opener=FakeWeb({url: blob}))
    assert not (tmp_path / "escaped.txt").exists()
    assert list(root.iterdir()) == []


def test_download_digits_and_unknown(tmp_path):
    assert download_fn("digits", data_dir=tmp_path, opener=FakeWeb({})) == tmp_path
    with pytest.raises(DataReconError,
                       match="unknown dataset 'svhn'; valid names: cifar10, digits, mnist"):
        download_fn("svhn", data_dir=tmp_path)


def test_download_skips_present_dataset(data_dir):
    web = FakeWeb({})
    assert download_fn("cifar10", data_dir=data_dir, opener=web) == Path(data_dir)
    assert web.calls == []


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("members", [
    [_member("/tmp/abs.txt")],
    [_member("cifar-10-batches-py/../../up.txt")],
    [_member("cifar-10-batches-py/link", tarfile.SYMTYPE, "/etc/passwd")],
    [_member("cifar-10-batches-py/hard", tarfile.LNKTYPE, "/etc/passwd")],
    [_member("cifar-10-batches-py/dev", tarfile.CHRTYPE)],
    [_member("cifar-10-batches-py/fifo", tarfile.FIFOTYPE)],
    [_member("cifar-10-batches-py/ok.txt"), _member("cifar-10-batches-py/dir", tarfile.SYMTYPE, ".."),
     _member("cifar-10-batches-py/dir/escaped.txt")],
], ids=["absolute", "dotdot", "symlink", "hardlink", "device", "fifo", "through-symlink"])
def test_malicious_archives_are_refused_before_anything_is_written(tmp_path, monkeypatch, members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in members:
            data = b"x" if info.isfile() else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    blob = buf.getvalue()
    url = "https://example.invalid/c.tar.gz"
    monkeypatch.setattr(dl, "CIFAR10_PY", RemoteFile("cifar-10-python.tar.gz", (url,), _md5(blob)))
    root = tmp_path / "data"
    with pytest.raises(DataReconError, match="corrupt or unsafe to extract"):
        download_fn("cifar10", data_dir=root, opener=FakeWeb({url: blob}))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["data"]
