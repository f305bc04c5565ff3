"""A new attack in one file: its config, its class and its registration live here, nowhere else.

The attack is model inversion (candidates the target classifies confidently as their label): its
only code is :meth:`objective`; the box prior, the finiteness rule, the optimiser, the state, the
checkpoint and the run record come from :class:`datarecon.attacks.base.Attack`. Registered in
``ATTACKS``, it runs through every path a built-in attack takes: ``datarecon reconstruct`` (one run
and ``--runs K``), a run file, a process killed mid-run and ``--resume`` d (bit for bit), and
``datarecon evaluate``. Its config counts its own validations: a run validates it once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from datarecon.attacks import ATTACKS
from datarecon.attacks.base import Attack, AttackConfig, AttackerPrior, Target
from datarecon.cli.main import main
from datarecon.kernel.engine import FAULT_STEP_ENV
from datarecon.utils.io import load_tensors

#: one entry per validation of an InversionConfig (the test reads how many a run made)
VALIDATIONS: list[int] = []


class InversionConfig(AttackConfig):
    """Model inversion: the default step's fields, with short defaults for the test."""

    steps: int = Field(default=30, ge=0, description="optimisation steps")
    lr_x: float = Field(default=0.05, gt=0, description="learning rate of the candidates x")
    dtype: Literal["float32", "float64"] = Field(default="float64", description="float32 | float64")

    @model_validator(mode="after")
    def _counted(self) -> InversionConfig:
        VALIDATIONS.append(1)
        return self


class InversionAttack(Attack):
    """min_x mean_i softplus(−y_i Φ(x_i; θ*)) (binary targets, labels ±1): candidates the model
    classifies confidently as their label (Fredrikson et al. 2015)."""

    name: ClassVar[str] = "inversion"
    config_cls: ClassVar[type[Any]] = InversionConfig
    divergence_hint: ClassVar[str] = "lower lr_x"

    def objective(self, target: Target, prior: AttackerPrior, x: torch.Tensor) -> dict[str, torch.Tensor]:
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean(), "margin": margin.mean()}


def register() -> None:
    """Make ``inversion`` a method (the subprocesses below call it before the command line)."""
    ATTACKS.register("inversion", InversionAttack, force=True)


@pytest.fixture
def plugin():
    register()
    yield
    ATTACKS.unregister("inversion")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plugin") / "model"
    assert main(["train", "--no-progress", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5",
                 "--hidden", "16", "--no-bias", "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "100",
                 "--dtype", "float64", "--out", str(out)]) == 0
    return out


def _reconstruct(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["reconstruct", "--no-progress", "--model", str(model_dir), "--method", "inversion", "--candidates", "6",
            "--steps", "30", "--checkpoint-every", "5", "--log-every", "5", "--out", str(out), *extra]


def _subprocess(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The command line in a fresh process that first registers the plug-in from this file."""
    script = (f"import runpy, sys; runpy.run_path({str(Path(__file__))!r})['register'](); "
              "from datarecon.cli.main import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _history(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "time" not in k} for row in rows]


def test_a_plugin_attack_runs_validated_once_and_evaluates(plugin, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    VALIDATIONS.clear()
    assert main(_reconstruct(model_dir, out, "--set", "box_weight=2")) == 0, capsys.readouterr().err
    assert len(VALIDATIONS) == 1  # the run's attack config is validated once, from the CLI to the attack
    meta = json.loads((out / "run.json").read_text())
    assert meta["method"] == "inversion" and meta["status"] == "complete" and meta["steps_done"] == 30
    assert meta["config"]["box_weight"] == 2.0 and meta["run"]["attack"]["method"] == "inversion"
    history = _history(out)
    assert [row["step"] for row in history] == [5, 10, 15, 20, 25, 30]
    assert {"loss", "margin", "box", "grad_norm_x"} <= set(history[-1])
    assert history[-1]["margin"] > history[0]["margin"]  # the objective it declared is what it optimised
    x = load_tensors(out / "candidates.safetensors")["x"]
    assert x.shape == (6, 1, 8, 8) and torch.isfinite(x).all()
    assert main(["evaluate", "--no-progress", str(out)]) == 0, capsys.readouterr().err
    assert (out / "metrics.json").is_file()


def test_a_plugin_attack_runs_from_a_run_file_and_as_a_batch(plugin, model_dir, tmp_path, capsys):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"model: {model_dir}\nattack: {{method: inversion, steps: 10, lr_x: 0.02}}\n"
                        "init: {name: uniform}\ncandidates: 4\nseed: 3\n")
    out = tmp_path / "from-file"
    VALIDATIONS.clear()
    assert main(["reconstruct", "--no-progress", "--config", str(run_file), "--out", str(out)]) == 0
    assert len(VALIDATIONS) == 1
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["lr_x"] == 0.02 and meta["seed"] == 3 and meta["steps_done"] == 10

    batch = tmp_path / "batch"
    VALIDATIONS.clear()
    assert main(_reconstruct(model_dir, batch, "--runs", "3")) == 0, capsys.readouterr().err
    assert len(VALIDATIONS) == 1  # K runs of one validated description
    seeds = [json.loads((batch / f"run{j}" / "run.json").read_text())["seed"] for j in range(3)]
    assert seeds == [0, 1, 2]
    assert json.loads((batch / "run.json").read_text())["method"] == "pool"
    assert main(["evaluate", "--no-progress", str(batch)]) == 0, capsys.readouterr().err
    # run j of the batch is the single run of seed j, bit for bit
    single = tmp_path / "single1"
    assert main(_reconstruct(model_dir, single, "--seed", "1")) == 0
    assert torch.equal(load_tensors(single / "candidates.safetensors")["x"],
                       load_tensors(batch / "run1" / "candidates.safetensors")["x"])


def test_a_plugin_attack_killed_mid_run_resumes_bit_for_bit(model_dir, tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "run"
    done = _subprocess(_reconstruct(model_dir, ref))
    assert done.returncode == 0, done.stderr[-2000:]
    killed = _subprocess(_reconstruct(model_dir, out), env={FAULT_STEP_ENV: "17:KILL"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    resumed = _subprocess(_reconstruct(model_dir, out, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = load_tensors(ref / "candidates.safetensors"), load_tensors(out / "candidates.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert _history(ref) == _history(out)
    assert json.loads((out / "run.json").read_text())["steps_done"] == 30
