"""The step-size probe: step sizes divided until a short probe of the attack stays finite; nothing else changes."""

from __future__ import annotations

import torch

from datarecon.attacks.base import AttackSetup
from datarecon.attacks.kkt import GradNormAttack, GradNormConfig, KKTAttack, KKTConfig
from datarecon.attacks.probe import probe_step_sizes, scaled
from datarecon.attacks.runner import run_attack


def _setup(target, prior, seed: int = 0) -> AttackSetup:
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((prior.m, *prior.input_shape), generator=g, dtype=torch.float64) * 0.5
    return AttackSetup(target=target, prior=prior, x0=x0, generator=g)


def test_a_diverging_step_size_is_divided_until_the_probe_stays_finite(target, prior) -> None:
    attack = GradNormAttack(GradNormConfig(lr_x=1e3, momentum=0.9, dtype="float64"))
    alone = run_attack(attack, _setup(target, prior), steps=30)
    assert alone.history[-1]["loss"] > 1e10 * alone.history[0]["loss"]  # planted: the step size is far too large
    result = probe_step_sizes(attack, _setup(target, prior), steps=30)
    assert result.scale < 1.0 and result.attack.config.lr_x == 1e3 * result.scale
    assert [t["verdict"] for t in result.record["tried"]][-1] == "ok"
    assert result.record["tried"][0] == {"scale": 1.0, "verdict": "grew"}
    probed = run_attack(result.attack, _setup(target, prior), steps=30)
    assert probed.status == "complete" and probed.history[-1]["loss"] < probed.history[0]["loss"]


def test_a_step_size_that_works_is_left_alone_and_the_run_is_unchanged(target, prior) -> None:
    """The probe copies the generator: the run after it draws λ₀ as it would without it, bit for bit."""
    attack = KKTAttack(KKTConfig(lr_x=0.01, lr_lambda=0.01, dtype="float64"))
    setup = _setup(target, prior)
    result = probe_step_sizes(attack, setup, steps=20)
    assert result.scale == 1.0 and result.attack is attack and result.record["tried"] == [{"scale": 1.0,
                                                                                           "verdict": "ok"}]
    after = run_attack(result.attack, setup, steps=15)
    without = run_attack(attack, _setup(target, prior), steps=15)
    assert torch.equal(after.x, without.x) and torch.equal(after.multipliers, without.multipliers)


def test_the_kkt_family_scales_both_step_sizes_and_an_unprobed_attack_is_not_probed(target, prior) -> None:
    attack = scaled(KKTAttack(KKTConfig(lr_x=0.5, lr_lambda=0.2)), 0.1)
    assert (attack.config.lr_x, attack.config.lr_lambda) == (0.05, 0.020000000000000004)
    assert probe_step_sizes(KKTAttack(), _setup(target, prior), steps=0).record == {}
