"""Experiment files: train → attack → evaluate → report into one resumable folder, one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml

from datarecon.cli.main import main
from datarecon.errors import DataReconError
from datarecon.experiments import experiment
from datarecon.experiments.experiment import build_experiment, load_experiment, run_experiment

TINY = {
    "name": "tiny",
    "train": {"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 3, "n_heldout_per_class": 3},
              "arch": {"name": "mlp", "hidden": [16], "bias": False, "init_scale": 1e-3},
              "lr": 0.5, "epochs": 60, "dtype": "float64"},
    "attack": {"attack": {"method": "kkt", "steps": 4, "lr_x": 0.01}, "init": {"name": "gaussian", "scale": 0.05},
               "candidates": 6},
    "evaluate": {"against": ["train", "heldout", "noise"]},
    "report": {"title": "tiny"},
}


def _write(path, fields):
    path.write_text(yaml.safe_dump(fields))
    return path


def test_experiment_runs_every_stage_and_a_rerun_skips_them(tmp_path, capsys):
    path = _write(tmp_path / "exp.yaml", TINY)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    assert "train: complete, attack: complete, evaluate: complete, report: complete" in capsys.readouterr().out
    state = json.loads((out / "experiment.json").read_text())
    assert state["stages"] == {"train": "complete", "attack": "complete", "evaluate": "complete", "report": "complete"}
    run = json.loads((out / "run" / "run.json").read_text())
    assert run["model_dir"] == str((out / "model").resolve()) and run["m"] == 6 and run["steps_done"] == 4
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert (out / "report.html").is_file() and (out / "run" / "metrics.json").is_file()
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files  # nothing recomputed


def test_an_interrupted_experiment_resumes_at_its_stage(tmp_path, monkeypatch):
    exp = build_experiment(TINY)
    reference = tmp_path / "ref"
    run_experiment(exp, reference, progress=False)
    real = experiment.run_metrics

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "run_metrics", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, out, progress=False)
    stages = json.loads((out / "experiment.json").read_text())["stages"]
    assert stages == {"train": "complete", "attack": "complete", "evaluate": "running"}
    before = (out / "run" / "run.json").read_bytes()
    monkeypatch.setattr(experiment, "run_metrics", real)
    assert run_experiment(exp, out, progress=False)["report"] == "complete"
    assert (out / "run" / "run.json").read_bytes() == before  # the attack was not run again
    assert (out / "run" / "candidates.safetensors").read_bytes() == \
        (reference / "run" / "candidates.safetensors").read_bytes()
    metrics = [json.loads((d / "run" / "metrics.json").read_text()) for d in (out, reference)]
    assert metrics[0]["headline"] == metrics[1]["headline"] and metrics[0]["haim"] == metrics[1]["haim"]


def test_another_experiment_in_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    run_experiment(build_experiment({**TINY, "evaluate": None, "report": None}), out, progress=False)
    other = build_experiment({**TINY, "evaluate": None, "report": None, "attack": {"attack": {"steps": 5}}})
    with pytest.raises(DataReconError, match="holds another experiment .*use a new --out, or --overwrite"):
        run_experiment(other, out, progress=False)
    assert run_experiment(other, out, overwrite=True, progress=False)["attack"] == "complete"


@pytest.mark.parametrize("fields,message", [
    ({**TINY, "atack": {}}, "atack: unknown key (allowed keys: name, train, model, attack,"),
    ({**TINY, "train": {**TINY["train"], "epochs": "many"}}, "train.epochs: Input should be a valid integer"),
    ({**TINY, "attack": {"attack": {"method": "kkt", "lr_z": 1}}},
     "attack: invalid kkt config: lr_z: unknown key (allowed keys: steps, lr_x"),
    ({**TINY, "model": "somewhere"}, "give exactly one of train (a training config) and model"),
    ({**TINY, "evaluate": None}, "report needs the evaluate stage"),
], ids=["unknown-key", "wrong-type", "attack-key", "train-and-model", "report-without-evaluate"])
def test_bad_experiment_files_give_one_line_errors(tmp_path, capsys, fields, message):
    path = _write(tmp_path / "exp.yaml", fields)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_missing_data_and_model_give_one_line_errors(tmp_path, capsys):
    mnist = {**TINY, "train": {**TINY["train"], "data": {"dataset": "mnist", "task": "odd-even", "n_per_class": 2}}}
    path = _write(tmp_path / "exp.yaml", mnist)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "nowhere"),
                 "--no-progress"]) == 2
    assert "MNIST not found" in capsys.readouterr().err
    path = _write(tmp_path / "exp2.yaml", {**{k: v for k, v in TINY.items() if k != "train"},
                                           "model": str(tmp_path / "none")})
    assert main(["run", str(path), "--out", str(tmp_path / "out2"), "--no-progress"]) == 2
    assert "model directory" in capsys.readouterr().err and not (tmp_path / "out2").exists()
    with pytest.raises(DataReconError, match="not found"):
        load_experiment(tmp_path / "absent.yaml")
