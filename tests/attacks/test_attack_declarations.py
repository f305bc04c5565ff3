"""What generic attack code reads, each attack declares: its progress keys, the metric and reason of
an early stop, its divergence hint and its per-candidate weights. The generic modules name no KKT
metric (issue 43, item 2)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel

import datarecon.attacks as attacks_pkg
from datarecon.attacks import ATTACKS
from datarecon.attacks.base import Attack, AttackConfig, AttackerPrior, AttackSetup, Target
from datarecon.attacks.init import CandidateSpec, make_init
from datarecon.attacks.kkt import KKTAttack, KKTConfig
from datarecon.attacks.loop import ATTACK_LOOP, AttackLoop
from datarecon.attacks.runner import run_attack
from datarecon.errors import DataReconError
from datarecon.evaluation.run_eval import RunEvaluationSettings, check_run

SHAPE = (1, 4, 4)
#: the KKT family's metric and field names
KKT_NAMES = ("rel_residual", "lr_lambda", "lambda_hinge", "alpha", '"lambda"')
#: the modules every attack runs through
GENERIC = ("base.py", "loop.py", "runner.py")


class _Probe(Attack):
    """A one-file attack (default step) that declares its own progress keys."""

    name: ClassVar[str] = "declared-probe"
    config_cls: ClassVar[type[Any]] = AttackConfig
    progress_keys: ClassVar[tuple[str, ...]] = ("loss", "margin")

    def objective(self, target: Target, prior: AttackerPrior, x: torch.Tensor) -> dict[str, torch.Tensor]:
        margin = self.labels(prior, x.device) * target.forward(x).squeeze(1)
        return {"loss": F.softplus(-margin).mean(), "margin": margin.mean()}


def _x0(m: int = 6) -> torch.Tensor:
    return make_init("gaussian", CandidateSpec(m=m, input_shape=SHAPE), generator=torch.Generator().manual_seed(0),
                     scale=0.1)


@pytest.mark.parametrize("module", GENERIC)
def test_generic_attack_modules_name_no_kkt_metric(module: str) -> None:
    text = (Path(attacks_pkg.__file__).parent / module).read_text()
    found = [name for name in KKT_NAMES if name in text]
    assert not found, f"attacks/{module} names {found}: declare them on the attack (attacks/kkt*.py)"


@pytest.mark.parametrize("method", ATTACKS.names())
def test_every_attack_shows_what_its_early_stop_watches(method: str) -> None:
    cls = ATTACKS.get(method)
    assert cls.progress_keys and all(isinstance(k, str) for k in cls.progress_keys)
    assert set(cls.progress_labels) <= set(cls.progress_keys)
    assert cls.early_stop_metric is None or cls.early_stop_metric in cls.progress_keys
    assert cls.divergence_hint and cls.early_stop_reason.startswith("stopped early")


def test_the_progress_line_shows_the_attacks_own_keys(target, prior) -> None:
    attack = _Probe(AttackConfig(steps=2, lr_x=0.01))
    state = attack.init_state(target, prior, x0=_x0().double(), generator=torch.Generator().manual_seed(0))
    loop = AttackLoop(attack, target, prior, state, loop=replace(ATTACK_LOOP, progress=False))
    assert loop.run_loop.display.keys == ("loss", "margin")
    kkt = KKTAttack(KKTConfig(steps=2))
    state = kkt.init_state(target, prior, x0=_x0().double(), generator=torch.Generator().manual_seed(0))
    display = AttackLoop(kkt, target, prior, state, loop=replace(ATTACK_LOOP, progress=False)).run_loop.display
    assert display.keys == KKTAttack.progress_keys and display.labels == {"rel_residual": "surrogate_rel_residual"}


def test_multipliers_are_the_attacks_own(target, prior, tmp_path) -> None:
    plain = run_attack(_Probe(AttackConfig(steps=3, lr_x=0.01, dtype="float64")),
                       AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)),
                       loop=replace(ATTACK_LOOP, progress=False))
    assert torch.equal(plain.multipliers, torch.ones(prior.m, dtype=plain.x.dtype))
    kkt = run_attack(KKTAttack(KKTConfig(steps=3, lr_x=0.1, lr_lambda=0.1)),
                     AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)),
                     loop=replace(ATTACK_LOOP, progress=False))
    assert not torch.equal(kkt.multipliers, torch.ones_like(kkt.multipliers))  # λ moved from its start


def test_an_early_stop_records_the_attacks_own_reason(target, prior) -> None:
    def always(_: dict[str, float]) -> bool:
        return True

    rec = run_attack(_Probe(AttackConfig(steps=20, lr_x=0.01, dtype="float64")),
                     AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)),
                     loop=replace(ATTACK_LOOP, progress=False), early_stop=always)
    assert rec.status == "stopped-early" and rec.summary["stop_reason"] == "stopped early: loss plateau"


def test_evaluating_a_diverged_run_names_its_attacks_hint(target, prior, tmp_path) -> None:
    with pytest.warns(RuntimeWarning, match="diverged"):
        run_attack(KKTAttack(KKTConfig(steps=30, lr_x=1e150, lr_lambda=0.0)),
                   AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)),
                   out=tmp_path / "run", loop=replace(ATTACK_LOOP, progress=False))
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "diverged"
    with pytest.raises(DataReconError, match="rerun the attack: " + KKTAttack.divergence_hint.replace("(", r"\(")
                       .replace(")", r"\)")):
        check_run(tmp_path / "run", RunEvaluationSettings())


@pytest.mark.parametrize("method", ATTACKS.names())
def test_every_attack_config_is_an_attack_config(method: str) -> None:
    """Generic code reads the same fields of every attack (issue 49: bilevel's and dynamics' configs were plain
    models, dynamics' re-declaring ten of them)."""
    assert issubclass(ATTACKS.get(method).config_cls, AttackConfig)


class _Declares(_Probe):
    name: ClassVar[str] = "declares"


class _PlainConfig(BaseModel):
    steps: int = 3


@pytest.mark.parametrize(("change", "words"), [
    ({"step_size_fields": ("lr_bogus",)}, "step_size_fields names 'lr_bogus', which its config AttackConfig does not "
                                          "have"),
    ({"step_size_fields": ("steps",)}, "step_size_fields names 'steps', which is not a float field"),
    ({"step_size_fields": ("nesterov",)}, "not a float field"),
    ({"config_cls": _PlainConfig}, "config_cls '_PlainConfig' is not a subclass of"),
    ({"name": "other"}, "its class declares name = 'other'"),
    ({"early_stop_metric": ""}, "early_stop_metric must be a metric name or None"),
], ids=["unknown-step-size", "integer-step-size", "flag-step-size", "plain-config", "other-name", "empty-metric"])
def test_a_plugins_declarations_are_checked_when_it_is_registered(change: dict[str, Any], words: str) -> None:
    """Issue 49/50: a plug-in's step_size_fields naming a missing field (AttributeError at the probe) or an integer
    one (``steps`` scaled to 0.5) are refused when it joins, in one line naming it."""
    bad = type("Bad", (_Declares,), dict(change))
    with pytest.raises(DataReconError, match="attack method 'declares' cannot be registered: ") as exc:
        ATTACKS.register("declares", bad)
    assert words in str(exc.value) and "\n" not in str(exc.value) and "declares" not in ATTACKS


class _NoLoss(_Probe):
    name: ClassVar[str] = "no-loss"

    def objective(self, target, prior, x):
        return {"margin": x.sum()}


class _Constant(_Probe):
    name: ClassVar[str] = "constant"

    def objective(self, target, prior, x):
        return {"loss": torch.tensor(1.0, dtype=x.dtype)}


class _Vector(_Probe):
    name: ClassVar[str] = "vector-loss"

    def objective(self, target, prior, x):
        return {"loss": x.flatten(1).sum(1)}


class _VectorTerm(_Probe):
    name: ClassVar[str] = "vector-term"

    def objective(self, target, prior, x):
        return {"loss": x.sum(), "rows": x.flatten(1).sum(1)}


class _Complex(_Probe):
    """The seventh trial: a complex loss ended in "grad can be implicitly created only for real scalar outputs"."""

    name: ClassVar[str] = "complex-loss"

    def objective(self, target, prior, x):
        return {"loss": torch.complex(x.sum(), x.sum())}


@pytest.mark.parametrize(("cls", "words"), [
    (_NoLoss, "objective() must return a mapping with the minimised total under 'loss'; it returned the keys "
              "['margin']"),
    (_Constant, "its objective's 'loss' does not depend on the candidates x"),
    (_Vector, "its objective's 'loss' must be a scalar tensor, got (6,)"),
    (_VectorTerm, "its objective's term 'rows' is not one number ((6,))"),
    (_Complex, "its objective's 'loss' must be a real floating-point tensor, got complex128"),
], ids=["no-loss", "constant", "vector-loss", "vector-term", "complex-loss"])
def test_a_plugins_objective_faults_are_one_line_errors_naming_it(target, prior, cls, words) -> None:
    """Issue 50: KeyError 'loss' and "element 0 of tensors does not require grad" were internal errors."""
    with pytest.raises(DataReconError, match=f"attack {cls.name!r} \\(") as exc:
        run_attack(cls(AttackConfig(steps=2, lr_x=0.01, dtype="float64")),
                   AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)),
                   loop=replace(ATTACK_LOOP, progress=False))
    assert words in str(exc.value) and "\n" not in str(exc.value)
