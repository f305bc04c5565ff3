"""KKT / DecoReco / gradnorm attacks: planted recovery, determinism, assumptions, misuse."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from torch import nn

from datarecon.attacks.base import ATTACKS, Attack, AttackerPrior, AttackSetup, Target
from datarecon.attacks.init import CandidateSpec, make_init
from datarecon.attacks.kkt import (
    DecoRecoAttack,
    DecoRecoConfig,
    GradNormAttack,
    GradNormConfig,
    KKTAttack,
    KKTConfig,
    resolve_formulation,
)
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import run_attack
from datarecon.config import build_config
from datarecon.attacks.priors import box_penalty
from datarecon.errors import DataReconError

SHAPE = (1, 4, 4)


def _linear_planted(m: int, seed: int = 0):
    """Bias-free linear Φ(x) = w·x with θ* = (1/m) Σ λ_i y_i x_i exactly (λ = 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, *SHAPE, generator=g, dtype=torch.float64) - 0.5
    y = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(m)], dtype=torch.float64)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 1, bias=False)).double()
    w = (y[:, None] * x.reshape(m, -1)).sum(0, keepdim=True) / m
    target = Target(model=model, params={"1.weight": w}, loss="logistic", weight_decay=0.0, input_shape=SHAPE,
                    num_outputs=1, homogeneous=True)
    prior = AttackerPrior(labels=y, input_shape=SHAPE, lower=-1.0, upper=1.0)
    return target, prior, x, g


@pytest.mark.parametrize("m", [1, 4], ids=["m1-unique", "m4-underdetermined"])
def test_planted_linear_recovery(m):
    target, prior, x_true, g = _linear_planted(m)
    x0 = x_true + 0.05 * torch.randn(x_true.shape, generator=g, dtype=torch.float64)
    cfg = KKTConfig(steps=300, lr_x=1.0, lr_lambda=0.0, lambda_init="ones", lambda_min=0.5, momentum=0.5,
                    dtype="float64")  # a 1e-12 planted-solution test needs float64
    rec = run_attack(KKTAttack(cfg), AttackSetup(target, prior, x0, g),
                     loop=replace(ATTACK_LOOP, log_every=300, progress=False))
    assert rec.history[-1]["residual"] < 1e-12 * max(rec.history[0]["residual"], 1e-30) + 1e-20
    err0, err = (x0 - x_true).norm(), (rec.x - x_true).norm()
    if m == 1:
        assert err < 1e-6  # the solution is unique: x = θ*·m/(λ y)
    else:
        assert err < err0  # gradient flow projects x0 onto the solution set, which contains x_true


def test_deterministic_by_seed(make_target, prior):
    target = make_target()

    def once(seed):
        g = torch.Generator().manual_seed(seed)
        x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE), generator=g, scale=0.1)
        return run_attack(KKTAttack(KKTConfig(steps=5, lr_x=0.5)), AttackSetup(target, prior, x0, g),
                          loop=replace(ATTACK_LOOP, progress=False))

    a, b, c = once(1), once(1), once(2)
    assert torch.equal(a.x, b.x) and torch.equal(a.multipliers, b.multipliers)
    assert not torch.equal(a.x, c.x)


def test_kkt_lowers_the_objective(make_target, prior):
    target = make_target()
    g = torch.Generator().manual_seed(0)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE), generator=g, scale=0.1)
    rec = run_attack(KKTAttack(KKTConfig(steps=60, lr_x=0.5, lr_lambda=0.01)), AttackSetup(target, prior, x0, g),
                     loop=replace(ATTACK_LOOP, log_every=1, progress=False))
    assert rec.history[-1]["loss"] < 0.9 * rec.history[0]["loss"]


