"""``datarecon identifiability``: each objective's residual for the training set and its fakes; the exact replay of
the recorded training fits the training set perfectly; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datarecon.cli.main import main


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("ident") / "model"
    train_target(TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=6),
                             arch=ArchConfig(name="mlp", hidden=(50,), bias=False, init_scale=1e-3), loss="logistic",
                             lr=0.5, epochs=300, dtype="float64"), out=out, progress=False)
    return out


def test_every_objective_is_measured_for_the_truth_and_three_fakes(model, tmp_path, capsys):
    out = tmp_path / "ident.json"
    assert main(["identifiability", str(model), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert set(res["objectives"]) == {"kkt", "kkt-init", "loo", "path", "dynamics"}
    for name, v in res["objectives"].items():
        assert set(v["sets"]) == {"training set", "held-out images", "means of two training images",
                                  "partition images"}, name
        top = 2.0 if name == "dynamics" else 1.0 + 1e-9  # 1 − cos lies in [0, 2]
        assert all(0 <= s["relative_residual"] <= top for s in v["sets"].values()), name
    # the recorded training replayed on the training set ends exactly at θ*: residual 0, every fake above it
    dyn = res["objectives"]["dynamics"]
    assert dyn["sets"]["training set"]["relative_residual"] < 1e-9 and dyn["identifies"]
    assert "identifies the training set" in text
    assert set(res["objectives"]["kkt"]["sets"]["training set"]["per_layer"]) == {"1.weight", "3.weight"}


def test_bad_input_is_one_line(model, tmp_path, capsys):
    (tmp_path / "taken.json").write_text("mine")
    for args, message in ((["--objectives", "foo"], "objectives"), (["--path-points", "1"], "path_points"),
                          (["--out", str(tmp_path / "taken.json")], "exists")):
        assert main(["identifiability", str(model), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert (tmp_path / "taken.json").read_text() == "mine"
