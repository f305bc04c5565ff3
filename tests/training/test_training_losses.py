"""Losses, energy and margins against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.training.losses import LOSSES, accuracy, energy, margins, weight_penalty


def test_logistic_matches_hand_values() -> None:
    f = torch.tensor([[2.0], [-1.0], [0.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    expected = [math.log1p(math.exp(-2.0)), math.log1p(math.exp(1.0)), math.log(2.0)]
    torch.testing.assert_close(LOSSES.get("logistic").per_sample(f, y), torch.tensor(expected, dtype=torch.float64))
    assert float(LOSSES.get("logistic")(f, y)) == pytest.approx(sum(expected) / 3, rel=1e-12)


def test_logistic_equals_bce_with_01_targets() -> None:
    f = torch.randn(7, 1, dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(f[:, 0], (y + 1) / 2)
    torch.testing.assert_close(LOSSES.get("logistic")(f, y), bce)


def test_mse_huber_cross_entropy_hand_values() -> None:
    f = torch.tensor([[0.5], [-3.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert float(LOSSES.get("mse")(f, y)) == pytest.approx((0.25 + 16.0) / 2)
    # Huber δ=1: |r|=0.5 -> 0.5·0.25; |r|=4 -> 4 − 0.5
    assert float(LOSSES.get("huber")(f, y)) == pytest.approx((0.125 + 3.5) / 2)
    logits = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    ce = float(LOSSES.get("cross-entropy")(logits, torch.tensor([0])))
    assert ce == pytest.approx(-1.0 + math.log(math.exp(1) + math.exp(2) + math.exp(3)))


def test_energy_includes_half_wd_norm_squared() -> None:
    params = {"a": torch.tensor([1.0, 2.0], dtype=torch.float64), "b": torch.tensor([[3.0]], dtype=torch.float64)}
    f = torch.tensor([[0.0]], dtype=torch.float64)
    y = torch.tensor([1.0], dtype=torch.float64)
    wd = 0.1
    assert float(weight_penalty(params, wd)) == pytest.approx(0.5 * wd * 14.0)
    assert float(energy(f, y, params, loss="logistic", weight_decay=wd)) == pytest.approx(math.log(2) + 0.7)
    assert float(energy(f, y, params, loss="logistic", weight_decay=0.0)) == pytest.approx(math.log(2))


def test_weight_decay_gradient_is_wd_theta() -> None:
    p = torch.tensor([1.5, -2.0], dtype=torch.float64, requires_grad=True)
    weight_penalty({"p": p}, 0.3).backward()
    torch.testing.assert_close(p.grad, 0.3 * p.detach())


def test_margins_binary_and_multiclass() -> None:
    f = torch.tensor([[2.0], [-1.0], [0.5]])
    y = torch.tensor([1.0, 1.0, -1.0])
    torch.testing.assert_close(margins(f, y), torch.tensor([2.0, -1.0, -0.5]))
    assert accuracy(f, y) == pytest.approx(1 / 3)
    logits = torch.tensor([[1.0, 4.0, 2.0], [0.0, -1.0, 3.0]])
    labels = torch.tensor([1, 0])
    torch.testing.assert_close(margins(logits, labels), torch.tensor([2.0, -3.0]))
    assert accuracy(logits, labels) == 0.5


def test_unknown_loss_lists_valid_names() -> None:
    with pytest.raises(DataReconError, match="unknown loss 'foo'; valid names: cross-entropy, huber, logistic, mse"):
        LOSSES.get("foo")
