"""`datarecon data info` / `datarecon data download` through a local Typer app."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

import datarecon.data.download as dl
from datarecon.cli.data import register
from datarecon.errors import DataMissingError, DataReconError


@pytest.fixture()
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _main() -> None:
        """test app"""

    return app


def test_info_lists_found_datasets(app, data_dir):
    res = CliRunner().invoke(app, ["data", "info", "--data-dir", str(data_dir)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == f"data folder: {data_dir}"
    assert lines[1].split() == ["cifar10", "found", "train", "8068", "test", "1017", "images",
                                "3x32x32"]
    assert lines[2].split()[:6] == ["digits", "bundled", "train", "1500", "test", "297"]
    assert lines[3].split()[:6] == ["mnist", "found", "train", "60000", "test", "10000"]


def test_info_reports_missing(app, tmp_path):
    res = CliRunner().invoke(app, ["data", "info", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "cifar10  missing  (CIFAR-10 not found: put cifar-10-batches-bin/" in res.output
    assert "mnist    missing  (MNIST not found" in res.output


def test_download_errors_are_datarecon_errors(app, tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise OSError("network unreachable")

    monkeypatch.setattr(dl, "_urlopen", offline)
    res = CliRunner().invoke(app, ["data", "download", "mnist", "--data-dir", str(tmp_path)])
    assert isinstance(res.exception, DataMissingError)
    assert "network unreachable" in str(res.exception)
    res = CliRunner().invoke(app, ["data", "download", "svhn", "--data-dir", str(tmp_path)])
    assert isinstance(res.exception, DataReconError)
    assert "valid names: cifar10, digits, mnist" in str(res.exception)


def test_download_digits_is_noop(app, tmp_path):
    res = CliRunner().invoke(app, ["data", "download", "digits", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "nothing to download" in res.output


@pytest.mark.parametrize("packed", [True, False], ids=["gzip", "plain"])
def test_info_reports_a_truncated_mnist_file(app, data_dir, tmp_path, packed):
    import gzip
    import shutil

    mnist = tmp_path / "mnist"
    shutil.copytree(data_dir / "mnist", mnist)
    name = "t10k-images-idx3-ubyte"
    raw = gzip.decompress((mnist / f"{name}.gz").read_bytes())[:-784]  # one image short
    (mnist / f"{name}.gz").unlink()
    if packed:
        (mnist / f"{name}.gz").write_bytes(gzip.compress(raw))
    else:
        (mnist / name).write_bytes(raw)
    res = CliRunner().invoke(app, ["data", "info", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.split()[0] == "mnist")
    assert line.split()[1] == "damaged" and "the file is truncated or corrupt, re-download it" in line, line


def _copy(data_dir, tmp_path, name):
    import shutil

    shutil.copytree(data_dir / name, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("damage", ["cifar-label-byte", "mnist-label-value", "mnist-images-magic", "cifar-meta"])
def test_info_reports_damaged_content_as_damaged(app, data_dir, tmp_path, damage):
    """Issue 25 item 21: files of the right size but damaged content were listed as found."""
    import gzip

    if damage.startswith("cifar"):
        folder = _copy(data_dir, tmp_path, "cifar-10-batches-bin")
        if damage == "cifar-label-byte":
            raw = bytearray((folder / "test_batch.bin").read_bytes())
            raw[3073 * 5] = 200  # the label byte of the sixth record
            (folder / "test_batch.bin").write_bytes(bytes(raw))
        else:
            (folder / "batches.meta.txt").write_text("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n")
        want = "cifar10  damaged"
    else:
        folder = _copy(data_dir, tmp_path, "mnist")
        name = "t10k-labels-idx1-ubyte.gz" if damage == "mnist-label-value" else "train-images-idx3-ubyte.gz"
        raw = bytearray(gzip.decompress((folder / name).read_bytes()))
        if damage == "mnist-label-value":
            raw[100] = 42
        else:
            raw[2] = 9  # magic 2307 (signed bytes), the same size: not MNIST's IDX image file (2051)
        (folder / name).write_bytes(gzip.compress(bytes(raw)))
        want = "mnist    damaged"
    res = CliRunner().invoke(app, ["data", "info", "--data-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert want in res.output and "re-download it" in res.output, res.output
