"""``datarecon train`` / ``datarecon info`` in-process: happy path and pinned one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.cli.main import main
from datarecon.training.configs import StopConfig

DIGITS = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "15", "--hidden", "12",
          "--no-bias", "--lr", "0.5", "--epochs", "40"]


def _err(capsys, argv: list[str]) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_train_then_info(tmp_path: Path, capsys) -> None:
    out = tmp_path / "m"
    assert main([*DIGITS, "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert main(["info", str(out)]) == 0
    card = capsys.readouterr().out
    for text in ("arch        mlp 64-12-1, bias no", "parameters  780", "digits / odd-even, 15 per class",
                 "loss        logistic, weight decay 0", "gd lr 0.5", "epochs 40/40", "train acc", "versions"):
        assert text in card, card


def test_config_file_with_option_overrides(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {dataset: digits, task: odd-even, n_per_class: 10}\n"
                   "arch: {name: mlp, hidden: [8], bias: true}\nlr: 0.1\nepochs: 5\n")
    out = tmp_path / "m"
    assert main(["train", "--config", str(cfg), "--no-bias", "--weight-decay", "0.01", "--epochs", "7",
                 "--dtype", "float64", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bias no" in text and "weight decay 0.01" in text and "epochs 7/7" in text and "float64" in text


def test_resume_option(tmp_path: Path, capsys) -> None:
    out = tmp_path / "m"
    assert main([*DIGITS, "--out", str(out), "--quiet"]) == 0
    assert main([*DIGITS, "--out", str(out), "--quiet", "--resume"]) == 0
    line = _err(capsys, [*DIGITS, "--lr", "0.4", "--out", str(out), "--quiet", "--resume"])
    assert "written with another configuration" in line


@pytest.mark.parametrize(("extra", "message"), [
    (["--arch", "resnet"], "error: unknown architecture 'resnet'; valid names: affine, cnn, mlp, one-hidden, resnet18, resnet8"),
    (["--loss", "hinge"], "error: unknown loss 'hinge'; valid names: cross-entropy, huber, logistic, mse"),
    (["--n-per-class", "0"], "error: invalid training config: data.n_per_class: Input should be greater than 0"),
    (["--n-per-class", "-3"], "error: invalid training config: data.n_per_class: Input should be greater than 0; "
                              "data.n_partition_per_class: Input should be greater than or equal to 0; "
                              "data.n_heldout_per_class: Input should be greater than or equal to 0"),
    (["--lr", "0"], "error: invalid training config: lr: Input should be greater than 0"),
    (["--lr", "-0.1"], "error: invalid training config: lr: Input should be greater than 0"),
    (["--n-per-class", "900"], "error: n_per_class=900 + n_partition_per_class=900 needs 1800 images of class "
                               "'even' from digits train, but only 746 are available; lower the counts"),
    (["--loss", "cross-entropy"], "error: loss 'cross-entropy' does not fit the binary task 'odd-even'; "
                                  "use one of: huber, logistic, mse"),
    (["--optimizer", "adam"], "error: unknown optimizer 'adam'; valid names: gd, lbfgs"),
    (["--hidden", "a,b"], "error: --hidden must be a comma-separated list of widths like 1000,1000; got 'a,b'"),
], ids=["arch", "loss", "n-zero", "n-negative", "lr-zero", "lr-negative", "n-too-large", "loss-task",
        "optimizer", "hidden"])
def test_user_errors_are_one_line(tmp_path: Path, capsys, extra, message) -> None:
    out = tmp_path / "m"
    assert _err(capsys, [*DIGITS, *extra, "--out", str(out)]) == message
    assert not out.exists()


def test_existing_out_dir_needs_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "m"
    assert main([*DIGITS, "--out", str(out), "--quiet"]) == 0
    first = (out / "weights.safetensors").read_bytes()
    assert _err(capsys, [*DIGITS, "--out", str(out)]) == (
        f"error: output directory {out} exists; pass --overwrite to replace it or choose another --out")
    (out / ".weights.safetensors.abc12345.tmp").write_text("left by a killed writer")
    assert main([*DIGITS, "--out", str(out), "--overwrite", "--quiet", "--seed", "1"]) == 0
    assert (out / "weights.safetensors").read_bytes() != first
    assert not (out / ".weights.safetensors.abc12345.tmp").exists()


def test_overwrite_refuses_a_folder_that_is_not_a_model_directory(tmp_path: Path, capsys) -> None:
    out = tmp_path / "u"
    (out / "important").mkdir(parents=True)
    (out / "important" / "thesis.txt").write_text("x")
    line = _err(capsys, [*DIGITS, "--out", str(out), "--overwrite"])
    assert line == (f"error: refusing to --overwrite {out}: it is not a datarecon model directory (it holds "
                    "'important'); choose another --out or remove it yourself")
    assert (out / "important" / "thesis.txt").read_text() == "x"


def test_missing_data_dir(tmp_path: Path, capsys) -> None:
    line = _err(capsys, ["train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "5",
                         "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m")])
    assert line.startswith("error: MNIST not found") and str(tmp_path / "nowhere") in line


def test_missing_required_options_and_bad_config(tmp_path: Path, capsys) -> None:
    assert _err(capsys, ["train", "--dataset", "digits", "--out", str(tmp_path / "m")]) == (
        "error: missing --task, --n-per-class; pass them or a --config FILE")
    assert _err(capsys, ["train", "--config", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "m")]) == (
        f"error: config file {tmp_path / 'none.yaml'} not found; check the path")
    assert "not both" in _err(capsys, [*DIGITS, "--out", str(tmp_path / "m"), "--resume", "--overwrite"])


def test_info_on_missing_dir(tmp_path: Path, capsys) -> None:
    line = _err(capsys, ["info", str(tmp_path / "nope")])
    assert line == f"error: model directory {tmp_path / 'nope'} not found; train one with `datarecon train --out {tmp_path / 'nope'}`"


def test_reproduce_rejects_negative_threads(tmp_path: Path, capsys) -> None:
    line = _err(capsys, ["reproduce", "runkel2024", "--out", str(tmp_path / "r"), "--threads", "-1"])
    assert "--threads must be >= 0" in line


def _leaf_fields(model_cls, prefix: str = "") -> set[str]:
    """Dotted names of every leaf field of a pydantic config (nested configs expanded)."""
    from pydantic import BaseModel

    names: set[str] = set()
    for name, info in model_cls.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            names |= _leaf_fields(ann, f"{prefix}{name}.")
        else:
            names.add(prefix + name)
    return names


def test_every_training_config_field_is_reachable_from_the_cli(tmp_path: Path) -> None:
    """Each leaf of TrainConfig is set by some option: flip every option and read the written config."""
    import json

    from datarecon.training.target import TrainConfig

    from datarecon.data import DataSpec, load_task

    out = tmp_path / "m"
    pool = {"dataset": "digits", "task": "odd-even", "n_per_class": 6, "selection": "random", "seed": 3,
            "n_heldout_per_class": 4, "n_partition_per_class": 2}
    drawn = load_task(DataSpec(**pool, n_train=5)).train.indices.tolist()  # the draw --train-indices must repeat
    argv = ["train", "--out", str(out), "--dataset", "digits", "--task", "odd-even", "--n-per-class", "6",
            "--n-train", "5", "--train-indices", ",".join(map(str, drawn)),
            "--selection", "random", "--data-seed", "3", "--n-heldout-per-class", "4", "--n-partition-per-class", "2",
            "--normalisation", "unit", "--arch", "mlp", "--hidden", "8,8", "--no-bias", "--init-scale", "0.01",
            "--loss", "logistic", "--weight-decay", "0", "--optimizer", "gd", "--lr", "0.02", "--momentum", "0",
            "--epochs", "400", "--schedule", "loss-normalised", "--max-lr-factor", "none",
            "--margin-ascent-steps", "5", "--margin-ascent-step-size", "0.02", "--margin-ascent-growth", "1.2",
            "--margin-ascent-max-step", "0.05", "--margin-ascent-min-step", "1e-7",
            "--margin-ascent-rtol", "0.5", "--margin-ascent-window", "5",
            "--loss-threshold", "1e-30", "--no-stop-at-zero-error", "--margin-patience", "1000", "--margin-stable-rtol", "1e-5",
            "--dtype", "float64", "--device", "cpu", "--seed", "2", "--checkpoint-every", "50", "--log-every", "20",
            "--kkt-score", "--no-progress", "--quiet"]
    assert main(argv) == 0
    meta = json.loads((out / "model.json").read_text())
    tr, data = meta["training"], meta["training"]["data"]
    expected = {"data.dataset": "digits", "data.task": "odd-even", "data.n_per_class": 6, "data.selection": "random",
                "data.seed": 3, "data.n_heldout_per_class": 4, "data.n_partition_per_class": 2,
                "data.normalisation": "unit", "data.n_train": 5, "data.train_indices": drawn, "arch.name": "mlp", "arch.hidden": [8, 8], "arch.bias": False,
                "arch.init_scale": 0.01, "arch.kernel": None, "loss": "logistic", "weight_decay": 0.0, "optimizer": "gd", "lr": 0.02,
                "momentum": 0.0, "epochs": 400, "schedule": "loss-normalised", "max_lr_factor": None,
                "margin_ascent.steps": 5, "margin_ascent.step_size": 0.02, "margin_ascent.growth": 1.2,
                "margin_ascent.max_step": 0.05, "margin_ascent.min_step": 1e-7, "margin_ascent.rtol": 0.5,
                "margin_ascent.window": 5, "stop.loss_threshold": 1e-30,
                "stop.zero_error": False, "stop.margin_patience": 1000, "stop.margin_stable_rtol": 1e-5, "dtype": "float64",
                "device": "cpu", "seed": 2, "checkpoint_every": 50, "log_every": 20, "kkt_score": True,
                "dp": None}  # DP-SGD excludes margin ascent: its fields are flipped in the test below
    # a new config field must get an option here (mini-batches exclude margin ascent: the test below; the
    # fine-tuning fields, which need a ResNet and a pretrained model: tests/cli/test_finetune_cli.py)
    finetune = {"pretrained", "data.skip_per_class", "arch.batch_norm", "norm_mode"}
    assert set(expected) | {"batch_size"} | finetune == _leaf_fields(TrainConfig)
    recorded_as = StopConfig.renamed_fields  # a field renamed after folders were written: recorded as before
    for dotted, value in expected.items():
        node = tr
        for part in dotted.split("."):
            node = node[recorded_as.get(part, part)]
        assert node == value, dotted
    assert data["dataset"] == "digits" and "kkt_regime_score" in meta["metrics"]
    assert meta["metrics"]["margin_ascent_steps"] >= 1


@pytest.mark.parametrize("noise", [["--dp-noise", "0.7"], ["--dp-epsilon", "50"]], ids=["noise", "epsilon"])
def test_every_dp_field_is_reachable_from_the_cli(tmp_path: Path, noise: list[str]) -> None:
    """Each DPConfig field is set by a --dp-* option (noise and target epsilon exclude each other)."""
    pytest.importorskip("opacus", reason="the dp extra (pip install 'datarecon[dp]') is installed by make test / CI")
    import json

    from datarecon.training.dp import DPConfig

    out = tmp_path / "m"
    argv = [*DIGITS, "--out", str(out), "--epochs", "2", *noise, "--dp-clip", "0.5", "--dp-batch-size", "4",
            "--dp-delta", "0.004", "--dp-accountant", "prv", "--no-progress", "--quiet"]
    assert main(argv) == 0
    dp = json.loads((out / "model.json").read_text())["training"]["dp"]
    expected = {"noise_multiplier": 0.7 if noise[0] == "--dp-noise" else None,
                "target_epsilon": 50.0 if noise[0] == "--dp-epsilon" else None,
                "max_grad_norm": 0.5, "batch_size": 4, "delta": 0.004, "accountant": "prv"}
    assert set(expected) == _leaf_fields(DPConfig)  # a new DP field must get an option here
    assert dp == expected


def test_max_lr_factor_must_be_a_number_or_none(capsys) -> None:
    line = _err(capsys, [*DIGITS, "--out", "unused", "--max-lr-factor", "big"])
    assert "--max-lr-factor" in line and "'none'" in line


def test_batch_size_is_reachable_from_the_cli_and_recorded(tmp_path: Path) -> None:
    import json

    out = tmp_path / "m"
    assert main(["train", "--out", str(out), "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5",
                 "--hidden", "8", "--epochs", "3", "--batch-size", "4", "--no-progress", "--quiet"]) == 0
    meta = json.loads((out / "model.json").read_text())
    assert meta["training"]["batch_size"] == 4
    full = tmp_path / "f"
    assert main(["train", "--out", str(full), "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5",
                 "--hidden", "8", "--epochs", "3", "--no-progress", "--quiet"]) == 0
    assert "batch_size" not in json.loads((full / "model.json").read_text())["training"]  # full batch: as before
