"""Long reproduction pieces report progress as plain lines in a log (stderr not a terminal)."""

from __future__ import annotations

from datarecon.experiments.pipeline.common import TargetTraining, train_piece
from datarecon.experiments.pipeline.pieces import Context
from datarecon.training.target import ArchConfig

DATA = {"dataset": "digits", "task": "odd-even", "n_per_class": 5, "selection": "first",
        "normalisation": "unit-minus-mean", "n_partition_per_class": 0, "n_heldout_per_class": 2}


def _train(tmp_path, capsys, *, progress: bool) -> str:
    piece = train_piece("models/t", TargetTraining(arch=ArchConfig(name="mlp", hidden=(4,), bias=False),
                                                   epochs=30, lr=0.1), DATA)
    ctx = Context(out=tmp_path, progress=progress)
    piece.run(ctx, ctx.dir(piece.key))
    return capsys.readouterr().err


def test_train_piece_writes_plain_progress_lines_when_asked(tmp_path, capsys) -> None:
    err = _train(tmp_path / "a", capsys, progress=True)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and "\r" not in err
    assert any("done epoch 30/30" in ln for ln in lines), err


def test_no_progress_means_silence(tmp_path, capsys) -> None:
    assert _train(tmp_path / "b", capsys, progress=False) == ""
