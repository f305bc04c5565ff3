"""Sweeps on the local backend: a tiny KKT sweep on 8x8 digits, resume, crash retry, failures,
pooling and the CLI."""

from __future__ import annotations

import json
import shutil
import re
from pathlib import Path

import pytest
import torch

from datarecon.cli.main import main
from datarecon.experiments.execution import Execution
from datarecon.experiments.store import Store
from datarecon.experiments.sweep import SweepConfig, pool_candidates, run_sweep
from datarecon.experiments.sweep.driver import FAULTS_ENV
from datarecon.utils.io import load_tensors, read_json

SEARCH = {
    "grid": {"attack.momentum": [0.0, 0.9]},
    "random": {"init.scale": {"dist": "log-uniform", "low": 1e-4, "high": 0.1},
               "attack.lr_x": {"dist": "log-uniform", "low": 1e-3, "high": 1.0}},
    "samples": 2,
}


def train_tiny(out: Path) -> Path:
    """A 64-16-1 bias-free ReLU MLP on 10 digits (odd vs even), trained in well under a second."""
    from datarecon.training.target import build_train_config, train_target

    cfg = build_train_config({"data": {"dataset": "digits", "task": "odd-even", "n_per_class": 5},
                              "arch": {"name": "mlp", "hidden": [16], "bias": False},
                              "lr": 0.5, "epochs": 200, "seed": 0})
    train_target(cfg, out=out, overwrite=True, progress=False)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("model") / "digits-tiny")


def tiny_config(model_dir: Path, **kw) -> SweepConfig:
    fields = {"model_dir": str(model_dir), "method": "kkt", "steps": 20, "candidates": 8,
              "attack": {"lr_lambda": 1e-3}, "search": SEARCH, **kw}
    return SweepConfig(**fields)


def finals(store: Path) -> dict[str, dict]:
    return {r["key"]: r["final"] for r in Store(store).rows() if r["kind"] == "run"}


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """The tiny sweep run in-process (workers=1): the results every other backend must match."""
    out = tmp_path_factory.mktemp("ref") / "store"
    result = run_sweep(tiny_config(model_dir), out, execution=Execution(workers=1), progress=False)
    return out, result


def test_local_sweep_runs_indexes_and_resumes(reference, model_dir):
    out, result = reference
    assert (result.total, result.completed, result.failed, result.skipped) == (4, 4, 0, 0)
    rows = Store(out).rows(sort="selection.relative_residual.value")
    assert len(rows) == 4 and all(r["status"] == "complete" and r["steps_done"] == 20 for r in rows)
    assert rows[0]["key"] == result.best_key
    assert rows[0]["selection"]["relative_residual"]["value"] == pytest.approx(result.best_score)
    for r in rows:  # run-directory contract
        run_dir = out / r["run_dir"]
        run = read_json(run_dir / "run.json")
        assert run["method"] == "kkt" and run["status"] == "complete" and run["seed"] == 0
        assert run["config"]["lr_x"] == r["params"]["attack.lr_x"]
        x = load_tensors(run_dir / "candidates.safetensors")["x"]
        assert tuple(x.shape) == (8, 1, 8, 8)
    again = run_sweep(tiny_config(model_dir), out, execution=Execution(workers=1), progress=False)
    assert (again.skipped, again.completed) == (4, 0)
    assert again.best_key == result.best_key


def test_resume_reruns_only_unfinished(reference, model_dir, tmp_path):
    ref, _ = reference
    out = tmp_path / "store"
    shutil.copytree(ref, out)
    victim = Store(out).rows()[0]
    shutil.rmtree(out / victim["run_dir"])
    result = run_sweep(tiny_config(model_dir), out, execution=Execution(workers=1), progress=False)
    assert (result.skipped, result.completed) == (3, 1)
    assert finals(out) == finals(ref)


@pytest.mark.slow
def test_killed_worker_is_retried_and_store_stays_consistent(reference, model_dir, tmp_path, monkeypatch):
    ref, _ = reference
    out = tmp_path / "store"
    # run index 1 kills its worker process (os._exit) after step 5 on its first attempt
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"1": {"attempts": 1, "at_step": 5}}))
    result = run_sweep(tiny_config(model_dir), out, execution=Execution(workers=2), progress=False, checkpoint_every=2)
    assert (result.completed, result.failed, result.retries) == (4, 0, 1)
    rows = {r["key"]: r for r in Store(out).rows()}
    assert sorted(r["attempts"] for r in rows.values()) == [1, 1, 1, 2]
    assert finals(out) == finals(ref)  # resumed from its checkpoint: same numbers as uninterrupted
    before = Store(out).rows()
    (out / "index.sqlite").unlink()
    for suffix in ("-wal", "-shm"):
        (out / f"index.sqlite{suffix}").unlink(missing_ok=True)
    assert Store(out).rebuild() == 4
    assert _strip(Store(out).rows()) == _strip(before)


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "updated"} for r in rows]


