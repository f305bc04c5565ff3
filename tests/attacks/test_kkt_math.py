"""Pure KKT math against independent references: planted solutions, naive loops, finite differences."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from datarecon.attacks import kkt_math, priors


def _mlp(d_in: int, hidden: int, k: int, *, bias: bool, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(d_in, hidden, bias=bias), nn.ReLU(),
                         nn.Linear(hidden, k, bias=bias)).double()


def _fwd(model: nn.Module):
    return lambda x, p: functional_call(model, dict(p), (x,))


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_planted_linear_residual_is_zero():
    """Bias-free linear Φ(x) = w·x: θ* = (1/m) Σ λ_i y_i x_i exactly ⇒ R = 0."""
    g = torch.Generator().manual_seed(0)
    m, shape = 6, (1, 3, 3)
    x = torch.randn(m, *shape, generator=g, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, -1, 1, -1], dtype=torch.float64)
    lam = torch.rand(m, generator=g, dtype=torch.float64) + 0.5
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 1, bias=False)).double()
    w = ((lam * y)[:, None] * x.reshape(m, -1)).sum(0, keepdim=True) / m
    params = {"1.weight": w}
    gr = kkt_math.combination_gradient(_fwd(model), params, x, y, lam, margin="binary", create_graph=False)
    assert kkt_math.stationarity_residual(params, gr).item() < 1e-28
    # and a perturbed x gives a positive residual
    gr2 = kkt_math.combination_gradient(_fwd(model), params, x + 0.1, y, lam, margin="binary", create_graph=False)
    assert kkt_math.stationarity_residual(params, gr2).item() > 1e-4


@pytest.mark.parametrize("margin,k", [("binary", 1), ("multiclass", 3), ("regression", 1)],
                         ids=["binary", "multiclass", "regression"])
def test_batched_gradient_equals_naive_loop(margin, k):
    model = _mlp(8, 5, k, bias=True)
    params = _params(model)
    g = torch.Generator().manual_seed(1)
    m = 7
    x = torch.randn(m, 1, 2, 4, generator=g, dtype=torch.float64)
    y = (torch.randint(0, k, (m,), generator=g) if margin == "multiclass"
         else torch.where(torch.rand(m, generator=g) > 0.5, 1.0, -1.0).double())
    lam = torch.rand(m, generator=g, dtype=torch.float64)
    fwd = _fwd(model)
    batched = kkt_math.combination_gradient(fwd, params, x, y, lam, margin=margin, create_graph=False)
    naive = {n: torch.zeros_like(p) for n, p in params.items()}
    fn = kkt_math.MARGINS.get(margin).fn
    for i in range(m):  # independent reference: per-sample gradients summed
        leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        out = fn(fwd(x[i:i + 1], leaves), y[i:i + 1], lam[i:i + 1]).sum()
        for n, gr in zip(leaves, torch.autograd.grad(out, list(leaves.values()))):
            naive[n] += gr / m
    for n in params:
        torch.testing.assert_close(batched[n], naive[n], rtol=1e-12, atol=1e-14)


def test_margins_hand_computed():
    out = torch.tensor([[1.0, 3.0, 2.0], [0.5, -1.0, 4.0]], dtype=torch.float64)
    y = torch.tensor([1, 0])
    lam = torch.tensor([2.0, 0.5], dtype=torch.float64)
    # sample 0: true 3, best other 2 → 2·1 = 2; sample 1: true 0.5, best other 4 → 0.5·(−3.5) = −1.75
    torch.testing.assert_close(kkt_math.multiclass_margin(out, y, lam), torch.tensor([2.0, -1.75], dtype=torch.float64))
    o1 = torch.tensor([[2.0], [-3.0]], dtype=torch.float64)
    yb = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(kkt_math.binary_margin(o1, yb, lam), torch.tensor([-4.0, -1.5], dtype=torch.float64))
    lam_signed = torch.tensor([-2.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(kkt_math.regression_margin(o1, yb, lam_signed),
                               torch.tensor([-4.0, -1.5], dtype=torch.float64))


def test_box_and_hinge_hand_computed():
    x = torch.tensor([-2.0, 0.0, 1.5], dtype=torch.float64)
    assert priors.box_penalty(x, -1.0, 1.0).item() == pytest.approx(1.0 + 0.25)
    lam = torch.tensor([0.1, 0.6], dtype=torch.float64)
    assert kkt_math.lambda_hinge(lam, 0.5).item() == pytest.approx(0.16)


def test_regression_has_no_hinge():
    model = _mlp(4, 3, 1, bias=False)
    x = torch.randn(3, 1, 2, 2, dtype=torch.float64)
    lam = torch.tensor([-5.0, 0.0, 1.0], dtype=torch.float64)
    t = kkt_math.kkt_terms(_fwd(model), _params(model), x, torch.ones(3, dtype=torch.float64), lam,
                           objective=kkt_math.KKTObjective(margin="regression", lambda_min=0.5, lambda_min_weight=5.0,
                                                           box_weight=1.0), box=(-1, 1))
    assert t["lambda_hinge"].item() == 0.0


@pytest.mark.parametrize("margin,k", [("binary", 1), ("multiclass", 3)], ids=["binary", "multiclass"])
def test_gradcheck_residual_wrt_x_and_lambda(margin, k, kkt_gradcheck):
    """float64 finite differences of L(x, λ) on a smooth network (softplus: forward and backward agree;
    the ReLU surrogate's forward has kinks, so finite differences would not see sigmoid(αz))."""
    base = _mlp(6, 4, k, bias=False, seed=3)
    model = nn.Sequential(base[0], base[1], nn.Softplus(beta=3.0), base[3])
    kkt_gradcheck(model, _params(base), input_shape=(1, 2, 3), margin=margin, k=k)


def test_gradnorm_matches_explicit_gradient():
    from datarecon.kernel.losses import energy

    model = _mlp(4, 3, 1, bias=True)
    params = _params(model)
    x = torch.randn(5, 1, 2, 2, dtype=torch.float64)
    y = torch.tensor([1.0, -1, 1, 1, -1]).double()
    t = kkt_math.gradnorm_terms(_fwd(model), params, x, y, box=(-10, 10),
                                objective=kkt_math.GradNormObjective(loss="logistic", weight_decay=0.1, box_weight=1.0))
    leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    e = energy(_fwd(model)(x, leaves), y, leaves, loss="logistic", weight_decay=0.1)
    ref = sum((gr ** 2).sum() for gr in torch.autograd.grad(e, list(leaves.values())))
    assert t["residual"].item() == pytest.approx(ref.item(), rel=1e-12)


def test_per_candidate_directional_matches_loop():
    model = _mlp(4, 3, 2, bias=True)
    params = _params(model)
    x = torch.randn(5, 1, 2, 2, dtype=torch.float64)
    v = {n: torch.randn_like(p) for n, p in params.items()}
    d = kkt_math.per_candidate_directional(_fwd(model), params, x, v)
    for i in range(5):
        for j in range(2):
            leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
            gr = torch.autograd.grad(_fwd(model)(x[i:i + 1], leaves)[0, j], list(leaves.values()))
            ref = sum((a * v[n]).sum() for a, n in zip(gr, leaves))
            assert d[i, j].item() == pytest.approx(ref.item(), rel=1e-10, abs=1e-12)


def test_box_value_and_grad_equals_autograd_of_box_penalty():
    g = torch.Generator().manual_seed(3)
    x = (2.0 * torch.rand(5, 3, 4, 4, generator=g, dtype=torch.float64) - 1.0).requires_grad_(True)
    lo = -0.4 * torch.ones(3, 4, 4, dtype=torch.float64)
    hi = torch.full((3, 4, 4), 0.3, dtype=torch.float64)
    with torch.no_grad():
        x[0, 0, 0, 0] = 0.3  # exactly on a bound
    ref = priors.box_penalty(x, lo, hi)
    (ref_grad,) = torch.autograd.grad(ref, x)
    value, grad = priors.box_value_and_grad(x.detach(), lo, hi)
    torch.testing.assert_close(value, ref.detach(), rtol=1e-15, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-15, atol=0)
    assert float(ref) > 0  # some pixels are outside the box


@pytest.mark.parametrize("margin,k", [("binary", 1), ("multiclass", 3), ("regression", 1)])
def test_seeded_backward_equals_autograd_of_the_objective(margin, k):
    """kkt_residual_and_grads (g's backward seeded by ∂R/∂g) gives the values and gradients of
    autograd on kkt_terms without the box prior, float64, with biases (some g_p independent of x)."""
    model = _mlp(6, 5, k, bias=True, seed=4)
    params = _params(model)
    g = torch.Generator().manual_seed(5)
    m = 4
    x = torch.randn(m, 1, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, k, (m,), generator=g) if margin == "multiclass" else torch.tensor([1.0, -1, 1, -1]).double()
    lam = (torch.rand(m, generator=g, dtype=torch.float64) - 0.2).requires_grad_(True)  # some below λ_min
    objective = kkt_math.KKTObjective(margin=margin, lambda_min=0.5, lambda_min_weight=5.0, box_weight=1.0)
    ref = kkt_math.kkt_terms(_fwd(model), params, x, y, lam, objective=objective, box=None)
    rx, rl = torch.autograd.grad(ref["loss"], [x, lam])
    terms, gx, gl = kkt_math.kkt_residual_and_grads(_fwd(model), params, x, y, lam, objective=objective)
    for key in ("loss", "residual", "lambda_hinge"):
        torch.testing.assert_close(terms[key], ref[key].detach(), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gl, rl, rtol=1e-12, atol=1e-14)
    if margin != "regression":
        assert float(terms["lambda_hinge"]) > 0
