"""Issue 25 item 17: a model records a fingerprint of its training, partition and held-out images;
resuming its training or evaluating a run against other data than those is refused with one line.

The other data are the real MNIST files with inverted images (255 - x): same names, sizes and
labels, so nothing but the fingerprint tells them apart."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from datarecon.cli.main import main

TRAIN = ["train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "3", "--n-heldout-per-class", "3",
         "--hidden", "8", "--no-bias", "--epochs", "40", "--checkpoint-every", "10", "--no-progress"]
#: a training long enough to be killed part way (after its checkpoint at epoch 20)
LONG = [a if a != "40" else "3000" for a in TRAIN]


def _kill_training_at(data_dir: Path, out: Path, *, epoch: int) -> None:
    """Run ``LONG`` into ``out`` and SIGKILL it once its checkpoint reaches ``epoch``."""
    import os
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "datarecon.cli.main", *LONG, "--data-dir", str(data_dir),
                             "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() - t0 < 300
        try:
            if json.loads((out / "checkpoint" / "progress.json").read_text()).get("steps_done", 0) >= epoch:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)


@pytest.fixture(scope="module")
def inverted(data_dir: Path, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inverted")
    (root / "mnist").mkdir()
    for f in (data_dir / "mnist").iterdir():
        if "images" in f.name:
            raw = bytearray(gzip.decompress(f.read_bytes()))
            raw[16:] = bytes(255 - b for b in raw[16:])
            (root / "mnist" / f.name).write_bytes(gzip.compress(bytes(raw), compresslevel=1))
        else:
            shutil.copy(f, root / "mnist" / f.name)
    return root


def test_model_records_the_fingerprint_and_refuses_other_data(data_dir: Path, inverted: Path, tmp_path: Path,
                                                              capsys) -> None:
    model = tmp_path / "model"
    assert main([*TRAIN, "--data-dir", str(data_dir), "--out", str(model)]) == 0
    prints = json.loads((model / "model.json").read_text())["data_fingerprint"]
    assert set(prints) == {"train", "partition", "heldout"}
    run = tmp_path / "run"
    assert main(["reconstruct", "--model", str(model), "--steps", "5", "--no-progress", "--out", str(run)]) == 0
    assert main(["evaluate", str(run), "--no-progress", "--data-dir", str(inverted)]) == 2
    err = capsys.readouterr().err
    assert "error: the train images found for mnist differ from those" in err and "point --data-dir" in err, err
    assert not (run / "metrics.json").exists()
    assert main(["reconstruct", "--model", str(model), "--init", "ground-truth", "--steps", "2", "--no-progress",
                 "--data-dir", str(inverted), "--out", str(tmp_path / "gt")]) == 2
    assert "differ from those" in capsys.readouterr().err and not (tmp_path / "gt").exists()
    assert main(["evaluate", str(run), "--no-progress", "--data-dir", str(data_dir)]) == 0


def test_resuming_a_training_with_other_data_is_refused(data_dir: Path, inverted: Path, tmp_path: Path,
                                                        capsys) -> None:
    model = tmp_path / "model"
    _kill_training_at(data_dir, model, epoch=20)
    before = {p.name: p.read_bytes() for p in (model / "checkpoint").iterdir() if p.is_file()}
    assert main([*LONG, "--data-dir", str(inverted), "--out", str(model), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "the training data found now differ from those the checkpoint" in err and "--data-dir" in err, err
    assert {p.name: p.read_bytes() for p in (model / "checkpoint").iterdir() if p.is_file()} == before
    assert main([*LONG, "--data-dir", str(data_dir), "--out", str(model), "--resume"]) == 0
