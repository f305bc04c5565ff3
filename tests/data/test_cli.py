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
