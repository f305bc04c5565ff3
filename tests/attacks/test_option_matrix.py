"""No attack option silently does nothing (issue 49): every registered attack (the built-in ones and a plug-in
defined here) × every attack option either changes what runs (a metric, the candidates, the run's record) or is
refused in one line (exit 2) that names the option or the one it needs.

The options are generated from what declares them: the fields of ``AttackConfig`` (every attack has them), the
weight field of every prior (``PRIORS``), the fields of the run's early stop, its step-size probe and retry and the
attacker's knowledge (``RunSettings``, ``EarlyStopSettings``, ``KnowledgeSettings``), and the KKT family's subspace
candidates; :func:`test_the_matrix_covers_every_declared_option` fails on a new one until it has a row. Each option is
tried where it can act (the group prior with ``--runs 2`` batched, the feature statistics on a batch-norm target, the
probe and the retry with step sizes that diverge) and compared with the same run without it. Attack-specific fields
(bilevel's line search, the KKT family's splitting) are not rows here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F

from datarecon.attacks import ATTACKS
from datarecon.attacks.base import Attack, AttackConfig
from datarecon.attacks.priors import PRIORS
from datarecon.cli.main import main
from datarecon.experiments.reconstruct import EarlyStopSettings, RunSettings
from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.utils.io import load_tensors

pytestmark = pytest.mark.slow

TINY = ["--dataset", "digits", "--task", "odd-even", "--n-per-class", "3", "--no-progress"]


class MatrixInversion(Attack):
    """A plug-in (model inversion, as in the README) that writes its objective and nothing else."""

    name: ClassVar[str] = "matrix-inversion"

    def objective(self, target, prior, x, **variables):
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean(), "margin": margin.mean()}


METHODS = [*ATTACKS.names(), MatrixInversion.name]


@pytest.fixture(scope="module", autouse=True)
def plugin() -> Iterator[None]:
    ATTACKS.register(MatrixInversion.name, MatrixInversion, force=True)
    yield
    ATTACKS.unregister(MatrixInversion.name)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A binary bias-free MLP with weight decay and a ResNet-8 with batch norm trained in mini-batches (n = 6)."""
    root = tmp_path_factory.mktemp("matrix")
    out = {"mlp": root / "mlp", "bn": root / "bn"}
    assert main(["train", *TINY, "--arch", "mlp", "--hidden", "8", "--no-bias", "--init-scale", "1e-2", "--loss",
                 "logistic", "--weight-decay", "0.01", "--lr", "0.5", "--epochs", "50", "--out", str(out["mlp"])]) == 0
    assert main(["train", *TINY, "--arch", "resnet8", "--channels", "2,3,3", "--no-bias", "--batch-norm", "--loss",
                 "logistic", "--lr", "0.05", "--batch-size", "3", "--epochs", "1", "--out", str(out["bn"])]) == 0
    return out


@dataclass(frozen=True)
class Option:
    """One option tried on one attack.

    Attributes:
        name: the field it sets (dotted below the run's settings).
        flags: what the run with the option adds to the shared ones.
        base: what both runs share beside the attack's own (the situation in which the option can act).
        model: the target.
        words: a refusal must name one of these (the option's field or flag, or the one it needs).
        run: the run folder compared (``run0`` of ``--runs 2``).
    """

    name: str
    flags: tuple[str, ...]
    base: tuple[str, ...] = ()
    model: str = "mlp"
    words: tuple[str, ...] = ()
    run: str = ""


def _another(config: type, field: str) -> Any:
    """A valid value of the config field other than its default (what would act if the option were honoured)."""
    info = config.model_fields[field]
    default = info.default
    if field == "steps":
        return 4  # one more than the matrix's runs take
    if field == "optimizer":
        return "adam" if default != "adam" else "sgd"
    if field == "dtype":
        return "float64" if default == "float32" else "float32"
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if default is None:
        return 0.01
    return default * 0.5 if default else 0.5


def _attack_flags(cls: type) -> list[str]:
    """What a short run of the attack needs: its required knowledge and, where its config has them, a short
    replay (dynamics) or short inner solves and a weight decay (bilevel)."""
    fields = cls.config_cls.model_fields
    flags = ["--method", cls.name, "--candidates", "6", "--steps", "3", "--init", "uniform", "--step-probe", "0",
             "--log-every", "1", "--seed", "0", "--no-progress"]
    flags += ["--known-init", "seed"] if "known_init" in cls.requires else []
    flags += ["--known-recipe", "model"] if "recipe" in cls.requires else []
    for name, value in (("epochs", 1), ("inner_max_iter_first", 30), ("inner_max_iter", 5),
                        ("weight_decay_override", 0.01)):
        flags += ["--set", f"{name}={value}"] if name in fields else []
    return flags


