"""The implicit hypergradient of x ↦ ‖θ* − θ(x)‖² against central finite differences (float64).

θ(x) in the finite differences is solved by L-BFGS to ‖∇E‖ ≤ 1e-12 from the unperturbed
solution; step h = 1e-4 (truncation O(h²) ≈ 1e-8 relative, solve noise 1e-12/h ≈ 1e-8).

Measured relative errors ‖g − g_FD‖ / ‖g_FD‖ (seeds 0–2), and the bounds asserted:

* cg (tol 1e-12): 5e-8 – 2.5e-7 on every problem → asserted < 1e-6 (the brief's bound).
* neumann (α = 1/λ_max, 100 terms): equal to cg on the affine problem (H well
  conditioned, λ_min/λ_max ≈ 0.2 because wd = 0.1) → < 1e-6; on the tanh MLP (λ_min/λ_max
  down to 0.006) 2e-7 – 9e-4 → asserted < 2e-3.
* qn (two-loop over the last 10 inner L-BFGS pairs, no HVPs): a rough approximation:
  affine 0.15 – 0.47 (cosine ≥ 0.88) → asserted rel < 0.6, cosine > 0.8; tanh MLP
  0.46 – 1.4 (cosine 0.27 – 0.97) → asserted only to be a descent direction (cosine > 0.2).

ReLU networks are not tested against finite differences: with weight decay the minimisers of
a ReLU MLP put some pre-activations exactly on the kink (dead units collapse to 0), where the
energy is not twice differentiable; the inner L-BFGS then stalls at ‖∇E‖ ≈ 1e-3 and the
Hessian at the returned point is indefinite (measured on 12 seeds), so the implicit function
theorem does not apply there. A smooth activation (tanh) is used for the one-hidden test.
"""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.bilevel.hypergrad import hypergradient
from datarecon.attacks.bilevel.linear_solve import SolveOptions

DT = torch.float64
H_FD = 1e-4

# (kind, strategy) -> (max relative error, min cosine)
BOUNDS = {
    ("affine", "cg"): (1e-6, 0.999999),
    ("affine", "neumann"): (1e-6, 0.999999),
    ("affine", "qn"): (0.6, 0.8),
    ("tanh-mlp", "cg"): (1e-6, 0.999999),
    ("tanh-mlp", "neumann"): (2e-3, 0.9999),
    ("tanh-mlp", "qn"): (float("inf"), 0.2),
}


@pytest.fixture(scope="module")
def solved(problem_factory, fd):
    """{(kind, seed): (problem, inner result, finite-difference gradient, λ_max)}."""
    out = {}
    for kind in ("affine", "tanh-mlp"):
        for seed in (0, 1, 2):
            p = problem_factory(kind, seed=seed)
            theta0 = torch.rand(p.layout.size, generator=torch.Generator().manual_seed(seed), dtype=DT)
            inner = p.solve(p.x, theta0)
            assert inner.converged
            th = inner.theta
            grad_fd = fd(lambda z: p.outer(z, th), p.x, H_FD)
            lmax = float(torch.linalg.eigvalsh(torch.autograd.functional.hessian(lambda t: p.energy(p.x, t), th)).max())
            out[(kind, seed)] = (p, inner, grad_fd, lmax)
    return out


@pytest.mark.parametrize("strategy", ["cg", "neumann", "qn"])
@pytest.mark.parametrize("kind", ["affine", "tanh-mlp"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hypergradient_matches_finite_differences(solved, kind, strategy, seed):
    p, inner, fd, lmax = solved[(kind, seed)]
    opts = SolveOptions(tol=1e-12, max_iter=100, neumann_alpha=1.0 / lmax)
    hg = hypergradient(p.energy, p.x, inner.theta, p.theta_star, strategy=strategy, options=opts,
                       pairs=inner.new_pairs[-10:])
    rel = float((hg.grad_x - fd).norm() / fd.norm())
    cos = float((hg.grad_x * fd).sum() / (hg.grad_x.norm() * fd.norm()))
    max_rel, min_cos = BOUNDS[(kind, strategy)]
    assert rel < max_rel, f"{kind}/{strategy}: relative error {rel:.3g}"
    assert cos > min_cos, f"{kind}/{strategy}: cosine {cos:.4f}"
    if strategy == "qn":
        assert hg.solve.hvps == 0
    assert float(hg.upper) == pytest.approx(float(((inner.theta - p.theta_star) ** 2).sum()))


def test_ridge_hypergradient_matches_closed_form():
    """Ridge regression (affine model, mse, wd): θ(x) = argmin (1/m)‖Xθ − y‖² + (wd/2)‖θ‖² in closed
    form, so x ↦ ‖θ* − θ(x)‖² can be differentiated by autograd through a dense solve."""
    from torch import nn

    from datarecon.attacks.bilevel.lbfgs import lbfgs_minimize
    from datarecon.attacks.bilevel.problem import FlatLayout, make_energy, value_and_grad

    g = torch.Generator().manual_seed(0)
    m, d, wd = 8, 5, 0.05
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, 1, bias=False, dtype=DT))
    layout = FlatLayout({k: v.detach() for k, v in model.named_parameters()})
    x = torch.randn(m, 1, 1, d, generator=g, dtype=DT)
    y = torch.randn(m, generator=g, dtype=DT)
    theta_star = torch.randn(d, generator=g, dtype=DT)
    energy = make_energy(model, layout, y, loss="mse", weight_decay=wd)

    def closed(xx):
        a = xx.reshape(m, d)
        return torch.linalg.solve(2.0 / m * a.T @ a + wd * torch.eye(d, dtype=DT), 2.0 / m * a.T @ y)

    xr = x.clone().requires_grad_(True)
    ((closed(xr) - theta_star) ** 2).sum().backward()
    inner = lbfgs_minimize(value_and_grad(energy, x), torch.zeros(d, dtype=DT), tol=1e-13, max_iter=200)
    torch.testing.assert_close(inner.theta, closed(x), rtol=1e-10, atol=1e-11)
    hg = hypergradient(energy, x, inner.theta, theta_star, strategy="cg", options=SolveOptions(tol=1e-13))
    torch.testing.assert_close(hg.grad_x, xr.grad, rtol=1e-9, atol=1e-11)
    # the dense Hessian inverse gives the same p
    h = torch.autograd.functional.hessian(lambda t: energy(x, t), inner.theta)
    torch.testing.assert_close(hg.p, torch.linalg.solve(h, 2 * (inner.theta - theta_star)), rtol=1e-9, atol=1e-12)


def test_normalised_upper_loss_scales_gradient(solved):
    p, inner, fd, _ = solved[("affine", 0)]
    opts = SolveOptions(tol=1e-12)
    sq = hypergradient(p.energy, p.x, inner.theta, p.theta_star, strategy="cg", options=opts)
    nrm = hypergradient(p.energy, p.x, inner.theta, p.theta_star, upper="normalised", strategy="cg", options=opts)
    scale = float((p.theta_star ** 2).sum())
    torch.testing.assert_close(nrm.grad_x * scale, sq.grad_x, rtol=1e-9, atol=1e-12)
