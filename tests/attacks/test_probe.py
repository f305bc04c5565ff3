"""The step-size probe: step sizes divided until a short probe of the attack stays finite, then the largest stable
scale bracketed by bisection in log scale and the ok scale with the smallest residual taken; nothing else changes."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch

from datarecon.attacks.base import Attack, AttackConfig, AttackSetup
from datarecon.attacks.kkt import GradNormAttack, GradNormConfig, KKTAttack, KKTConfig
from datarecon.attacks.probe import chosen_scale, probe_step_sizes, residual, scaled
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
    assert [t["verdict"] for t in result.record["tried"] if t["scale"] == result.scale] == ["ok"]
    assert len(result.record["tried"]) > 2  # coarse to the first ok scale, then the bisections above it
    assert result.record["tried"][0] == {"scale": 1.0, "verdict": "grew", "residual": None}
    probed = run_attack(result.attack, _setup(target, prior), steps=30)
    assert probed.status == "complete" and probed.history[-1]["loss"] < probed.history[0]["loss"]


def test_a_step_size_that_works_is_left_alone_and_the_run_is_unchanged(target, prior) -> None:
    """The probe copies the generator: the run after it draws λ₀ as it would without it, bit for bit."""
    attack = KKTAttack(KKTConfig(lr_x=0.01, lr_lambda=0.01, dtype="float64"))
    setup = _setup(target, prior)
    result = probe_step_sizes(attack, setup, steps=20)
    assert result.scale == 1.0 and result.attack is attack and len(result.record["tried"]) == 1
    assert result.record["tried"][0]["verdict"] == "ok" and result.record["tried"][0]["residual"] > 0
    after = run_attack(result.attack, setup, steps=15)
    without = run_attack(attack, _setup(target, prior), steps=15)
    assert torch.equal(after.x, without.x) and torch.equal(after.multipliers, without.multipliers)


def test_the_kkt_family_scales_both_step_sizes_and_an_unprobed_attack_is_not_probed(target, prior) -> None:
    attack = scaled(KKTAttack(KKTConfig(lr_x=0.5, lr_lambda=0.2)), 0.1)
    assert (attack.config.lr_x, attack.config.lr_lambda) == (0.05, 0.020000000000000004)
    assert probe_step_sizes(KKTAttack(), _setup(target, prior), steps=0).record == {}


class _EdgeConfig(AttackConfig):
    edge: float = 0.5


class _Edge(Attack):
    """Planted: the objective ||x||² shrinks by (1 - lr_x)² a step while lr_x <= ``edge`` (the larger the step, the
    smaller the residual) and grows fourfold a step above it: the largest stable step is ``edge``, known."""

    name: ClassVar[str] = "planted-edge"
    config_cls: ClassVar[type] = _EdgeConfig

    def objective(self, target, prior, x, **variables):
        return {"loss": (x ** 2).sum()}

    def update(self, target, prior, state, g, index):
        lr = self.config.lr_x
        state["x"].mul_(2.0 if lr > self.config.edge else 1.0 - lr)
        return dict(g.terms)


@pytest.mark.parametrize("edge", [0.9, 0.5, 0.37, 0.2, 0.05, 0.013])
def test_the_rule_finds_the_largest_stable_step_of_a_planted_attack_within_its_resolution(target, prior, edge):
    attack = _Edge(_EdgeConfig(lr_x=1.0, edge=edge, box_weight=0.0, momentum=0.0, dtype="float64"))
    result = probe_step_sizes(attack, _setup(target, prior), steps=20)
    resolution = 10 ** (1 / 8)  # three bisections of a factor 10 in log scale
    assert edge / resolution < result.scale <= edge
    assert result.attack.config.lr_x == result.scale and result.record["fields"] == {"lr_x": result.scale}
    tried = result.record["tried"]
    assert [t["verdict"] for t in tried] == ["ok" if t["scale"] <= edge else "grew" for t in tried]
    assert len(tried) == 1 + math.ceil(-math.log10(edge)) + 3  # scale 1, the coarse tries to the first ok, 3 bisections
    assert max(t["scale"] for t in tried if t["verdict"] == "ok") == result.scale


class _Quadratic(Attack):
    """Planted: gradient descent without momentum on ||x||²·a/2 multiplies x by (1 − lr_x·a) a step, so the
    residual after k steps is (1 − lr_x·a)^(2k) of the first: smallest at lr_x = 1/a, growing beyond lr_x = 2/a."""

    name: ClassVar[str] = "planted-quadratic"
    config_cls: ClassVar[type] = _EdgeConfig  # edge: a's inverse (the best step)

    def objective(self, target, prior, x, **variables):
        return {"loss": (x ** 2).sum() / (2 * self.config.edge)}


def test_the_polish_finds_a_best_step_inside_the_stable_range(target, prior) -> None:
    attack = _Quadratic(_EdgeConfig(lr_x=1.0, edge=0.2, box_weight=0.0, momentum=0.0, dtype="float64"))
    result = probe_step_sizes(attack, _setup(target, prior), steps=20)
    tried = result.record["tried"]
    # coarse 1 → 0.1, bisections 0.316 (ok), 0.562 (grew), 0.422 (ok: 1.1^40 < 1000, its residual large); the best
    # of these, 0.1, lies below 0.316: the polish probes 0.178 (better), then 0.237 (worse)
    assert [round(t["scale"], 3) for t in tried] == [1.0, 0.1, 0.316, 0.562, 0.422, 0.178, 0.237]
    assert result.scale == pytest.approx(0.1 ** 0.75) and result.record["rule"]["polish"] == 2
    assert 0.2 / 10 ** (1 / 8) < result.scale < 0.2 * 10 ** (1 / 8)  # the planted best step 1/a = 0.2
    # the residuals are the planted objective's: (1 - scale/0.2)^(2·19) of the first loss, their peak in the window
    first = (_setup(target, prior).x0.double() ** 2).sum().item() / 0.4
    chosen = next(t for t in tried if t["scale"] == result.scale)
    assert chosen["residual"] == pytest.approx(first * (1 - result.scale / 0.2) ** (2 * 16), rel=1e-9)
    assert _verdict_counts(tried) == {"ok": 5, "grew": 2}


def _verdict_counts(tried) -> dict:
    out: dict = {}
    for t in tried:
        out[t["verdict"]] = out.get(t["verdict"], 0) + 1
    return out


def test_the_residual_not_the_largest_ok_scale_decides() -> None:
    """An ok scale at the edge that oscillates (its window's peak high) loses to a smaller one that got further."""
    tried = [{"scale": 1.0, "verdict": "grew", "residual": None}, {"scale": 0.1, "verdict": "ok", "residual": 2.0},
             {"scale": 0.316, "verdict": "ok", "residual": 5.0}, {"scale": 0.562, "verdict": "diverged", "residual": None}]
    assert chosen_scale(tried) == 0.1
    assert chosen_scale([*tried[:2], {"scale": 0.2, "verdict": "ok", "residual": 2.0}]) == 0.2  # a tie: the larger
    assert chosen_scale(tried[:1]) == 1.0  # none ok: the last tried (the run shows the divergence)
    # the residual is the largest objective over the last fifth of the probe
    assert residual([{"loss": v} for v in [9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 2.0]]) == 3.0
    assert residual([{"loss": 4.0}]) == 4.0


def test_the_probe_is_bounded_when_nothing_passes(target, prior) -> None:
    attack = _Edge(_EdgeConfig(lr_x=1.0, edge=1e-9, box_weight=0.0, momentum=0.0, dtype="float64"))
    result = probe_step_sizes(attack, _setup(target, prior), steps=8)
    assert [t["scale"] for t in result.record["tried"]] == pytest.approx([1.0, 0.1, 0.01, 1e-3, 1e-4])
    assert result.scale == pytest.approx(1e-4) and all(t["verdict"] == "grew" for t in result.record["tried"])