def test_decoreco_multiclass_and_regression(make_target):
    tgt = make_target(k=3, loss="cross-entropy")
    prior = AttackerPrior.balanced(m=6, num_outputs=3, input_shape=SHAPE, lower=-1.0, upper=1.0)
    g = torch.Generator().manual_seed(0)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE), generator=g, scale=0.1)
    attack = DecoRecoAttack(DecoRecoConfig(steps=30, lr_x=0.1, lr_lambda=0.05))
    rec = run_attack(attack, AttackSetup(tgt, prior, x0, g), loop=replace(ATTACK_LOOP, log_every=1, progress=False))
    assert rec.summary["formulation"] == "multiclass" and rec.history[-1]["loss"] < rec.history[0]["loss"]
    reg = make_target(loss="mse", weight_decay=7.5e-4)
    prior1 = AttackerPrior.balanced(m=6, num_outputs=1, input_shape=SHAPE, lower=-1.0, upper=1.0)
    cfg = DecoRecoConfig(steps=30, lr_x=0.5, lambda_init="uniform-signed", lr_lambda=0.01)
    rec = run_attack(DecoRecoAttack(cfg), AttackSetup(reg, prior1, x0, g),
                     loop=replace(ATTACK_LOOP, log_every=1, progress=False))
    assert rec.summary["formulation"] == "regression"
    assert rec.history[-1]["lambda_hinge"] == 0.0 and rec.history[-1]["loss"] < rec.history[0]["loss"]
    assert rec.summary["selection"]["lambda_at_min"]["value"] <= 1.0


def test_gradnorm_lowers_gradient_norm(make_target, prior):
    target = make_target(weight_decay=1e-2)
    g = torch.Generator().manual_seed(0)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE), generator=g, scale=0.1)
    rec = run_attack(GradNormAttack(GradNormConfig(steps=30, lr_x=0.5)), AttackSetup(target, prior, x0, g),
                     loop=replace(ATTACK_LOOP, log_every=1, progress=False))
    assert rec.history[-1]["residual"] < rec.history[0]["residual"]
    assert torch.equal(rec.multipliers, torch.ones(6, dtype=torch.float64))


def test_warns_on_non_homogeneous_target(make_target, prior):
    target = make_target(bias=True)
    g = torch.Generator().manual_seed(0)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE), generator=g, scale=0.1)
    with pytest.warns(UserWarning, match="not homogeneous"):
        rec = run_attack(KKTAttack(KKTConfig(steps=1)), AttackSetup(target, prior, x0, g),
                         loop=replace(ATTACK_LOOP, progress=False))
    assert any("homogeneous" in n for n in rec.summary["notes"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_attack(KKTAttack(KKTConfig(steps=1)), AttackSetup(make_target(), prior, x0, g),
                   loop=replace(ATTACK_LOOP, progress=False))


def test_auto_formulation(make_target):
    assert resolve_formulation("auto", make_target(k=3, loss="cross-entropy")) == "multiclass"
    assert resolve_formulation("auto", make_target(loss="mse")) == "regression"
    assert resolve_formulation("auto", make_target()) == "binary"


def test_misuse_errors(make_target, prior):
    g = torch.Generator().manual_seed(0)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE), generator=g, scale=0.1)
    with pytest.raises(DataReconError, match="needs a multi-output model"):
        run_attack(KKTAttack(KKTConfig(steps=1, formulation="multiclass")), AttackSetup(make_target(), prior, x0, g),
                   loop=replace(ATTACK_LOOP, progress=False))
    with pytest.raises(DataReconError, match="unknown formulation 'hinge'; valid names: binary, multiclass, regression"):
        build_config(KKTConfig, {"formulation": "hinge"})
    with pytest.raises(DataReconError, match="unknown optimizer 'rmsprop'; valid names: adam, sgd"):
        build_config(KKTConfig, {"optimizer": "rmsprop"})
    with pytest.raises(DataReconError, match="lr_x"):
        build_config(KKTConfig, {"lr_x": -1})
    with pytest.raises(DataReconError, match="unknown attack method 'foo'; valid names: .*decoreco, dynamics, gradnorm, kkt"):
        ATTACKS.get("foo")


@pytest.mark.parametrize("name", ["kkt", "decoreco", "gradnorm"])
def test_registry_entries_build_from_config(name):
    entry = ATTACKS.get(name)
    attack = entry.from_config(entry.config_cls(steps=3))
    assert attack.name == name and attack.config.steps == 3


