"""``datarecon membership`` and the attacker-knowledge options: results, and bad input that writes nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from datarecon.cli.main import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A digits MLP trained from a small initialisation (model.json records its init hash)."""
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("membership") / "model"
    cfg = TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=10, n_heldout_per_class=60),
                      arch=ArchConfig(name="mlp", hidden=(200,), bias=False), loss="logistic", lr=0.5,
                      epochs=300, dtype="float64")
    train_target(cfg, out=out, progress=False)
    return out


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_evaluate_with_a_known_initialisation_separates_members(trained, capsys, tmp_path):
    """A standard-initialised MLP: W alone hides the training span, W − W_init reveals it."""
    out = tmp_path / "m"
    assert main(["membership", "--model", str(trained), "--evaluate", "--known-init", "seed", "--references", "0",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "initialisation θ_init (seed:0)" in text
    subspace = next(line for line in text.splitlines() if line.strip().startswith("subspace"))
    assert "AUC 1.000" in subspace and "TPR 1.000 at 1.0% FPR" in subspace
    assert "loss threshold (baseline): loss: AUC" in text and "strongest: " in text
    result = json.loads((out / "membership.json").read_text())
    assert result["subspace"]["matrix"] == "W - a*W_init" and result["subspace"]["k"] == 20
    report = result["signals"]["subspace"]["report"]
    # every one of the 1480 unused digits of the training split: enough to resolve a TPR at 0.1 % FPR
    assert report["n_nonmembers"] == 1480 and report["tpr_at_fpr"]["0.001"] == 1.0
    # 20 members: a 30 % calibration part (6 members) could measure nothing, so none is made: the rule fixed in
    # advance chooses, and the headline is measured on every candidate
    assert result["split"]["calibration"] == {"members": 0, "nonmembers": 0}
    assert result["strongest"]["report"]["n_nonmembers"] == 1480 and "rule fixed in advance" in result["strongest"]["rule"]
    assert {"roc.png", "signals.csv", "scores.safetensors"} <= {p.name for p in out.iterdir()}
    assert main(["membership", "--model", str(trained), "--evaluate", "--references", "0"]) == 0
    weights_only = capsys.readouterr().out
    sub = next(line for line in weights_only.splitlines() if line.strip().startswith("subspace"))
    assert "AUC 1.000" not in sub  # the default initialisation is as large as the change


def test_out_is_a_membership_folder_never_a_users_file(trained, capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert main(["membership", "--model", str(trained), "--evaluate", "--out", str(notes)]) == 2
    assert "existing file" in capsys.readouterr().err and notes.read_text() == "mine"
    assert main(["membership", "--model", str(trained), "--evaluate", "--out", str(trained / "model.json")]) == 2
    assert main(["membership", "--model", str(trained), "--evaluate", "--out", str(trained)]) == 2
    assert "model directory" in capsys.readouterr().err
    assert (trained / "model.json").is_file() and (trained / "weights.safetensors").is_file()


def test_images_are_called_against_a_visible_null(trained, capsys, tmp_path):
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import read_model_meta

    task = load_task(DataSpec.model_validate(read_model_meta(trained)["data"]))
    np.savez(tmp_path / "mine.npz", x=np.r_[task.train.x[:5].numpy(), task.heldout.x[:5].numpy()])
    np.savez(tmp_path / "null.npz", x=task.heldout.x[5:].numpy())
    out = tmp_path / "r"
    assert main(["membership", "--model", str(trained), "--images", str(tmp_path / "mine.npz"),
                 "--null", str(tmp_path / "null.npz"), "--known-init", "seed:0", "--fpr", "0.05",
                 "--signal", "subspace", "--out", str(out)]) == 0
    result = json.loads((out / "images.json").read_text())
    assert result["signal"] == "subspace" and set(result["images"][0]["signals"]) >= {"loss", "gradient-norm"}
    assert [r["member"] for r in result["images"]] == [True] * 5 + [False] * 5
    assert result["null"]["count"] == 115 and "null.npz" in result["null"]["source"]
    assert all(0 < r["p_value"] <= 1 for r in result["images"])
    assert "5 of 10 images called members at 5.0% FPR" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    ([], "pass --images PATH (score your images) or --evaluate"),
    (["--evaluate", "--images", "x.npz"], "one of them"),
    (["--evaluate", "--known-init", "seed:1"], "is not the initialisation this model was trained from"),
    (["--evaluate", "--known-init", "seed:x"], "seed:N"),
    (["--evaluate", "--known-init", "init.safetensors"], "does not fit the model (missing"),
    (["--evaluate", "--known-init", "absent.safetensors"], "not found"),
    (["--evaluate", "--known-n", "100000"], "known n = 100000 is not this model's training-set size"),
    # a false n is refused as a false θ_init is; a true n beyond the layer's width is not (below)
    (["--evaluate", "--known-n", "8"], "its model directory records n_train 20; set knowledge.n (--known-n) to 20"),
    (["--images", "wrong.npz"], "do not fit the model's input 1x8x8"),
    (["--images", "range.npz"], "pass display-space images in [0, 1]"),
    (["--images", "ok.npz", "--fpr", "2"], "--fpr must lie in (0, 1)"),
    (["--images", "ok.npz", "--signal", "lira"], "unknown membership signal 'lira'"),
    (["--images", "ok.npz", "--signal", "lira-online"], "not available for these images"),
    (["--images", "labels.npz"], "labels y of shape"),
    (["--evaluate", "--nonmembers", "0"], "nonmembers"),
    (["--evaluate", "--calibration-fraction", "1"], "calibration_fraction"),
    (["--evaluate", "--threads", "-1"], "--threads must be >= 0 (0 = PyTorch's default), got -1"),
    # K is checked before any reference model is trained, and the number needed is named
    (["--evaluate", "--references", "1"], "--references 1 is too few"),
    (["--evaluate", "--references", "1", "--nonmembers", "500"], "; pass --references 2 or more"),
    # misleading messages of the fourth trial: junk called a pickle, model-space candidates told to divide by 255
    (["--images", "junk.npz"], "junk.npz is not an .npz file (no zip archive of arrays"),
    (["--images", "run/candidates.safetensors"], "is a run's candidates file: its x are in the model's input space"),
], ids=["neither", "both", "init-hash", "init-form", "init-keys", "init-missing", "known-n-absurd", "known-n-false",
        "image-shape", "image-range", "fpr", "signal", "signal-unavailable", "labels", "nonmembers", "calibration",
        "threads", "references-too-few", "references-too-few-names-the-number", "npz-junk", "run-candidates"])
def test_bad_input_is_one_line_and_writes_nothing(trained, tmp_path, capsys, monkeypatch, args, message):
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    save_file({"1.weight": torch.zeros(200, 64, dtype=torch.float64)}, str(tmp_path / "init.safetensors"))
    np.savez(tmp_path / "wrong.npz", x=np.zeros((2, 3, 8, 8)))
    np.savez(tmp_path / "range.npz", x=np.full((2, 1, 8, 8), 3.0))
    np.savez(tmp_path / "ok.npz", x=np.zeros((2, 1, 8, 8)))
    np.savez(tmp_path / "labels.npz", x=np.zeros((2, 1, 8, 8)), y=np.zeros(3))
    (tmp_path / "junk.npz").write_bytes(b"hello")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    save_file({"x": torch.full((2, 1, 8, 8), -0.5)}, str(tmp_path / "run" / "candidates.safetensors"))
    before, model_before = _snapshot(tmp_path), _snapshot(trained)
    code = main(["membership", "--model", str(trained), "--out", "result", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and message in err[0]
    assert _snapshot(tmp_path) == before and _snapshot(trained) == model_before


def test_reconstruct_refuses_knowledge_it_cannot_use(trained, tmp_path, capsys):
    code = main(["reconstruct", "--no-progress", "--model", str(trained), "--method", "loo", "--steps", "2",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "needs the initialisation" in err and not (tmp_path / "run").exists()
    code = main(["reconstruct", "--no-progress", "--model", str(trained), "--known-init", "seed:3", "--steps", "2",
                 "--out", str(tmp_path / "run")])
    assert code == 2 and "the model was trained with seed 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["reconstruct", "--no-progress", "--model", str(trained), "--known-init", "seed:0", "--known-n", "20",
                 "--steps", "2", "--out", str(tmp_path / "run")]) == 0
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["knowledge"]["known_init"]["source"] == "seed:0" and meta["knowledge"]["n"] == 20
    assert meta["knowledge"]["used"] == ["weights", "known_init", "n"] and meta["subspace"]["k"] == 20
    assert meta["run"]["knowledge"] == {"known_init": "seed:0", "n": 20}


def test_reference_models_are_kept_and_score_your_images_offline(trained, capsys, tmp_path):
    """--references K keeps the models in --out; --images into the same folder adds LiRA offline and RMIA."""
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import read_model_meta

    (tmp_path / "m.yaml").write_text("nonmembers: 300\npopulation: 60\nreferences: {count: 4, seed: 1}\n")
    out = tmp_path / "m"
    assert main(["membership", "--model", str(trained), "--evaluate", "--config", str(tmp_path / "m.yaml"),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 reference models trained" in text and "pseudo-targets" in text
    result = json.loads((out / "membership.json").read_text())
    assert result["references"]["count"] == 4 and result["settings"]["nonmembers"] == 300
    assert result["signals"]["lira-online"]["applicable"]
    task = load_task(DataSpec.model_validate(read_model_meta(trained)["data"]))
    np.savez(tmp_path / "mine.npz", x=task.train.x[:4].numpy(), y=task.train.y[:4].numpy())
    assert main(["membership", "--model", str(trained), "--images", str(tmp_path / "mine.npz"), "--out", str(out),
                 "--config", str(tmp_path / "m.yaml")]) == 0
    images = json.loads((out / "images.json").read_text())
    assert {"lira-offline", "rmia", "loss", "subspace"} <= set(images["images"][0]["signals"])
    assert images["labels"] == "given" and "reference models kept" in " ".join(images["notes"])
    # the same evaluation again finds it finished: it prints it as recorded and rewrites nothing
    before = (out / "membership.json").read_bytes()
    assert main(["membership", "--model", str(trained), "--evaluate", "--config", str(tmp_path / "m.yaml"),
                 "--out", str(out)]) == 0
    assert "(4 trained now, 0 reused)" in capsys.readouterr().out and (out / "membership.json").read_bytes() == before
    # another evaluation (another LiRA variance prior) reuses the four models
    assert main(["membership", "--model", str(trained), "--evaluate", "--config", str(tmp_path / "m.yaml"),
                 "--variance-prior", "2", "--out", str(out)]) == 0
    assert "(0 trained now, 4 reused)" in capsys.readouterr().out


@pytest.fixture(scope="module")
def kept(trained, tmp_path_factory) -> Path:
    """A membership folder of ``trained`` with 4 reference models (weights kept)."""
    out = tmp_path_factory.mktemp("kept") / "m"
    assert main(["membership", "--model", str(trained), "--evaluate", "--nonmembers", "200", "--population", "40",
                 "--references", "4", "--reference-seed", "2", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def other(trained, tmp_path_factory) -> Path:
    """Another model of the same data and architecture (another learning rate: another recipe)."""
    out = tmp_path_factory.mktemp("other") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "10", "--n-heldout-per-class",
                 "60", "--hidden", "200", "--no-bias", "--lr", "0.3", "--epochs", "50", "--dtype", "float64",
                 "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("args", [
    ["--evaluate", "--nonmembers", "200", "--population", "40", "--references", "4", "--reference-seed", "2"],
    ["--evaluate", "--nonmembers", "200", "--population", "40", "--references", "0"],
    ["--evaluate"],
    ["--images", "mine.npz"],
], ids=["references-4", "references-0", "defaults", "images"])
def test_another_models_membership_folder_is_refused_whatever_k(kept, other, tmp_path, capsys, monkeypatch, args):
    """The one output rule of membership folders: a call for another model into a folder (its result, its reference
    models) is refused without --overwrite, and nothing in the folder changes."""
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "mine.npz", x=np.zeros((2, 1, 8, 8)))
    before = _snapshot(kept)
    code = main(["membership", "--model", str(other), "--out", str(kept), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"is the membership folder of another model, {_model_of(kept)};" in err[0], err[0]
    assert "would replace its result and its 4 reference models" in err[0], err[0]
    assert "pass --overwrite to replace them" in err[0]
    assert _snapshot(kept) == before


def test_overwrite_replaces_another_models_folder(kept, other, tmp_path, capsys):
    out = tmp_path / "m"
    import shutil

    shutil.copytree(kept, out)
    assert main(["membership", "--model", str(other), "--evaluate", "--nonmembers", "200", "--population", "40",
                 "--references", "0", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "target.json").read_text())["model"] == str(other.resolve())
    assert not (out / "references").exists()
    capsys.readouterr()


@pytest.mark.parametrize("name", ["stats.safetensors", "weights.safetensors"])
@pytest.mark.parametrize("mode", ["evaluate", "images"])
def test_a_flipped_byte_in_a_kept_reference_model_is_refused(kept, tmp_path, capsys, monkeypatch, name, mode):
    """Every file kept and read back is checked against its checksum (DONE.json), reference models included."""
    import shutil

    out = tmp_path / "m"
    shutil.copytree(kept, out)
    path = out / "references" / "ref-00001" / name
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.write_bytes(bytes(data))
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "mine.npz", x=np.zeros((2, 1, 8, 8)))
    # another evaluation than the folder's (a finished one called again reads no model: it is not run again)
    args = (["--evaluate", "--nonmembers", "200", "--population", "40", "--references", "4", "--reference-seed", "2",
             "--variance-prior", "2"] if mode == "evaluate" else ["--images", "mine.npz"])
    before = _snapshot(out)
    code = main(["membership", "--model", str(_model_of(kept)), "--out", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"{path} does not match the checksum in" in err[0] and "delete" in err[0]
    assert _snapshot(out) == before


def test_reference_models_of_another_seed_are_never_trained_over(kept, tmp_path, capsys):
    """A call with another --reference-seed into a folder of finished reference models (a fixed K or auto) is refused
    in one line and changes no file of the folder; the folder's own seed reuses them; --overwrite replaces them."""
    import shutil

    out = tmp_path / "m"
    shutil.copytree(kept, out)
    before = _snapshot(out)
    base = ["membership", "--model", str(_model_of(kept)), "--evaluate", "--nonmembers", "200", "--population", "40",
            "--no-progress", "--out", str(out)]
    for count in ("4", "auto"):
        assert main([*base, "--references", count, "--reference-seed", "3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "holds 4 finished reference models made with --reference-seed 2, not this " \
            "call's (--reference-seed 3)" in err[0], err
        assert _snapshot(out) == before
    assert main([*base, "--references", "4", "--reference-seed", "2"]) == 0  # the folder's own evaluation: finished
    assert "(4 trained now, 0 reused)" in capsys.readouterr().out and _snapshot(out) == before
    assert main([*base, "--references", "4", "--reference-seed", "2", "--variance-prior", "2"]) == 0
    assert "(0 trained now, 4 reused)" in capsys.readouterr().out
    assert main([*base, "--references", "4", "--reference-seed", "3", "--overwrite"]) == 0
    assert "(4 trained now, 0 reused)" in capsys.readouterr().out


def _model_of(folder: Path) -> Path:
    return Path(json.loads((folder / "target.json").read_text())["model"])


def test_a_true_n_wider_than_the_first_layer_is_accepted(tmp_path, capsys):
    """10 training images, a first layer 8 wide: n = 10 is the truth (the subspace is then the layer's whole span)."""
    model = tmp_path / "narrow"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "8",
                 "--no-bias", "--epochs", "5", "--no-progress", "--out", str(model)]) == 0
    assert main(["membership", "--model", str(model), "--evaluate", "--nonmembers", "40", "--known-n", "10",
                 "--known-init", "seed", "--references", "0"]) == 0
    assert "n = 10" in capsys.readouterr().out
    assert main(["membership", "--model", str(model), "--evaluate", "--nonmembers", "40", "--known-n", "8"]) == 2
    assert "records n_train 10" in capsys.readouterr().err


def test_ctrl_c_during_the_reference_models_says_how_to_continue(trained, tmp_path, capsys, monkeypatch):
    """Ctrl-C (or SIGTERM) of membership names how to continue, and continuing that way reuses what finished."""
    from datarecon.experiments.membership import trainers as references

    real, calls = references.fit_on_images, []

    def fit(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(references, "fit_on_images", fit)
    args = ["membership", "--model", str(trained), "--evaluate", "--nonmembers", "200", "--population", "40",
            "--references", "4", "--reference-seed", "2", "--out", str(tmp_path / "m")]
    assert main([*args, "--no-progress"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interrupted; rerun the same command to continue (the reference models finished in --out are kept and not "
        "trained again)")
    monkeypatch.setattr(references, "fit_on_images", real)
    assert main(args) == 0
    assert "(2 trained now, 2 reused)" in capsys.readouterr().out


def test_progress_of_every_reference_model_and_of_the_scoring(trained, tmp_path, capsys):
    """In a log (no terminal): a line per model (each is 25 % of four), then the choice on pseudo-targets and the
    ROCs; nothing of it with --no-progress."""
    args = ["membership", "--model", str(trained), "--evaluate", "--nonmembers", "200", "--population", "40",
            "--references", "4", "--reference-seed", "2", "--out", str(tmp_path / "m")]
    assert main(args) == 0
    err = capsys.readouterr().err
    for k in range(1, 5):
        assert f"reference models: model {k}/4 ({25 * k}%)" in err, err
    assert "reference models: done model 4/4" in err
    assert "strongest signal: done pseudo-target 4/4" in err and "membership ROCs: done signal 8/8" in err
    assert main([*args, "--overwrite", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
