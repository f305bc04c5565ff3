"""``datarecon train --arch resnet8`` with mini-batches, then ``reconstruct --method dynamics`` and ``evaluate``
from the command line: the recipe recorded by train is the one the attack replays, and what the attacker did
not know is recorded as unknown."""

from __future__ import annotations

import json

import pytest

from datarecon.cli.main import main


@pytest.fixture(scope="module")
def resnet_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("resnet") / "model"
    rc = main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "3", "--arch", "resnet8",
               "--channels", "2,3,3", "--no-bias", "--loss", "logistic", "--lr", "0.05", "--momentum", "0.5",
               "--batch-size", "4", "--epochs", "3", "--no-progress", "--out", str(out)])
    assert rc == 0
    return out


def test_a_resnet_trained_with_minibatches_records_its_recipe(resnet_dir) -> None:
    meta = json.loads((resnet_dir / "model.json").read_text())
    assert meta["arch"]["name"] == "resnet8" and meta["arch"]["hidden"] == [2, 3, 3]
    assert (meta["training"]["batch_size"], meta["training"]["epochs"], meta["training"]["momentum"]) == (4, 3, 0.5)
    assert meta["metrics"]["homogeneous"] is False


@pytest.mark.parametrize("recipe, summary", [("model", "recipe (n, lr, momentum, batch_size, epochs, order)"),
                                             ("model:-lr,-order", "recipe (n, momentum, batch_size, epochs; not: lr, order)")])
def test_dynamics_matching_runs_from_the_command_line_and_is_evaluated(resnet_dir, tmp_path, capsys, recipe,
                                                                       summary) -> None:
    run = tmp_path / "dyn"
    rc = main(["reconstruct", "--model", str(resnet_dir), "--method", "dynamics", "--known-init", "seed",
               "--known-recipe", recipe, "--init", "uniform", "--candidates", "6", "--steps", "3", "--no-progress",
               "--out", str(run)])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads((run / "run.json").read_text())
    assert meta["method"] == "dynamics" and meta["status"] == "complete" and meta["steps_done"] == 3
    assert summary in meta["knowledge"]["summary"] and "recipe" in meta["knowledge"]["used"]
    assert json.dumps(meta).count('"augmentation": "none"') >= 1
    assert main(["evaluate", str(run)]) == 0
    assert "training images reconstructed" in capsys.readouterr().out


def test_a_wrong_candidate_count_is_refused_before_any_work(resnet_dir, tmp_path, capsys) -> None:
    rc = main(["reconstruct", "--model", str(resnet_dir), "--method", "dynamics", "--known-init", "seed",
               "--known-recipe", "model", "--candidates", "5", "--no-progress", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and "pass --candidates 6" in err and len(err.strip().splitlines()) == 1