@pytest.mark.slow
def test_run_failing_every_attempt_is_recorded_and_sweep_finishes(model_dir, tmp_path, monkeypatch):
    out = tmp_path / "store"
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"0": {"attempts": 9, "at_step": 1}}))
    cfg = tiny_config(model_dir, max_retries=1, search={**SEARCH, "samples": 1})
    result = run_sweep(cfg, out, execution=Execution(workers=2), progress=False)
    assert (result.total, result.completed, result.failed, result.retries) == (2, 1, 1, 1)
    failed = Store(out).rows(status="failed")
    assert len(failed) == 1 and failed[0]["attempts"] == 2 and "worker process died" in failed[0]["error"]
    monkeypatch.delenv(FAULTS_ENV)
    again = run_sweep(cfg, out, execution=Execution(workers=1), progress=False)  # resume: only the failed run runs again
    assert (again.skipped, again.completed, again.failed) == (1, 1, 0)
    assert not Store(out).rows(status="failed")


def test_bad_attack_field_is_refused_before_running(model_dir, tmp_path):
    from datarecon.errors import DataReconError

    cfg = tiny_config(model_dir, search={"grid": {"attack.lr_xx": [0.1]}})
    with pytest.raises(DataReconError, match="lr_xx"):
        run_sweep(cfg, tmp_path / "s", progress=False)
    assert not (tmp_path / "s" / "runs").exists()


def test_pool_best_runs_by_attacker_criterion(reference, tmp_path):
    ref, result = reference
    out = tmp_path / "store"
    shutil.copytree(ref, out)
    pool = pool_candidates(out, top=2)
    run = read_json(pool / "run.json")
    ranked = [r["key"] for r in Store(out).rows(sort="selection.relative_residual.value") if r["kind"] == "run"]
    assert run["method"] == "pool" and run["status"] == "complete" and run["config"]["sources"] == ranked[:2]
    t = load_tensors(pool / "candidates.safetensors")
    first = load_tensors(out / "runs" / ranked[0] / "candidates.safetensors")
    assert t["x"].shape[0] == 16 and torch.equal(t["x"][:8], first["x"])
    assert torch.equal(t["source"], torch.tensor([0] * 8 + [1] * 8))
    assert {"labels", "multipliers", "score_lambda"} <= set(t)
    assert any(r["kind"] == "pool" for r in Store(out).rows())


def test_cli_sweep_pool_store(model_dir, tmp_path, capsys):
    cfg = tmp_path / "sweep.json.yaml"
    cfg.write_text(json.dumps({"model_dir": str(model_dir), "steps": 10, "candidates": 4,
                               "search": {"grid": {"init.scale": [1e-3, 1e-2]}}}))
    out = tmp_path / "store"
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert "2 runs: 2 done now" in capsys.readouterr().out
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert "2 already finished" in capsys.readouterr().out
    assert main(["sweep", "pool", str(out), "--top", "1"]) == 0
    assert "pooled run" in capsys.readouterr().out
    assert main(["store", "list", str(out), "--sort", "relative_residual", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "selection.relative_residual.value" in lines[0]
    assert main(["store", "export", str(out), "--out", str(tmp_path / "runs.csv")]) == 0
    header = (tmp_path / "runs.csv").read_text().splitlines()[0]
    assert "params.init.scale" in header and "selection.relative_residual.value" in header
    assert main(["store", "rebuild", str(out)]) == 0
    assert "indexed 3 runs" in capsys.readouterr().out
    # pooled evaluation straight from the sweep directory (evaluation is where ground truth enters)
    assert main(["evaluate", "--sweep", str(out), "--top", "2", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "wrote metrics.json" in printed
    pooled = json.loads(next(out.glob("pools/*/metrics.json")).read_text())
    assert pooled["run"]["method"] == "pool"
    assert main(["sweep", "--out", str(out)]) == 2
    assert main(["store", "list", str(out), "--sort", "nope.x"]) == 2
    assert "unknown sort column" in capsys.readouterr().err


def test_sweep_progress_uses_the_loops_progress_lines(model_dir, tmp_path, capsys):
    """In a log (stderr not a terminal) the sweep writes the same plain lines as every loop: runs done out
    of the total, the best attacker-side score so far and the failures; a rerun says where it resumed."""
    out = tmp_path / "store"
    run_sweep(tiny_config(model_dir), out, execution=Execution(workers=1), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    last = [line for line in err.splitlines() if line.startswith("sweep: ")][-1]
    assert re.match(r"sweep: done run 4/4 in \d+:\d\d:\d\d \([\d.]+ run/s\), best relative_residual [\d.e-]+ "
                    r"failed 0$", last), last
    run_sweep(tiny_config(model_dir), out, execution=Execution(workers=1), progress=True)
    assert "sweep: resumed at run 4/4" in capsys.readouterr().err
