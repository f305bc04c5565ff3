"""KKT-regime diagnostics: per-sample gradients, NNLS solvers, planted solutions, normalised margin."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

from datarecon.errors import DataReconError
from datarecon.models.spec import ArchSpec, build_model
from datarecon.training.kkt_regime import (
    homogeneity_degree,
    kkt_regime_score,
    nnls_normal_equations,
    normalised_margin,
    per_sample_gradients,
)


def _data(n=12, shape=(1, 3, 3), seed=0, multiclass=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, dtype=torch.float64, generator=g)
    if multiclass:
        y = torch.arange(n) % 3
    else:
        y = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).to(torch.float64)
    return x, y


@pytest.mark.parametrize("multiclass", [False, True], ids=["binary", "multiclass"])
def test_per_sample_gradients_match_loop(multiclass: bool) -> None:
    x, y = _data(multiclass=multiclass)
    spec = ArchSpec(name="mlp", input_shape=(1, 3, 3), hidden=(5, 4), bias=True, num_outputs=3 if multiclass else 1)
    model = build_model(spec, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    params = dict(model.named_parameters())
    j = per_sample_gradients(model, params, x, y, chunk_size=5)
    assert j.shape == (12, sum(p.numel() for p in params.values()))
    for i in range(x.shape[0]):
        out = model(x[i:i + 1])[0]
        if multiclass:
            others = torch.cat([out[: y[i]], out[y[i] + 1:]])
            target = out[y[i]] - others.max()
        else:
            target = y[i] * out[0]
        grads = torch.autograd.grad(target, list(params.values()))
        torch.testing.assert_close(j[i], torch.cat([g.reshape(-1) for g in grads]))


@pytest.mark.parametrize("solver", ["nnls", "fista"])
def test_normal_equation_solvers_match_scipy_on_explicit_matrix(solver: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((30, 8))
    t = rng.standard_normal(30)
    lam_ref, rnorm = nnls(a, t)
    lam, res = nnls_normal_equations(a.T @ a, a.T @ t, float(t @ t), solver=solver)
    np.testing.assert_allclose(lam, lam_ref, atol=1e-7)
    assert res == pytest.approx(rnorm ** 2, rel=1e-7)


def test_rank_deficient_gram_is_handled() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 3)) @ rng.standard_normal((3, 10))  # n = 10 columns, rank 3
    t = a @ np.abs(rng.standard_normal(10))
    for solver in ("nnls", "fista"):
        _, res = nnls_normal_equations(a.T @ a, a.T @ t, float(t @ t), solver=solver)
        assert res <= 1e-8 * float(t @ t)


def test_planted_linear_kkt_point_scores_zero() -> None:
    """Bias-free affine model: ∇_θ y_iΦ(x_i) = y_i x_i, so θ* = Σ λ_i y_i x_i (λ ≥ 0) is a KKT point."""
    x, y = _data(n=10, shape=(1, 4, 4))
    model = build_model(ArchSpec(name="affine", input_shape=(1, 4, 4), bias=False), dtype=torch.float64)
    lam = torch.tensor([0.5, 0.0, 1.0, 2.0, 0.0, 0.3, 0.0, 0.0, 1.5, 0.2], dtype=torch.float64)
    with torch.no_grad():
        model[1].weight.copy_((lam * y) @ x.flatten(1))
    for solver in ("nnls", "fista"):
        s = kkt_regime_score(model, x, y, solver=solver)
        assert s.score < 1e-10
        torch.testing.assert_close(s.multipliers, lam, atol=1e-6, rtol=1e-6)
        assert s.num_active == 6


def test_score_matches_brute_force_nnls_on_mlp() -> None:
    x, y = _data(n=9)
    spec = ArchSpec(name="mlp", input_shape=(1, 3, 3), hidden=(6,), bias=False)
    model = build_model(spec, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    params = dict(model.named_parameters())
    theta = torch.cat([p.detach().reshape(-1) for p in params.values()])
    j = per_sample_gradients(model, params, x, y).numpy()
    _, rnorm = nnls(j.T, theta.numpy())
    expected = rnorm ** 2 / float(theta @ theta)
    for solver in ("nnls", "fista"):
        assert kkt_regime_score(model, x, y, solver=solver).score == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # streaming path (memory budget far below n × P) gives the same Gram matrix
    tiny = kkt_regime_score(model, x, y, max_bytes=1, chunk_size=4)
    assert tiny.score == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert 0.0 <= expected <= 1.0


def test_anti_aligned_parameters_score_one() -> None:
    """θ* = −Σ y_i x_i with all y_i x_i positively correlated: λ = 0 is optimal, score 1."""
    g = torch.Generator().manual_seed(4)
    base = torch.randn(16, dtype=torch.float64, generator=g)
    x = (base + 0.1 * torch.randn(6, 16, dtype=torch.float64, generator=g)).reshape(6, 1, 4, 4)
    y = torch.ones(6, dtype=torch.float64)
    model = build_model(ArchSpec(name="affine", input_shape=(1, 4, 4), bias=False), dtype=torch.float64)
    with torch.no_grad():
        model[1].weight.copy_(-x.flatten(1).sum(0, keepdim=True))
    s = kkt_regime_score(model, x, y)
    assert s.score == pytest.approx(1.0) and s.num_active == 0


def test_normalised_margin_and_degree() -> None:
    model = build_model(ArchSpec(name="mlp", input_shape=(1, 2, 2), hidden=(3, 3), bias=False))
    assert homogeneity_degree(model) == 3
    assert normalised_margin(torch.tensor([2.0, 0.5, 1.0]), 2.0, 3) == pytest.approx(0.5 / 8)
    assert normalised_margin(torch.tensor([-1.0, 3.0]), 1.0, 2) == -1.0


def test_score_errors() -> None:
    x, y = _data(n=4)
    model = build_model(ArchSpec(name="affine", input_shape=(1, 3, 3), bias=False), dtype=torch.float64)
    with pytest.raises(DataReconError, match="x has 4 samples but y has 3"):
        kkt_regime_score(model, x, y[:3])
    with torch.no_grad():
        model[1].weight.zero_()
    with pytest.raises(DataReconError, match="all parameters are zero"):
        kkt_regime_score(model, x, y)


@pytest.mark.parametrize(("bias", "outputs"), [(False, 1), (True, 1), (True, 3)],
                         ids=["nobias-binary", "bias-binary", "bias-multiclass"])
def test_layerwise_gram_equals_jacobian_gram(bias: bool, outputs: int) -> None:
    x, y = _data(n=11, multiclass=outputs > 1)
    spec = ArchSpec(name="mlp", input_shape=(1, 3, 3), hidden=(7, 5), bias=bias, num_outputs=outputs)
    model = build_model(spec, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a = kkt_regime_score(model, x, y, method="layerwise")
    b = kkt_regime_score(model, x, y, method="jacobian")
    assert a.score == pytest.approx(b.score, rel=1e-9, abs=1e-13)
    torch.testing.assert_close(a.multipliers, b.multipliers, rtol=1e-6, atol=1e-9)
    # float32 model: the layerwise path still accumulates in float64
    c = kkt_regime_score(model.float(), x.float(), y.float() if outputs == 1 else y, method="layerwise")
    assert c.score == pytest.approx(b.score, rel=1e-4, abs=1e-7)


def test_layerwise_refuses_other_models() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(9, 1), torch.nn.Tanh())
    x, y = _data(n=4)
    with pytest.raises(DataReconError, match="method 'layerwise' needs"):
        kkt_regime_score(model.double(), x, y, method="layerwise")
    assert 0.0 <= kkt_regime_score(model.double(), x, y).score <= 1.0  # auto falls back to jacobian
