"""Losses, energy and margins against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.kernel.losses import LOSSES, accuracy, energy, margins, weight_penalty


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


def _naive_margins(outputs: torch.Tensor, y: torch.Tensor) -> list[float]:
    """y_i f_i (one output) or f_{y_i} - max_{j != y_i} f_j, one sample and one class at a time."""
    rows = []
    for i in range(outputs.shape[0]):
        if y.dtype.is_floating_point:
            rows.append(float(y[i]) * float(outputs[i, 0]))
        else:
            c = int(y[i])
            rows.append(float(outputs[i, c]) - max(float(outputs[i, j]) for j in range(outputs.shape[1]) if j != c))
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("k", [1, 2, 5], ids=["binary", "two-class", "five-class"])
def test_margins_match_naive_loop(dtype: torch.dtype, k: int) -> None:
    g = torch.Generator().manual_seed(3)
    outputs = torch.randn(9, k, generator=g, dtype=dtype)
    y = (torch.randint(0, 2, (9,), generator=g) * 2 - 1).to(dtype) if k == 1 else torch.randint(0, k, (9,), generator=g)
    got = margins(outputs, y)
    assert got.shape == (9,) and got.dtype == dtype
    torch.testing.assert_close(got, torch.tensor(_naive_margins(outputs, y), dtype=dtype), rtol=0, atol=0)
    assert torch.equal(margins(outputs, y, multiclass=k > 1), got)


def test_margins_flat_binary_outputs_and_explicit_kind() -> None:
    f = torch.tensor([2.0, -1.0, 0.5])
    y = torch.tensor([1.0, 1.0, -1.0])
    assert torch.equal(margins(f, y), margins(f[:, None], y))
    logits = torch.tensor([[1.0, 4.0, 2.0], [0.0, -1.0, 3.0]])
    # float class indices with the kind named explicitly still use the multiclass formula
    assert torch.equal(margins(logits, torch.tensor([1.0, 0.0]), multiclass=True), torch.tensor([2.0, -3.0]))


def test_margin_users_are_bit_identical_to_their_former_formulas() -> None:
    """kkt_math, margin ascent and evaluation call :func:`margins`; values and gradients unchanged."""
    from datarecon.attacks.kkt_math import binary_margin, multiclass_margin
    from datarecon.training.margin import negative_margins

    g = torch.Generator().manual_seed(0)
    f1 = torch.randn(6, 1, generator=g, requires_grad=True)
    yb = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    lam = torch.rand(6, generator=g, requires_grad=True)
    new = binary_margin(f1, yb, lam)
    old = lam * yb * f1[:, 0]
    assert torch.equal(new, old)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(new.sum(), (f1, lam)),
                                                  torch.autograd.grad(old.sum(), (f1, lam))))
    assert torch.equal(negative_margins(f1, yb, loss="logistic"), -yb * f1[:, 0])
    fk = torch.randn(6, 4, generator=g, requires_grad=True)
    yk = torch.randint(0, 4, (6,), generator=g)
    new = multiclass_margin(fk, yk, lam)
    old = lam * (fk.gather(1, yk[:, None])[:, 0] - fk.scatter(1, yk[:, None], float("-inf")).amax(dim=1))
    assert torch.equal(new, old)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(new.sum(), (fk, lam)),
                                                  torch.autograd.grad(old.sum(), (fk, lam))))
