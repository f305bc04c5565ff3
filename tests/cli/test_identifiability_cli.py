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


def test_fakes_that_repeat_images_are_named_and_progress_is_shown(tmp_path, capsys):
    """Two held-out images for twelve training images: the held-out fake cycles them, and the output says so;
    progress goes to stderr one objective at a time (plain lines in a log)."""
    out = tmp_path / "few"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "6", "--n-heldout-per-class",
                 "1", "--hidden", "20", "--no-bias", "--epochs", "20", "--no-progress", "--quiet", "--out",
                 str(out)]) == 0
    capsys.readouterr()
    assert main(["identifiability", str(out), "--objectives", "kkt,kkt-init", "--out", str(tmp_path / "i.json")]) == 0
    captured = capsys.readouterr()
    assert ("note: held-out images: only 2 distinct images for the 12 training images, so each is used up to 6 times"
            in captured.out)
    assert "partition images:" not in captured.out  # enough partition images: no note
    assert "identifiability: done objective 2/2" in captured.err
    assert json.loads((tmp_path / "i.json").read_text())["notes"][0].startswith("held-out images: only 2 distinct")


def test_evaluate_says_how_many_objectives_identify_the_training_set():
    from datarecon.cli.evaluate import identifiability_lead

    result = {"objectives": {"kkt": {"sets": {}, "identifies": True}, "kkt-init": {"sets": {}, "identifies": False},
                             "loo": {"sets": {}, "identifies": True}, "path": {"note": "not measured: no θ_init"}}}
    assert identifiability_lead(result) == ("identifiability: the training set fits 2 of the 3 objectives measured "
                                            "better than every fake (kkt, loo); details: datarecon identifiability "
                                            "MODEL")


def test_train_records_the_ascent_curve_whose_gaps_are_the_diagnostic_of_the_model_at_those_steps(tmp_path, capsys):
    """``datarecon train`` with margin ascent to convergence: the curve's gap at its end equals ``datarecon
    identifiability`` of the model written, and its gap at 2 windows equals the diagnostic of a model ascended for
    exactly those steps (the curve measures the model in training, the diagnostic a model directory); ``info``
    shows the curve."""
    common = ["--dataset", "digits", "--task", "odd-even", "--n-per-class", "6", "--hidden", "30", "--no-bias",
              "--init-scale", "1e-3", "--lr", "0.5", "--epochs", "200", "--dtype", "float64", "--no-progress",
              "--quiet"]
    conv, short = tmp_path / "conv", tmp_path / "short"
    assert main(["train", *common, "--margin-ascent-steps", "400", "--margin-ascent-rtol", "0.001",
                 "--margin-ascent-window", "10", "--out", str(conv)]) == 0
    assert main(["train", *common, "--margin-ascent-steps", "20", "--out", str(short)]) == 0
    capsys.readouterr()
    meta = json.loads((conv / "model.json").read_text())["metrics"]
    curve = meta["margin_ascent_curve"]
    assert meta["margin_ascent_stop_reason"].startswith("converged") and curve[-1]["step"] == meta["margin_ascent_steps"]
    probed = [p["step"] for p in curve if "kkt_gap" in p]
    assert probed[:4] == [0, 10, 20, 40] and probed[-1] == curve[-1]["step"] and len(curve) > len(probed)
    for model, point in ((conv, curve[-1]), (short, next(p for p in curve if p["step"] == 20))):
        found = tmp_path / f"{model.name}.json"
        assert main(["identifiability", str(model), "--objectives", "kkt", "--out", str(found)]) == 0
        kkt = json.loads(found.read_text())["objectives"]["kkt"]
        assert point["kkt_gap"] == pytest.approx(kkt["gap"], rel=1e-9, abs=1e-12)
        assert point["kkt_truth"] == pytest.approx(kkt["sets"]["training set"]["relative_residual"], rel=1e-9)
    capsys.readouterr()
    assert main(["info", str(conv)]) == 0
    card = capsys.readouterr().out
    assert "ascent curve (step: normalised margin, KKT weights-only residual truth / best fake, gap" in card
    assert f"gap {curve[-1]['kkt_gap']:+.3f}" in card
