"""Findings of the seventh adversarial trial (issue 50 item 5; tests/faults/seventh_trial.py) that a bad-input row
cannot pin, because the command runs: each fails on the source before its fix.

* A run killed mid-way and resumed with ``--steps`` equal to its checkpoint's step took no step and recorded no
  final metrics: it printed "loss nan" and its run.json's ``final`` was ``{}``, where the uninterrupted run of the
  same command records the loss terms of its last step (the resumed loop now starts from its checkpoint's metrics).
* Dynamics matching replays the training on one candidate per training image, yet its default m was 2n: without
  ``--candidates`` every such attack was refused ("pass --candidates n (got 2n)") for a value the user never gave.
"""

from __future__ import annotations

import json
from pathlib import Path

from faultlib import assert_same_tree, run_faulted, run_ok, set_aside

Q = ["--no-progress", "--threads", "1"]
TRAIN = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "8", "--no-bias",
         "--epochs", "20", *Q]


def test_a_run_resumed_at_its_checkpoints_step_keeps_its_final_metrics(tmp_path: Path) -> None:
    model, out = tmp_path / "model", tmp_path / "run"
    run_ok(*TRAIN, "--out", str(model))
    attack = ["reconstruct", "--model", str(model), "--candidates", "4", "--checkpoint-every", "2", *Q]
    run_ok(*attack, "--steps", "2", "--out", str(out))
    ref = set_aside(out)
    killed = run_faulted(*attack, "--steps", "8", "--out", str(out), step=3)  # its checkpoint is at step 2
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run_ok(*attack, "--steps", "2", "--out", str(out), "--resume")
    assert "loss nan" not in resumed.stderr + resumed.stdout
    final = json.loads((out / "run.json").read_text())["final"]
    assert final and final == json.loads((ref / "run.json").read_text())["final"]
    assert assert_same_tree(ref, out, skip=("run.json",)) >= 4


def test_dynamics_defaults_to_one_candidate_per_training_image(tmp_path: Path) -> None:
    model, out = tmp_path / "model", tmp_path / "run"
    run_ok(*TRAIN, "--out", str(model))
    run_ok("reconstruct", "--model", str(model), "--method", "dynamics", "--known-init", "seed:0", "--known-recipe",
           "model", "--steps", "2", "--out", str(out), *Q)
    assert json.loads((out / "run.json").read_text())["m"] == 10  # n: 5 per class of odd/even