@pytest.mark.parametrize("box_weight", [0.0, 1.0, 3.0])
def test_step_gradient_equals_full_autograd_objective(make_target, prior, box_weight):
    """The eager step (box prior in closed form) moves x and λ exactly as autograd of the full
    objective L = R + w_box·box + w_λ·hinge would (SGD without momentum, float64)."""
    target = make_target()
    g = torch.Generator().manual_seed(4)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE, dtype=torch.float64), generator=g, scale=2.0)
    cfg = KKTConfig(steps=1, lr_x=0.1, lr_lambda=0.05, momentum=0.0, box_weight=box_weight, dtype="float64")
    attack = KKTAttack(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = attack.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(0))
    x = state["x"].detach().clone().requires_grad_(True)
    lam = state["lambda"].detach().clone().requires_grad_(True)
    terms = attack.objective(target, prior, x, **{"lambda": lam})  # R + w_λ·hinge; the step adds the box prior
    box = box_penalty(x, prior.lower, prior.upper)
    gx, gl = torch.autograd.grad(terms["loss"] + box_weight * box, [x, lam])
    # the closed-form gradient equals the interface's default (autograd of the objective) before the priors
    closed, default = attack.gradients(target, prior, state), Attack.gradients(attack, target, prior, state)
    for k in ("x", "lambda"):
        torch.testing.assert_close(closed.grads[k], default.grads[k], rtol=1e-12, atol=1e-14)
    metrics = attack.step(target, prior, state, 0)
    torch.testing.assert_close(state["x"], x.detach() - 0.1 * gx, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(state["lambda"], lam.detach() - 0.05 * gl, rtol=1e-12, atol=1e-14)
    assert metrics["loss"] == pytest.approx(float((terms["loss"] + box_weight * box).detach()), rel=1e-12)
    assert metrics["box"] == pytest.approx(float(box), rel=1e-12) and metrics["box"] > 0


class _FunctionalReLU(nn.Module):
    """A custom bias-free MLP that applies ReLU as a function (invisible to the surrogate swap)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 8, bias=False)
        self.fc2 = nn.Linear(8, 1, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def test_functional_relu_is_reported_when_a_surrogate_is_asked_for(prior):
    from datarecon.attacks.surrogate import count_functional_relus

    model = _FunctionalReLU().double()
    assert count_functional_relus(model) == 1
    assert count_functional_relus(nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU())) == 0
    target = Target(model=model, params={k: v.detach() for k, v in model.named_parameters()}, loss="logistic",
                    weight_decay=0.0, input_shape=SHAPE, num_outputs=1, homogeneous=True)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE),
                   generator=torch.Generator().manual_seed(0), scale=0.1)
    with pytest.warns(UserWarning, match="applies ReLU as a function.*nn.ReLU modules"):
        KKTAttack(KKTConfig(steps=1)).init_state(target, prior, x0=x0, generator=torch.Generator())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the exact-ReLU attack has nothing to report
        KKTAttack(KKTConfig(steps=1, surrogate="relu")).init_state(target, prior, x0=x0, generator=torch.Generator())


def test_formulation_auto_is_the_default_of_the_kkt_family(make_target):
    """kkt attacks a multiclass (or regression) target without being told its formulation."""
    assert KKTConfig().formulation == "auto" and DecoRecoConfig().formulation == "auto"
    target = make_target(k=3)
    prior = AttackerPrior.balanced(m=6, num_outputs=3, input_shape=(1, 4, 4), lower=-1.0, upper=1.0)
    x0 = make_init("gaussian", CandidateSpec(m=6, input_shape=(1, 4, 4)),
                   generator=torch.Generator().manual_seed(0), scale=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        rec = run_attack(KKTAttack(KKTConfig(steps=3, lr_x=0.1)),
                         AttackSetup(target, prior, x0, torch.Generator().manual_seed(0)),
                         loop=replace(ATTACK_LOOP, progress=False))
    assert rec.summary["formulation"] == "multiclass" and rec.steps_done == 3
    assert KKTAttack(KKTConfig()).formulation(make_target()) == "binary"  # Haim's setting stays binary