def _words(field: str, *more: str) -> tuple[str, ...]:
    return (field, "--" + field.replace("_", "-"), *more)


def options(method: str) -> list[Option]:
    """Every option of the matrix for ``method`` (module docstring)."""
    cls = ATTACKS.get(method) if method in ATTACKS else MatrixInversion
    config = cls.config_cls
    rows = []
    for field in AttackConfig.model_fields:
        value = _another(config, field)
        situation = {"feature_stats_weight": dict(model="bn"),
                     "group_weight": dict(base=("--runs", "2", "--batch-mode", "batched"), run="run0")}.get(field, {})
        situation = situation or ({"base": ("--init", "gaussian")} if field == "box_weight" else {})  # x leaves the box
        rows.append(Option(field, ("--set", f"{field}={value}"), words=_words(field, "optimizer", "lr_x"), **situation))
    for prior in PRIORS.ordered():
        field = PRIORS.get(prior).weight_field
        if field not in AttackConfig.model_fields:
            rows.append(Option(field, ("--set", f"{field}=1.0"), words=_words(field)))
    diverge = tuple(a for f in cls.step_size_fields for a in ("--set", f"{f}=1e30"))
    known = ("--known-init", "seed")
    rows += [
        Option("early_stop.patience", ("--early-stop-patience", "1", "--early-stop-tol", "0.9"),
               words=_words("early_stop_patience")),
        Option("early_stop.rel_tol", ("--early-stop-tol", "0.5"), words=("--early-stop-patience",)),
        Option("early_stop.rel_tol=5", ("--early-stop-patience", "1", "--early-stop-tol", "5"),
               words=("--early-stop-tol",)),
        Option("step_probe", ("--step-probe", "3"), base=diverge, words=_words("step_probe", "step size")),
        Option("retry_diverged", ("--retry-diverged", "1"), base=diverge, words=_words("retry_diverged", "step size")),
        Option("knowledge.n", ("--known-n", "6"), words=_words("known_n")),
        Option("knowledge.labels", ("--known-labels", "restored"), base=known, words=_words("known_labels", "labels")),
        # with a known start the KKT family keeps its candidates in the subspace by default: turning it off acts
        Option("subspace", ("--set", "subspace=false"), base=known, words=_words("subspace")),
    ]
    if "known_init" not in cls.requires:
        rows.append(Option("knowledge.known_init", known, words=_words("known_init")))
    if "recipe" not in cls.requires:
        rows.append(Option("knowledge.recipe", ("--known-recipe", "model"), base=known, words=_words("known_recipe")))
    return rows


#: the options of the matrix that are not fields of AttackConfig or PRIORS: run settings, one per field
RUN_SETTINGS = {"early_stop.patience", "early_stop.rel_tol", "step_probe", "retry_diverged", "knowledge.n",
                "knowledge.labels", "knowledge.known_init", "knowledge.recipe"}


def _outcome(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


def _refusal(code: int, err: str) -> str | None:
    """The one-line refusal of a command ("" when it ran; a diverged run is a run, not a refusal)."""
    errors = [line for line in err.strip().splitlines() if line.startswith("error:")]
    if code == 2 and errors and " diverged at step " not in errors[-1]:
        assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
        return errors[0]
    assert code in (0, 2), err
    return None


def _signature(run: Path) -> dict[str, Any]:
    """What a run did: its history, its candidates and scores (bit for bit), and what its record says of it."""
    meta = json.loads((run / "run.json").read_text())
    rows = [{k: v for k, v in json.loads(line).items() if "time" not in k}
            for line in (run / "history.jsonl").read_text().splitlines() if line.strip()]
    tensors = load_tensors(run / "candidates.safetensors") if (run / "candidates.safetensors").is_file() else {}
    return {"history": rows, "tensors": {k: bytes(v.contiguous().view(torch.uint8).flatten().tolist())
                                         for k, v in tensors.items()},
            "record": {k: meta.get(k) for k in ("status", "steps_done", "stop_reason", "knowledge", "step_probe",
                                                "retry_diverged", "selection", "extra")}}


_BASELINES: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}


