"""`--early-stop-patience` stops every attack on the metric it declares (it did nothing for attacks without
``rel_residual``), and is refused for an attack that declares none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

from datarecon.attacks import ATTACKS
from datarecon.attacks.base import Attack
from datarecon.cli.main import main

TINY = ["--dataset", "digits", "--task", "odd-even", "--n-per-class", "3", "--no-progress"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("early")
    out = {"resnet": root / "resnet", "affine": root / "affine"}
    assert main(["train", *TINY, "--arch", "resnet8", "--channels", "2,3,3", "--no-bias", "--loss", "logistic",
                 "--lr", "0.05", "--batch-size", "6", "--epochs", "2", "--out", str(out["resnet"])]) == 0
    assert main(["train", *TINY, "--arch", "affine", "--loss", "logistic", "--weight-decay", "0.01", "--lr", "0.5",
                 "--epochs", "200", "--out", str(out["affine"])]) == 0
    return out


@pytest.mark.parametrize(("model", "flags"), [
    ("resnet", ["--method", "dynamics", "--known-init", "seed", "--known-recipe", "model", "--candidates", "6",
                "--init", "uniform", "--lr-x", "0.01"]),
    ("affine", ["--method", "bilevel", "--candidates", "6", "--init", "uniform"]),
], ids=["dynamics", "bilevel"])
def test_an_early_stop_ends_a_run_whatever_its_attack(models, tmp_path, model, flags) -> None:
    """A tolerance no step can meet (a relative gain of 90 % per step): the plateau is reached after the
    patience, and the run ends there, stopped early, far before its steps."""
    out = tmp_path / "run"
    assert main(["reconstruct", "--model", str(models[model]), *flags, "--steps", "200", "--early-stop-patience", "3",
                 "--early-stop-tol", "0.9", "--log-every", "1", "--no-progress", "--out", str(out)]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "stopped-early" and meta["steps_done"] < 20, meta["steps_done"]


class _NoMetric(Attack):
    """An attack that declares no metric for an early stop."""

    name: ClassVar[str] = "no-early-stop-metric"
    early_stop_metric: ClassVar[str | None] = None

    def objective(self, target, prior, x):  # pragma: no cover - never stepped
        return {"loss": (x * 0).sum()}


def test_an_early_stop_of_an_attack_without_a_metric_for_it_is_refused_in_one_line(models, tmp_path, capsys) -> None:
    ATTACKS.register(_NoMetric.name, _NoMetric, force=True)
    try:
        code = main(["reconstruct", "--model", str(models["affine"]), "--method", _NoMetric.name, "--candidates", "6",
                     "--steps", "5", "--early-stop-patience", "3", "--no-progress", "--out", str(tmp_path / "run")])
    finally:
        ATTACKS.unregister(_NoMetric.name)
    err = capsys.readouterr().err
    assert code == 2 and "declares no metric an early stop can watch" in err and err.count("\n") == 1
