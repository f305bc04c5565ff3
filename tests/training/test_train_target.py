"""train_target: config -> model directory, metrics, resume, config validation, model card."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from datarecon.config import load_config_file
from datarecon.errors import CheckpointError, DataReconError
from datarecon.models.checkpoint import load_model_dir
from datarecon.training import TrainConfig, build_train_config, model_card, train_target
from datarecon.training.target import TargetMeasures
from datarecon.kernel.losses import margins

BASE = {"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 20, "n_heldout_per_class": 30},
        "arch": {"name": "mlp", "hidden": [16], "bias": False}, "lr": 0.5, "epochs": 120, "log_every": 10}


def _cfg(**over) -> TrainConfig:
    fields = json.loads(json.dumps(BASE))
    for k, v in over.items():
        if isinstance(v, dict):
            fields.setdefault(k, {}).update(v)
        else:
            fields[k] = v
    return build_train_config(fields)


def test_train_writes_complete_model_directory(tmp_path: Path) -> None:
    res = train_target(_cfg(), out=tmp_path / "m", progress=False, measures=TargetMeasures(kkt_score=True))
    b = load_model_dir(tmp_path / "m")
    assert b.arch.input_shape == (1, 8, 8) and b.arch.num_outputs == 1 and not b.arch.bias
    assert b.loss == "logistic" and b.weight_decay == 0.0 and b.normalisation == "unit-minus-mean"
    assert b.data["dataset"] == "digits" and b.data["n_per_class"] == 20
    assert b.indices["train"].shape == (40,) and b.indices["heldout"].shape == (60,)
    m = b.meta["metrics"]
    assert m["train_accuracy"] == 1.0 and m["epochs_done"] == 120 and m["status"] == "complete"
    assert 0.0 <= m["heldout_accuracy"] <= 1.0 and m["n_heldout"] == 60
    assert 0.0 <= m["kkt_regime_score"] <= 1.0 and m["homogeneity_degree"] == 2
    assert m["normalised_margin"] == pytest.approx(m["min_margin"] / m["weight_norm"] ** 2, rel=1e-6)
    assert b.meta["training"]["config_hash"] == res.config.hash()
    # the saved model reproduces the saved margins on the saved training indices
    from datarecon.data import load_task

    data = load_task(res.config.data)
    assert torch.equal(data.train.indices, b.indices["train"])
    assert torch.equal(b.input_mean, data.normalisation.mean)
    x = data.train.x - b.input_mean
    torch.testing.assert_close(margins(b.model(x), data.train.y), b.extras["train_margins"])
    lines = (tmp_path / "m" / "history.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in lines][-1] == 120 and len(lines) == 12
    card = model_card(b)
    for text in ("mlp 64-16-1", "parameters  1,040", "digits / odd-even", "logistic, weight decay 0",
                 "held-out acc", "KKT-regime score", f"torch {torch.__version__}"):
        assert text in card


def test_float64_multiclass_cross_entropy(tmp_path: Path) -> None:
    cfg = _cfg(data={"task": "classes:0,1,2", "n_per_class": 10, "n_heldout_per_class": 10}, loss="cross-entropy", dtype="float64",
               arch={"bias": True}, epochs=60, lr=0.1, momentum=0.9)
    res = train_target(cfg, out=tmp_path / "m", progress=False)
    b = load_model_dir(tmp_path / "m")
    assert b.arch.num_outputs == 3 and next(iter(b.params.values())).dtype == torch.float64
    assert res.metrics["train_accuracy"] == 1.0


def test_killed_run_resumes_bit_identically(kill_after, tmp_path: Path, monkeypatch) -> None:
    cfg = _cfg(momentum=0.9, schedule="loss-normalised", lr=0.05, checkpoint_every=25)
    train_target(cfg, out=tmp_path / "full", progress=False)
    target_mod = sys.modules["datarecon.training.target"]
    real_fit = target_mod.fit
    monkeypatch.setattr(target_mod, "fit", lambda *a, loop, **k: real_fit(
        *a, loop=dataclasses.replace(loop, hooks=(kill_after(61),)), **k))
    with pytest.raises(KeyboardInterrupt):
        train_target(cfg, out=tmp_path / "part", progress=False)
    monkeypatch.setattr(target_mod, "fit", real_fit)
    assert not (tmp_path / "part" / "model.json").exists()
    with pytest.raises(DataReconError, match=r"holds an unfinished training \(stopped at epoch 61\); pass --resume"):
        train_target(cfg, out=tmp_path / "part", progress=False)
    res = train_target(cfg, out=tmp_path / "part", progress=False, resume=True)
    assert res.fit.resumed_from == 61
    a, b = load_model_dir(tmp_path / "full"), load_model_dir(tmp_path / "part")
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k])
    assert (tmp_path / "full" / "history.jsonl").read_text() == (tmp_path / "part" / "history.jsonl").read_text()
    with pytest.raises(CheckpointError, match="written with another configuration"):
        train_target(_cfg(momentum=0.9, schedule="loss-normalised", lr=0.06), out=tmp_path / "part",
                     progress=False, resume=True)


def test_overwrite_replaces_a_model_directory_only(tmp_path: Path) -> None:
    train_target(_cfg(epochs=2), out=tmp_path / "m", progress=False)
    first = (tmp_path / "m" / "model.json").read_text()
    train_target(_cfg(epochs=3), out=tmp_path / "m", progress=False, overwrite=True)
    assert (tmp_path / "m" / "model.json").read_text() != first
    (tmp_path / "m" / "junk.txt").write_text("x")  # not ours: --overwrite must not delete it
    with pytest.raises(DataReconError, match="refusing to --overwrite .*it holds 'junk.txt'"):
        train_target(_cfg(epochs=3), out=tmp_path / "m", progress=False, overwrite=True)
    assert (tmp_path / "m" / "junk.txt").read_text() == "x" and (tmp_path / "m" / "model.json").is_file()


def test_config_file_maps_one_to_one(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "data: {dataset: digits, task: odd-even, n_per_class: 20}\n"
        "arch: {name: mlp, hidden: [16], bias: false, init_scale: 1.0e-4}\n"
        "loss: logistic\nlr: 0.5\nepochs: 10\nstop: {zero_error: true, margin_patience: 5}\n"
    )
    cfg = load_config_file(path, TrainConfig, overrides={"lr": 0.25})
    assert cfg.lr == 0.25 and cfg.arch.init_scale == 1e-4 and cfg.stop.zero_error and cfg.arch.hidden == (16,)
    assert cfg.arch_spec().input_shape == (1, 8, 8)
    assert TrainConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    toml = tmp_path / "train.toml"
    toml.write_text('lr = 0.5\nepochs = 10\n[data]\ndataset = "digits"\ntask = "odd-even"\nn_per_class = 20\n')
    assert load_config_file(toml, TrainConfig).data.n_per_class == 20
    path.write_text("data: {dataset: digits, task: odd-even, n_per_class: 20}\nlearning_rate: 0.1\n")
    with pytest.raises(DataReconError, match="learning_rate: unknown key"):
        load_config_file(path, TrainConfig)


@pytest.mark.parametrize(("over", "message"), [
    ({"lr": -1.0}, "invalid training config: lr: Input should be greater than 0"),
    ({"data": {"n_per_class": 0}}, "data.n_per_class: Input should be greater than 0"),
    ({"epochs": 0}, "epochs: Input should be greater than or equal to 1"),
    ({"momentum": 1.0}, "momentum: Input should be less than 1"),
    ({"loss": "cross-entropy"}, "loss 'cross-entropy' does not fit the binary task 'odd-even'; use one of: huber, "
                                "logistic, mse"),
    ({"loss": "hinge"}, "unknown loss 'hinge'; valid names: cross-entropy, huber, logistic, mse"),
    ({"optimizer": "adam"}, "unknown optimizer 'adam'; valid names: gd, lbfgs"),
    ({"schedule": "cosine"}, "unknown schedule 'cosine'; valid names: constant, increasing, loss-normalised"),
    ({"optimizer": "lbfgs", "momentum": 0.5}, "momentum applies to optimizer gd only"),
    ({"arch": {"name": "resnet"}}, "unknown architecture 'resnet'; valid names: affine, cnn, mlp, one-hidden, resnet18, resnet8"),
    ({"arch": {"hidden": [0]}}, "hidden widths must be positive"),
    ({"dtype": "float16"}, "dtype: Input should be 'float32' or 'float64'"),
], ids=["lr", "n", "epochs", "momentum", "loss-task", "loss-name", "optimizer", "schedule", "lbfgs-momentum",
        "arch", "hidden", "dtype"])
def test_config_errors_are_one_line(over, message) -> None:
    with pytest.raises(DataReconError) as info:
        _cfg(**over)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_too_many_images_and_missing_data(tmp_path: Path) -> None:
    with pytest.raises(DataReconError, match="only .* are available; lower the counts"):
        train_target(_cfg(data={"n_per_class": 5000}), out=tmp_path / "m", progress=False)
    assert not (tmp_path / "m").exists()
    cfg = _cfg(data={"dataset": "mnist"})
    with pytest.raises(DataReconError, match="MNIST not found"):
        train_target(cfg, out=tmp_path / "m", data_dir=tmp_path / "nowhere", progress=False)
