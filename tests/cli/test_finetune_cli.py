"""`train --pretrained` and `reconstruct --known-init pretrained` on the command line: the fine-tuning fields
reach the config, and the attack runs from the public pretrained start."""

from __future__ import annotations

import json
from pathlib import Path

from datarecon.cli.main import main

RESNET = ["--arch", "resnet8", "--channels", "4,8,8", "--batch-norm", "--no-bias", "--loss", "cross-entropy",
          "--normalisation", "unit", "--no-progress", "--quiet"]


def test_the_fine_tuning_flags_reach_the_config_and_the_attack_starts_from_the_pretrained_model(tmp_path: Path) -> None:
    pre, ft, run = tmp_path / "pre", tmp_path / "ft", tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "20", "--skip-per-class", "10",
                 "--n-partition-per-class", "0", "--n-heldout-per-class", "5", *RESNET, "--lr", "0.05",
                 "--batch-size", "50", "--epochs", "2", "--out", str(pre)]) == 0
    digest = json.loads((pre / "model.json").read_text())["sha256"]["weights.safetensors"]
    assert main(["train", "--dataset", "digits", "--task", "all", "--n-per-class", "2", "--n-heldout-per-class", "4",
                 *RESNET, "--pretrained", str(pre), "--pretrained-sha256", digest, "--lr", "0.01", "--batch-size",
                 "20", "--epochs", "2", "--norm-mode", "eval", "--out", str(ft)]) == 0
    pre_meta, meta = json.loads((pre / "model.json").read_text()), json.loads((ft / "model.json").read_text())
    assert pre_meta["training"]["data"]["skip_per_class"] == 10 and pre_meta["arch"]["batch_norm"] is True
    assert "skip_per_class" not in meta["training"]["data"]  # 0: left out, as before the field existed
    assert meta["training"]["pretrained"] == {"path": str(pre), "sha256": digest}
    assert meta["training"]["arch"]["batch_norm"] is True and meta["pretrained"]["head"] == "pretrained"
    assert meta["training"]["norm_mode"] == "eval"  # --norm-mode reaches the config (auto: left out)
    assert main(["reconstruct", "--model", str(ft), "--method", "dynamics", "--known-init", "pretrained",
                 "--known-recipe", "model", "--candidates", "20", "--init", "uniform", "--steps", "2",
                 "--no-progress", "--out", str(run)]) == 0
    knowledge = json.loads((run / "run.json").read_text())["knowledge"]
    assert knowledge["known_init"] == {"source": f"pretrained:{pre.resolve()}", "sha256": meta["init_sha256"]}
    assert "initialisation θ_init (pretrained:" in knowledge["summary"]


MLP = ["--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--normalisation", "unit", "--hidden", "8",
       "--no-bias", "--no-progress", "--quiet"]


def test_a_resume_after_the_pretrained_weights_changed_names_them(tmp_path: Path, capsys) -> None:
    """Not "another configuration": the pretrained folder was retrained since the fine-tuning's checkpoint."""
    pre, ft = tmp_path / "pre", tmp_path / "ft"
    pretrain = ["train", *MLP, "--skip-per-class", "20", "--epochs", "10", "--out", str(pre)]
    finetune = ["train", *MLP, "--epochs", "10", "--checkpoint-every", "5", "--pretrained", str(pre), "--out", str(ft)]
    assert main(pretrain) == 0 and main(finetune) == 0
    assert main([*finetune, "--resume"]) == 0  # the same start: resumes (here: already finished)
    assert main([*pretrain, "--seed", "7", "--overwrite"]) == 0
    capsys.readouterr()
    before = (ft / "checkpoint" / "state.safetensors").read_bytes()
    assert main([*finetune, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the checkpoint in {ft} was trained from other pretrained weights than those in "
                          f"{pre} now")
    assert "retrained or replaced since?); restore those weights" in err and "start afresh with --overwrite" in err
    assert (ft / "checkpoint" / "state.safetensors").read_bytes() == before
