"""No membership option silently does nothing (issue 49): every option of ``datarecon membership`` that depends on
another either changes what the call measures or is refused in one line (exit 2) naming the option and the one it
needs.

The rows are generated from the flags of the evaluation's settings (``SETTINGS_FLAGS``) and from what acts on
reference models only (``REFERENCE_ONLY``: those settings, ``--recipe``, the backend options) or on an evaluation
only (``EVALUATION_ONLY``): with ``--references 0`` each reference-only option is refused, the others change the
result; with ``--images`` each evaluation-only option is refused, and so are the reference attacks' settings without
the membership folder whose reference models they would read. ``audit --model``'s reference options are refused the
same way (a budget with a fixed count, either without ``--model``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from datarecon.cli.main import main
from datarecon.cli.membership import SETTINGS_FLAGS
from datarecon.experiments.membership.settings import EVALUATION_ONLY, REFERENCE_ONLY

#: a value for each flag that differs from its default (a boolean: its --no- form)
VALUES = {"nonmembers": "30", "population": "20", "calibration_fraction": "0.5", "seed": "1",
          "references.count": "auto", "references.budget_minutes": "1", "references.seed": "2",
          "references.keep_weights": None, "attacks.variance_prior": "2", "attacks.rmia_a": "0.5",
          "attacks.rmia_gamma": "2"}
#: the needed option each refusal names
NEEDS = {"references0": "--references K", "images": "--evaluate", "images-no-out": "--out"}


def _argv(path: str) -> list[str]:
    flag = next(f for f in SETTINGS_FLAGS if f.path == path)
    names = flag.decls[0].split("/")
    return [names[-1]] if VALUES[path] is None else [names[0], VALUES[path]]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("options") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "8",
                 "--no-bias", "--epochs", "20", "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "mine.npz"
    np.savez(path, x=np.zeros((2, 1, 8, 8)))
    return path


def test_every_setting_is_classified() -> None:
    """A new membership setting fails here until it has a row (a value, and whether it needs reference models)."""
    assert {f.path for f in SETTINGS_FLAGS} == set(VALUES)
    assert set(EVALUATION_ONLY) <= set(VALUES) and set(REFERENCE_ONLY) - {"recipe", "execution"} <= set(VALUES)


def _refused(argv: list[str], capsys, flag: str, needs: str) -> None:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (argv, err)
    assert flag in err[0] and needs in err[0], err[0]


ROWS = [(path, "references0") for path in VALUES if path in REFERENCE_ONLY] + \
       [(path, "images") for path in EVALUATION_ONLY] + \
       [(path, "images-no-out") for path in VALUES if path.startswith("attacks.")]


@pytest.mark.parametrize(("path", "context"), ROWS, ids=[f"{c}-{p}" for p, c in ROWS])
def test_an_option_that_would_do_nothing_is_refused(path: str, context: str, model: Path, images: Path,
                                                    capsys) -> None:
    base = (["membership", "--model", str(model), "--evaluate", "--references", "0", "--nonmembers", "40"]
            if context == "references0" else ["membership", "--model", str(model), "--images", str(images)])
    argv = _argv(path)
    if path == "references.budget_minutes" and context == "references0":
        needs = "--references auto"  # the budget sets how many auto trains
    else:
        needs = NEEDS[context]
    _refused([*base, *argv], capsys, argv[0], needs)


@pytest.mark.parametrize(("argv", "needs"), [
    (["--recipe", "pkg.mod:train"], "--references K"),
    (["--workers", "2"], "--references K"),
    (["--backend", "ray"], "--references K"),
])
def test_reference_model_tasks_and_recipe_with_no_reference_models_are_refused(argv, needs, model, capsys) -> None:
    """--recipe (a user's model) and where reference-model tasks run act on reference models only."""
    base = ["membership", "--model", str(model), "--evaluate", "--references", "0", "--nonmembers", "40"]
    if argv[0] == "--recipe":  # a user's model: its examples and weights are checked after the options
        base = ["membership", "--model", "pkg.mod:net", "--weights", "w.safetensors", "--evaluate", "--references",
                "0"]
    _refused([*base, *argv], capsys, argv[0], needs)


def test_keep_weights_without_a_folder_is_refused(model: Path, capsys) -> None:
    """With --references auto and no --out the reference models are deleted after the call: which weights are kept
    means nothing."""
    _refused(["membership", "--model", str(model), "--evaluate", "--no-reference-keep-weights"], capsys,
             "--no-reference-keep-weights", "--out")


@pytest.mark.parametrize("path", [p for p in VALUES if p not in REFERENCE_ONLY])
def test_an_option_that_acts_without_reference_models_changes_the_result(path: str, model: Path, tmp_path: Path,
                                                                         capsys) -> None:
    """With --references 0 the options that are not refused change what is measured (the draws, the split, or
    --references auto: reference models, or the line of their cost)."""
    base = ["membership", "--model", str(model), "--evaluate", "--references", "0", "--nonmembers", "40",
            "--population", "10", "--no-progress"]
    results = []
    for extra, out in (([], tmp_path / "a"), (_argv(path), tmp_path / "b")):
        argv = [*base, *extra]
        if path == "references.count":
            argv = [*argv[:argv.index("--references")], *argv[argv.index("--references") + 2:], "--budget-minutes",
                    "0.01"]
        assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
        record = json.loads((out / "membership.json").read_text())
        results.append({k: v for k, v in record.items() if k != "wall_time_s"})
    capsys.readouterr()
    assert results[0] != results[1]


@pytest.mark.parametrize(("argv", "needs"), [
    (["--references", "4", "--budget-minutes", "1"], "--references auto"),
    (["--references", "0", "--budget-minutes", "1"], "--references auto"),
])
def test_audit_reference_options_that_would_do_nothing_are_refused(argv, needs, model, tmp_path, capsys) -> None:
    _refused(["audit", "--model", str(model), *argv, "--out", str(tmp_path / "a")], capsys, "--budget-minutes", needs)
    _refused(["audit", "--scale", "smoke", *argv[:2], "--out", str(tmp_path / "b")], capsys, argv[0], "--model")
