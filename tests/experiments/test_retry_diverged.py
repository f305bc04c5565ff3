"""A run that diverges says which step sizes did and, with ``retry_diverged``, starts again at smaller ones: the
retry is the run started at those step sizes, bit for bit, whether it comes in the same call, on ``--resume`` or
for one run of ``--runs K``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from datarecon.cli.main import main
from datarecon.experiments.reconstruct import RunOptions, build_run, execute
from datarecon.utils.io import load_tensors

#: planted: at these step sizes the KKT attack on the model below diverges within a few dozen steps (after a
#: probe of 5 steps passed), a tenth of them runs to the end
DIVERGING = {"lr_x": 1.0, "lr_lambda": 0.1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from datarecon.data import DataSpec
    from datarecon.training.target import ArchConfig, TrainConfig, train_target

    out = tmp_path_factory.mktemp("retry") / "model"
    train_target(TrainConfig(data=DataSpec(dataset="digits", task="odd-even", n_per_class=4, n_heldout_per_class=0),
                             arch=ArchConfig(name="mlp", hidden=(16,), bias=False, init_scale=1e-3), lr=0.5,
                             epochs=200, dtype="float64"), out=out, progress=False)
    return out


def _run(model_dir: Path, *, retry: int, scale: float = 1.0):
    return build_run({"model": str(model_dir), "step_probe": 5, "retry_diverged": retry,
                      "attack": {"method": "kkt", "steps": 80, "dtype": "float64", "lambda_min": 0.1,
                                 **{k: v * scale for k, v in DIVERGING.items()}},
                      "init": {"name": "gaussian", "scale": 0.05}, "checkpoint": {"every": 20}})


def _same(a: Path, b: Path) -> None:
    ta, tb = load_tensors(a / "candidates.safetensors"), load_tensors(b / "candidates.safetensors")
    assert set(ta) == set(tb)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_a_diverging_run_names_its_step_sizes_and_a_retry_is_the_run_at_a_tenth_of_them(model_dir, tmp_path):
    quiet = RunOptions(progress=False)
    with pytest.warns(RuntimeWarning, match=r"kkt diverged at step \d+ \(.*\) with lr_x 1, lr_lambda 0.1"):
        alone = execute(_run(model_dir, retry=0), tmp_path / "alone", quiet)
    assert alone.status == "diverged" and alone.steps_done > 5  # after the probe: the retry's case
    with pytest.warns(UserWarning, match=r"retrying from the start with every step size x0\.1 \(retry 1 of 2\)"):
        retried = execute(_run(model_dir, retry=2), tmp_path / "retried", quiet)
    direct = execute(_run(model_dir, retry=0, scale=0.1), tmp_path / "direct", quiet)
    assert retried.status == direct.status == "complete"
    _same(tmp_path / "retried", tmp_path / "direct")
    record = json.loads((tmp_path / "retried" / "run.json").read_text())["retry_diverged"]
    assert record["scale"] == pytest.approx(0.1)
    assert record["tried"] == [{"scale": 1.0, "diverged_at": alone.steps_done, "step_sizes": DIVERGING}]


def test_a_diverged_run_is_retried_on_resume_and_a_retried_run_resumes_at_its_retry(model_dir, tmp_path, kill_after):
    quiet = RunOptions(progress=False)
    with pytest.warns(RuntimeWarning):
        execute(_run(model_dir, retry=0), tmp_path / "run", quiet)
    with pytest.warns(UserWarning, match="retry 1 of 1"):
        resumed = execute(_run(model_dir, retry=1), tmp_path / "run", RunOptions(progress=False, resume=True))
    execute(_run(model_dir, retry=0, scale=0.1), tmp_path / "direct", quiet)
    assert resumed.status == "complete"
    _same(tmp_path / "run", tmp_path / "direct")
    # killed during its retry, resumed: it continues at the retry's step sizes
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="retry 1 of 1"):
        execute(_run(model_dir, retry=1), tmp_path / "killed", RunOptions(progress=False, hooks=(kill_after(50),)))
    again = execute(_run(model_dir, retry=1), tmp_path / "killed", RunOptions(progress=False, resume=True))
    assert again.status == "complete"
    _same(tmp_path / "killed", tmp_path / "direct")


def test_one_of_k_runs_that_diverges_is_retried_alone_and_pooled(model_dir, tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["reconstruct", "--model", str(model_dir), "--method", "kkt", "--steps", "80", "--dtype", "float64",
            "--lambda-min", "0.1", "--lr-x", str(DIVERGING["lr_x"]), "--lr-lambda", str(DIVERGING["lr_lambda"]),
            "--init-scale", "0.05", "--step-probe", "5", "--runs", "2", "--no-progress", "--out"]
    assert main([*args, str(out), "--retry-diverged", "1"]) == 0
    for j in range(2):
        rj = json.loads((out / f"run{j}" / "run.json").read_text())
        assert rj["status"] == "complete" and rj["retry_diverged"]["tried"][0]["step_sizes"] == DIVERGING
    pool = json.loads((out / "run.json").read_text())
    assert pool["method"] == "pool" and len(pool["config"]["sources"]) == 2
    capsys.readouterr()
    assert main([*args, str(tmp_path / "no-retry")]) == 2  # none finishes without retries: one line says so
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: none of the 2 kkt runs finished")
