"""``reconstruct --runs auto --budget-minutes B``: K from the measured cost of run 0, recorded in run.json, pooled;
a resumed folder keeps its K; bad combinations are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from datarecon.cli.main import main
from datarecon.experiments.reconstruct import budget, build_run, measured_cost, runs_for_budget
from datarecon.errors import DataReconError
from datarecon.utils.io import load_tensors


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("auto") / "model"
    train_target(TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=4, n_heldout_per_class=0),
                             arch=ArchConfig(name="mlp", hidden=(16,), bias=False, init_scale=1e-3), lr=0.5,
                             epochs=200, dtype="float64"), out=out, progress=False)
    return out


def _args(model_dir, out, *extra):
    return ["reconstruct", "--no-progress", "--model", str(model_dir), "--candidates", "4", "--steps", "12",
            "--lr-x", "0.01", "--init-scale", "0.05", "--out", str(out), *extra]


def _fixed_cost(seconds_per_run: float):
    return lambda run, **_: {"prepare_seconds": 0.0, "probe_seconds": 0.0, "measured_steps": 12,
                             "seconds_per_step": seconds_per_run / run.steps, "seconds_per_run": seconds_per_run}


def test_k_is_the_budget_over_the_measured_cost_recorded_and_pooled(model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(budget, "measured_cost", _fixed_cost(20.0))  # planted: 20 s a run, so 1 minute holds 3
    assert main(_args(model_dir, tmp_path / "o", "--runs", "auto", "--budget-minutes", "1")) == 0
    err = capsys.readouterr().err
    assert "--runs auto: 3 runs in --budget-minutes 1" in err
    pool = json.loads((tmp_path / "o" / "run.json").read_text())
    assert pool["runs_auto"]["runs"] == 3 and pool["runs_auto"]["budget_minutes"] == 1.0
    assert pool["runs_auto"]["estimate_minutes"] == pytest.approx(1.0) and pool["batch"]["runs"] == 3
    for j in range(3):
        rj = json.loads((tmp_path / "o" / f"run{j}" / "run.json").read_text())
        assert rj["seed"] == j and rj["runs_auto"] == pool["runs_auto"] and rj["status"] == "complete"
    assert not (tmp_path / "o" / "run3").exists()
    # the same K given by hand is the same runs, bit for bit
    assert main(_args(model_dir, tmp_path / "k", "--runs", "3")) == 0
    for j in range(3):
        ta = load_tensors(tmp_path / "o" / f"run{j}" / "candidates.safetensors")
        tb = load_tensors(tmp_path / "k" / f"run{j}" / "candidates.safetensors")
        assert all(torch.equal(ta[key], tb[key]) for key in ta)


def test_a_resumed_auto_folder_keeps_its_k_and_its_budget(model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(budget, "measured_cost", _fixed_cost(30.0))
    assert main(_args(model_dir, tmp_path / "o", "--runs", "auto", "--budget-minutes", "1")) == 0
    first = json.loads((tmp_path / "o" / "run.json").read_text())["runs_auto"]
    monkeypatch.setattr(budget, "measured_cost", _fixed_cost(1.0))  # a faster machine now: not measured again
    assert main(_args(model_dir, tmp_path / "o", "--runs", "auto", "--budget-minutes", "1", "--resume")) == 0
    assert json.loads((tmp_path / "o" / "run.json").read_text())["runs_auto"] == first and first["runs"] == 2
    capsys.readouterr()
    assert main(_args(model_dir, tmp_path / "o", "--runs", "auto", "--budget-minutes", "2", "--resume")) == 2
    assert "holds runs chosen for --budget-minutes 1.0, not 2" in capsys.readouterr().err


def test_the_measurement_is_of_this_run_and_a_tiny_budget_fits_no_run(model_dir, tmp_path, capsys):
    run = build_run({"model": str(model_dir), "candidates": 4, "attack": {"method": "kkt", "steps": 12}})
    cost = measured_cost(run)
    assert cost["measured_steps"] == 12 and cost["seconds_per_step"] > 0
    assert cost["seconds_per_run"] == pytest.approx(cost["prepare_seconds"] + cost["probe_seconds"]
                                                    + 12 * cost["seconds_per_step"])
    assert main(_args(model_dir, tmp_path / "o", "--runs", "auto", "--budget-minutes", "1e-9")) == 2
    err = capsys.readouterr().err
    assert "error: --budget-minutes 1e-09 fits no run: one run of 12 steps was measured at about" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o" / "run0").exists()  # measured, nothing written


def test_the_count_is_capped_and_checked() -> None:
    assert runs_for_budget(10.0, 60.0, steps=5) == 10
    assert runs_for_budget(1e9, 1e-3, steps=5) == budget.MAX_BATCH_RUNS
    with pytest.raises(DataReconError, match="must be a positive number of minutes"):
        runs_for_budget(0.0, 1.0, steps=5)


@pytest.mark.parametrize("args,message", [
    (["--runs", "auto"], "--runs auto picks K from a time budget; pass --budget-minutes MINUTES"),
    (["--runs", "3", "--budget-minutes", "5"], "--budget-minutes applies to --runs auto"),
    (["--budget-minutes", "5"], "--budget-minutes applies to --runs auto"),
    (["--runs", "many"], "--runs takes a count K >= 1 or auto, got 'many'"),
    (["--runs", "auto", "--budget-minutes", "-1"], "--budget-minutes must be a positive number of minutes, got -1"),
    (["--runs", "auto", "--budget-minutes", "5", "--group-weight", "0.1", "--method", "dynamics"],
     "--runs auto times one run alone, but group consistency couples the runs"),
], ids=["no-budget", "budget-with-k", "budget-alone", "not-a-count", "negative", "coupled"])
def test_bad_combinations_are_one_line(model_dir, tmp_path, capsys, args, message):
    rc = main(["reconstruct", "--no-progress", "--model", str(model_dir), "--candidates", "4", "--steps", "2",
               "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
