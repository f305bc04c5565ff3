"""The identifiability diagnostic: the closed-form Gram matrices against explicit per-example gradients, the optimal
multipliers against a brute-force solve, and planted models whose weight change is exactly a combination of the
margin gradients of a known set."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from datarecon.evaluation.identifiability import (fit_objective, gradient_features, gram_blocks, optimal_multipliers,
                                                  target_products)


def _mlp(d: int = 12, h: int = 9, k: int = 1, bias: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, h, bias=bias), nn.ReLU(), nn.Linear(h, h, bias=bias), nn.ReLU(),
                         nn.Linear(h, k, bias=bias)).double()


def _params(net: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in net.named_parameters()}


@pytest.mark.parametrize("bias, formulation, k", [(False, "binary", 1), (True, "multiclass", 3),
                                                  (True, "regression", 1)], ids=["binary", "multiclass", "regression"])
def test_the_closed_form_gram_equals_explicit_per_example_gradients(bias, formulation, k):
    net = _mlp(k=k, bias=bias)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 1, 3, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (7,), generator=gen) if formulation == "multiclass" else torch.tensor(
        [1.0, -1, 1, 1, -1, -1, 1], dtype=torch.float64)
    p = _params(net)
    fast = gradient_features(net, p, x, y, formulation=formulation)
    slow = gradient_features(net, p, x, y, formulation=formulation, factor_linear=False)
    assert fast.linear and not fast.dense and not slow.linear
    target = {kk: torch.randn_like(v) for kk, v in p.items()}
    gf, gs = gram_blocks(fast, fast), gram_blocks(slow, slow)
    tf, ts = target_products(fast, target), target_products(slow, target)
    for name in p:
        assert torch.allclose(gf[name], gs[name], rtol=1e-10, atol=1e-12), name
        assert torch.allclose(tf[name], ts[name], rtol=1e-10, atol=1e-12), name
    # and both against a loop of autograd gradients of one example at a time
    for i in range(7):
        net.zero_grad()
        out = net(x[i:i + 1])
        m = out[0, 0] * y[i] if formulation == "binary" else (
            out[0, 0] if formulation == "regression" else out[0, y[i]] - torch.cat([out[0, :y[i]], out[0, y[i] + 1:]]).max())
        m.backward()
        for name, prm in net.named_parameters():
            assert float(ts[name][i]) == pytest.approx(float((prm.grad * target[name]).sum()), rel=1e-9, abs=1e-12)


def test_optimal_multipliers_match_a_brute_force_nonnegative_least_squares():
    from scipy.optimize import nnls

    rng = np.random.default_rng(2)
    g = rng.normal(size=(40, 6))
    t = rng.normal(size=40)
    lam = optimal_multipliers(torch.tensor(g.T @ g), torch.tensor(g.T @ t))
    ref, _ = nnls(g, t)
    assert np.allclose(lam, ref, atol=1e-8)
    assert np.allclose(optimal_multipliers(torch.tensor(g.T @ g), torch.tensor(g.T @ t), signed=True),
                       np.linalg.lstsq(g, t, rcond=None)[0], atol=1e-8)


def test_planted_a_change_made_of_the_gradients_of_a_known_set_has_residual_zero_for_it_and_not_for_fakes():
    """θ* − θ_init = Σ λ_i ∇m(x_i; θ_init) exactly (Loo's objective holds with equality): the set fits it perfectly,
    held-out-like inputs and means of two of its members do not."""
    net = _mlp()
    init = _params(net)
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(6, 1, 3, 4, generator=gen, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1, 1, -1], dtype=torch.float64)
    lam = torch.tensor([0.5, 1.0, 0.2, 0.8, 1.5, 0.3], dtype=torch.float64)
    f = gradient_features(net, init, x, y, formulation="binary")
    change = {}
    for name in init:  # Σ λ_i g_i, built from an explicit per-example loop
        total = torch.zeros_like(init[name])
        for i in range(6):
            g = torch.autograd.grad((net(x[i:i + 1])[0, 0] * y[i]), dict(net.named_parameters())[name])[0]
            total += lam[i] * g
        change[name] = total
    truth = fit_objective([f], change)
    assert truth.relative_residual < 1e-12 and np.allclose(truth.multipliers, lam.numpy(), atol=1e-6)
    fakes = {"other images": torch.rand(6, 1, 3, 4, generator=gen, dtype=torch.float64),
             "means of pairs": 0.5 * (x + x[[1, 0, 3, 2, 5, 4]])}
    for name, xf in fakes.items():
        fit = fit_objective([gradient_features(net, init, xf, y, formulation="binary")], change)
        assert fit.relative_residual > 1e-3, name
    assert set(truth.per_layer) == set(init) and max(truth.per_layer.values()) < 1e-10
