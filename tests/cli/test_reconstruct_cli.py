"""``datarecon reconstruct`` in-process: run directory, data-dependent inits, resume, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from datarecon.cli.main import main
from datarecon.utils.io import load_tensors


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A digits odd/even bias-free MLP trained briefly and saved as a model directory."""
    from datarecon.data import DataSpec, load_task
    from datarecon.models.checkpoint import ModelDescription, TrainingRecord, save_model_dir
    from datarecon.models.spec import ArchSpec, build_model
    from datarecon.training import fit
    from datarecon.training.fit import FitRecipe

    spec = DataSpec(dataset="digits", task="odd-even", n_per_class=5, n_partition_per_class=5, n_heldout_per_class=0)
    task = load_task(spec)
    arch = ArchSpec(name="mlp", input_shape=(1, 8, 8), hidden=(32,), bias=False, init_scale=1e-3)
    model = build_model(arch, generator=torch.Generator().manual_seed(0))
    fit(model, task.normalisation.to_model(task.train.x), task.train.y,
        recipe=FitRecipe(loss="logistic", lr=0.5, epochs=300))
    out = tmp_path_factory.mktemp("model")
    save_model_dir(out, model=model, description=ModelDescription(
        arch=arch, loss="logistic", weight_decay=0.0, data=spec.model_dump(mode="json"),
        normalisation=spec.normalisation, training={}, seed=0,
    ), record=TrainingRecord(input_mean=task.normalisation.mean,
                             indices={"train": task.train.indices, "partition": task.partition.indices}))
    return out


def _run(args):
    return main(["reconstruct", "--no-progress", *args])


