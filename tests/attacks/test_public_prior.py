"""The public-data prior ``pca``: its value and gradient against finite differences in float64, per run over a run
axis, through the priors registry (add_priors) at its weight, and its refusals in one line."""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.dynamics import DynamicsConfig
from datarecon.attacks.kkt import KKTConfig
from datarecon.attacks.priors import PriorInput, add_priors
from datarecon.attacks.public import PublicSubspace, pca_value_and_grad, principal_subspace
from datarecon.errors import DataReconError


def _subspace(d: int = 12, k: int = 4, seed: int = 0) -> PublicSubspace:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))
    return PublicSubspace(torch.randn(d, generator=g, dtype=torch.float64), q.T.contiguous(), 50, 0.5, "test")


def test_the_gradient_matches_central_finite_differences_float64() -> None:
    sub = _subspace()
    x = torch.randn(3, 3, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    value, grad = pca_value_and_grad(x, sub)
    h = 1e-6
    for idx in [(0, 0, 0, 0), (1, 2, 1, 0), (2, 1, 0, 1), (0, 2, 1, 1)]:
        up, down = x.clone(), x.clone()
        up[idx] += h
        down[idx] -= h
        fd = (pca_value_and_grad(up, sub)[0] - pca_value_and_grad(down, sub)[0]) / (2 * h)
        assert float(grad[idx]) == pytest.approx(float(fd), rel=1e-7, abs=1e-12)
    # the value by a loop over candidates: the squared residual outside span(V) per pixel
    ref = sum(float((xi.reshape(-1) - sub.mean - sub.basis.T @ (sub.basis @ (xi.reshape(-1) - sub.mean))).pow(2).sum())
              for xi in x) / x.numel()
    assert float(value) == pytest.approx(ref, rel=1e-12)


def test_a_candidate_in_the_subspace_costs_nothing_and_runs_are_valued_apart() -> None:
    sub = _subspace()
    inside = (sub.mean + sub.basis.T @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)).reshape(1, 3, 2, 2)
    value, grad = pca_value_and_grad(inside, sub)
    assert float(value) == pytest.approx(0.0, abs=1e-24) and float(grad.abs().max()) < 1e-12
    x = torch.randn(2, 3, 3, 2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    values, grads = pca_value_and_grad(x, sub, run_axis=True)
    for k in range(2):
        v, g = pca_value_and_grad(x[k], sub)
        assert float(values[k]) == pytest.approx(float(v), rel=1e-12) and torch.allclose(grads[k], g)


def test_the_principal_subspace_of_a_planted_plane_is_that_plane() -> None:
    g = torch.Generator().manual_seed(3)
    plane = torch.linalg.qr(torch.randn(30, 2, generator=g, dtype=torch.float64))[0].T  # (2, 30)
    images = torch.randn(40, 2, generator=g, dtype=torch.float64) @ plane * 5 + 1.0
    for rows in (images, images[:10]):  # d <= N (scatter matrix) and N < d (Gram matrix)
        mean, basis, explained = principal_subspace(rows, 2)
        assert torch.allclose(basis.T @ basis, plane.T @ plane, atol=1e-9) and explained == pytest.approx(1.0)
        assert torch.allclose(mean, rows.mean(0))
    with pytest.raises(DataReconError, match="at least two public images"):
        principal_subspace(images[:1], 2)


def test_add_priors_weighs_it_for_any_attack_and_refuses_it_without_a_subspace() -> None:
    sub = _subspace()
    x = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for config in (KKTConfig(pca_weight=3.0, box_weight=0.0), DynamicsConfig(pca_weight=3.0, box_weight=0.0)):
        terms, grad = add_priors(config, PriorInput(x, -1.0, 1.0, public=sub), {"loss": torch.tensor(0.0)},
                                 torch.zeros_like(x))
        value, g = pca_value_and_grad(x, sub)
        assert float(terms["pca"]) == pytest.approx(float(value)) and float(terms["loss"]) == pytest.approx(3 * float(value))
        assert torch.allclose(grad, 3 * g)
    with pytest.raises(DataReconError, match=r"^the public-data prior needs the principal subspace .*set pca_weight "
                                             r"to 0$"):
        add_priors(KKTConfig(pca_weight=1.0), PriorInput(x, -1.0, 1.0), {"loss": torch.tensor(0.0)}, torch.zeros_like(x))
    with pytest.raises(DataReconError, match=r"pca_components 8 does nothing without the public-data prior"):
        KKTConfig(pca_components=8)
    assert "pca_weight" not in KKTConfig().model_dump() and "pca_components" not in KKTConfig().model_dump()