def _run(models, tmp: Path, method: str, option: Option, flags: tuple[str, ...], capsys) -> tuple[str | None, Any]:
    cls = ATTACKS.get(method)
    out = tmp / f"run{len(list(tmp.iterdir()))}"
    args = ["reconstruct", "--model", str(models[option.model]), *_attack_flags(cls), *option.base, *flags,
            "--out", str(out)]
    code, err = _outcome(args, capsys)
    refusal = _refusal(code, err)
    if refusal is not None:
        return refusal, None
    return None, _signature(out / option.run if option.run else out)


def silent_options(models, tmp_path: Path, method: str, capsys) -> list[str]:
    """The options of the matrix that ran for ``method`` and changed nothing (every refusal checked on the way)."""
    silent, refused_at_base = [], []
    for option in options(method):
        key = (method, option.model, option.base)
        if key not in _BASELINES:
            _BASELINES[key] = _run(models, tmp_path, method, option, (), capsys)
        base_refusal, base = _BASELINES[key]
        if base_refusal is not None:  # the situation itself is refused (e.g. group consistency for this attack)
            refused_at_base.append(option.name)
            assert any(w in base_refusal for w in option.words), (option.name, base_refusal)
            continue
        refusal, sig = _run(models, tmp_path, method, option, option.flags, capsys)
        if refusal is not None:
            assert any(w in refusal for w in option.words), f"{method} {option.name}: the refusal names none of " \
                                                            f"{option.words}: {refusal}"
        elif sig == base:
            silent.append(option.name)
    return silent


@pytest.mark.parametrize("method", METHODS)
def test_every_option_changes_the_run_or_is_refused_in_one_line(models, tmp_path, capsys, method: str) -> None:
    silent = silent_options(models, tmp_path, method, capsys)
    assert not silent, f"{method}: options that ran and changed nothing: {silent}"


class _IgnoresTheBox(MatrixInversion):
    """A planted silent option: the attack claims the box prior as its own and never applies it."""

    name: ClassVar[str] = "matrix-ignores-box"

    def own_priors(self, target, prior):
        return ("box",)


def test_the_matrix_finds_a_planted_silent_option(models, tmp_path, capsys) -> None:
    ATTACKS.register(_IgnoresTheBox.name, _IgnoresTheBox, force=True)
    try:
        # (without the box its candidates also stay finite at a step size of 1e30: the probe and the retry have
        # nothing to act on, which the matrix reports as well)
        assert "box_weight" in silent_options(models, tmp_path, _IgnoresTheBox.name, capsys)
    finally:
        ATTACKS.unregister(_IgnoresTheBox.name)


def test_the_matrix_covers_every_declared_option() -> None:
    names = {o.name for o in options("kkt")}
    assert set(AttackConfig.model_fields) <= names
    assert {PRIORS.get(p).weight_field for p in PRIORS.ordered()} <= names
    declared = ({f"early_stop.{f}" for f in EarlyStopSettings.model_fields}
                | {f"knowledge.{f}" for f in KnowledgeSettings.model_fields}
                | {f for f in RunSettings.model_fields if f in ("step_probe", "retry_diverged")})
    assert declared <= names | {"knowledge.known_init"}, declared - names


@pytest.mark.parametrize("flags", [["--early-stop-tol", "0.5"], ["--early-stop-patience", "0", "--early-stop-tol", "0.5"],
                                   ["--early-stop-patience", "3", "--early-stop-tol", "5"]],
                         ids=["tol-alone", "tol-patience-0", "tol-5"])
def test_issue_49s_silent_early_stop_options_are_refused(models, tmp_path, capsys, flags) -> None:
    code, err = _outcome(["reconstruct", "--model", str(models["mlp"]), *_attack_flags(ATTACKS.get("kkt")), *flags,
                          "--out", str(tmp_path / "r")], capsys)
    refusal = _refusal(code, err)
    assert refusal is not None and "--early-stop-" in refusal and not (tmp_path / "r").exists()


def test_a_margin_ascent_window_without_ascent_steps_is_refused(tmp_path, capsys) -> None:
    code, err = _outcome(["train", *TINY, "--arch", "mlp", "--hidden", "4", "--epochs", "2",
                          "--margin-ascent-window", "10", "--out", str(tmp_path / "m")], capsys)
    assert _refusal(code, err) is not None and "--margin-ascent-steps" in err and not (tmp_path / "m").exists()