def test_kkt_run_writes_the_run_directory(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = _run(["--model", str(model_dir), "--method", "kkt", "--init", "gaussian", "--init-scale", "0.05",
               "--candidates", "8", "--steps", "6", "--lr-x", "0.01", "--lambda-min", "0.2", "--out", str(out),
               "--set", "box_weight=2", "--log-every", "2"])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads((out / "run.json").read_text())
    assert meta["method"] == "kkt" and meta["status"] == "complete" and meta["steps_done"] == 6
    assert meta["config"]["box_weight"] == 2.0 and meta["config"]["lambda_min"] == 0.2
    assert meta["init"] == {"name": "gaussian", "params": {"scale": 0.05}, "experimenter_choice": False}
    t = load_tensors(out / "candidates.safetensors")
    assert t["x"].shape == (8, 1, 8, 8) and t["labels"].tolist() == [1, 1, 1, 1, -1, -1, -1, -1]
    assert "score_margin" in t
    assert "kkt: complete after 6 steps" in capsys.readouterr().out
    # existing --out is refused without --overwrite; --resume extends the run
    assert _run(["--model", str(model_dir), "--candidates", "8", "--steps", "6", "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    rc = _run(["--model", str(model_dir), "--method", "kkt", "--init", "gaussian", "--init-scale", "0.05",
               "--candidates", "8", "--steps", "8", "--lr-x", "0.01", "--lambda-min", "0.2", "--out", str(out),
               "--set", "box_weight=2", "--resume"])
    assert rc == 0 and json.loads((out / "run.json").read_text())["steps_done"] == 8


def test_ground_truth_init_uses_data_labels(model_dir, tmp_path, capsys):
    out = tmp_path / "gt"
    rc = _run(["--model", str(model_dir), "--method", "gradnorm", "--init", "ground-truth", "--steps", "2",
               "--out", str(out), "--dtype", "float32"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "initialisation (experimenter's choice)" in err
    meta = json.loads((out / "run.json").read_text())
    assert meta["m"] == 10 and meta["init"]["experimenter_choice"] is True and meta["config"]["dtype"] == "float32"
    from datarecon.data import DataSpec, load_task

    task = load_task(DataSpec(dataset="digits", task="odd-even", n_per_class=5, n_partition_per_class=5,
                              n_heldout_per_class=0))
    assert load_tensors(out / "candidates.safetensors")["labels"].tolist() == task.train.y.tolist()


@pytest.mark.parametrize("args,message", [
    (["--method", "nope"], "unknown attack method 'nope'; valid names: "),
    (["--init", "zeros"], "unknown initialisation 'zeros'; valid names: gaussian, ground-truth, mix, partition, uniform"),
    (["--candidates", "0"], "candidate count must be at least 1"),
    (["--method", "gradnorm", "--lambda-min", "0.3"], "option --lambda-min does not apply to method 'gradnorm'"),
    (["--set", "lr_x=-1"], "invalid kkt config: lr_x"),
    (["--set", "bogus=1"], "invalid kkt config: bogus"),
    (["--init", "uniform", "--mix-l1", "0.5"], "--mix-l1 applies to mix inits"),
    (["--init", "ground-truth", "--candidates", "4"], "4 candidates but 10 ground-truth images"),
    (["--formulation", "multiclass"], "needs a multi-output model"),
], ids=["method", "init", "m0", "option", "value", "field", "mix-option", "count", "formulation"])
def test_one_line_errors(model_dir, tmp_path, capsys, args, message):
    rc = _run(["--model", str(model_dir), "--out", str(tmp_path / "r"), "--steps", "1", *args])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # an init may print an info line first
    assert rc == 2 and err.startswith("error: ") and message in err, err


def test_missing_model_dir(tmp_path, capsys):
    assert _run(["--model", str(tmp_path / "none"), "--out", str(tmp_path / "r")]) == 2
    assert "model directory" in capsys.readouterr().err


def test_resuming_a_finished_run_reports_and_keeps_its_final_loss(model_dir, tmp_path, capsys):
    args = ["--model", str(model_dir), "--candidates", "8", "--steps", "4", "--out", str(tmp_path / "r")]
    assert _run(args) == 0
    first_line = capsys.readouterr().out
    before = (tmp_path / "r" / "run.json").read_bytes()
    assert _run([*args, "--resume"]) == 0
    again = capsys.readouterr().out
    assert "loss nan" not in again and again == first_line
    assert (tmp_path / "r" / "run.json").read_bytes() == before


@pytest.mark.parametrize("mode", ["batched", "looped", None])
def test_runs_are_the_single_runs_of_their_seeds(model_dir, tmp_path, capsys, mode):
    """--runs 3: run j is the run `reconstruct --seed j` makes alone (looped, and the default on CPU:
    bit for bit; batched: to float64 rounding), in an ordinary run directory OUT/run<j>."""
    common = ["--model", str(model_dir), "--method", "decoreco", "--init", "gaussian", "--init-scale", "0.05",
              "--candidates", "8", "--steps", "30", "--dtype", "float64", "--lr-x", "0.01", "--lambda-min", "0.2"]
    chosen = [] if mode is None else ["--batch-mode", mode]
    mode = mode or "looped"  # --batch-mode auto: looped on CPU
    assert _run([*common, "--runs", "3", *chosen, "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert all(f"decoreco run {j}: complete after 30 steps" in out for j in range(3))
    for j in range(3):
        assert _run([*common, "--seed", str(j), "--out", str(tmp_path / f"alone{j}")]) == 0
        a = load_tensors(tmp_path / f"alone{j}" / "candidates.safetensors")
        b = load_tensors(tmp_path / "runs" / f"run{j}" / "candidates.safetensors")
        if mode == "looped":
            assert torch.equal(a["x"], b["x"]) and torch.equal(a["multipliers"], b["multipliers"])
        else:
            torch.testing.assert_close(b["x"], a["x"], rtol=1e-12, atol=1e-12)
        meta = json.loads((tmp_path / "runs" / f"run{j}" / "run.json").read_text())
        assert meta["seed"] == j and meta["batch"] == {"runs": 3, "index": j, "mode": mode}
    # rerun: each run directory is refused without --overwrite / --resume, resumed with --resume
    assert _run([*common, "--runs", "3", "--out", str(tmp_path / "runs")]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert _run([*common, "--runs", "3", "--resume", "--out", str(tmp_path / "runs")]) == 0


@pytest.mark.parametrize("args,message", [
    (["--runs", "0"], "--runs must be at least 1, got 0"),
    (["--runs", "2", "--batch-mode", "fast"], "unknown batch mode 'fast'; valid modes: auto, batched, looped"),
], ids=["zero-runs", "bad-mode"])
def test_runs_misuse_is_one_line(model_dir, tmp_path, capsys, args, message):
    rc = _run(["--model", str(model_dir), "--candidates", "4", "--steps", "2", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
