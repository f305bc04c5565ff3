"""Inverse-Hessian strategies against dense solves (float64, tiny problems).

Every strategy must tell the truth about itself: its reported relative residual is compared
with ‖(A + μI)p − b‖ / ‖b‖ computed densely here, and ``converged`` must agree with it.
"""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.bilevel.lbfgs import lbfgs_minimize
from datarecon.attacks.bilevel.linear_solve import (
    LINEAR_SOLVERS,
    LinearSystem,
    SolveOptions,
    estimate_lambda_max,
    lbfgs_preconditioner,
    solve_cg,
    solve_neumann,
    solve_qn,
)
from datarecon.attacks.bilevel.problem import (
    GaussNewtonOperator,
    HessianOperator,
    has_kinks,
    make_energy,
    with_activation,
)
from datarecon.errors import DataReconError

DT = torch.float64


def _spd(n: int, seed: int, *, cond: float | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if cond is None:
        m = torch.randn(n, n, generator=g, dtype=DT)
        return m @ m.T / n + 0.1 * torch.eye(n, dtype=DT)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=DT))
    return q @ torch.diag(torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=DT)) @ q.T


class Counting:
    def __init__(self, a):
        self.a, self.count = a, 0

    def __call__(self, v):
        self.count += 1
        return self.a @ v


def _dense_residual(a, p, b, mu=0.0):
    return float(((a + mu * torch.eye(len(b), dtype=DT)) @ p - b).norm() / b.norm())


def _b(n, seed=1):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=DT)


def test_cg_matches_dense_solve_and_reports_its_true_residual():
    a, b = _spd(30, 0), _b(30)
    hvp = Counting(a)
    res = solve_cg(hvp, b, tol=1e-12, max_iter=200)
    assert res.converged and not res.negative_curvature and res.stop_reason == "converged"
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b), rtol=1e-9, atol=1e-10)
    assert res.hvps == hvp.count == res.iterations + 1  # one product measures the residual
    assert res.residual == pytest.approx(_dense_residual(a, res.p, b), rel=1e-6, abs=1e-15)
    assert res.residual <= 1e-12


def test_cg_that_runs_out_of_iterations_says_so():
    a, b = _spd(40, 3, cond=1e4), _b(40)
    res = solve_cg(Counting(a), b, tol=1e-10, max_iter=5)
    assert not res.converged and res.stop_reason == "max_iter"
    assert res.residual == pytest.approx(_dense_residual(a, res.p, b), rel=1e-9)
    assert res.residual > 1e-10


def test_cg_damping_reports_both_residuals_and_warm_start():
    a, b = _spd(20, 2), _b(20, 3)
    eye = torch.eye(20, dtype=DT)
    exact = torch.linalg.solve(a + 0.5 * eye, b)
    res = solve_cg(Counting(a), b, tol=1e-12, max_iter=200, damping=0.5)
    torch.testing.assert_close(res.p, exact, rtol=1e-9, atol=1e-10)
    assert res.residual <= 1e-12
    # the undamped residual says how far the damped answer is from A⁻¹b
    assert res.residual_undamped == pytest.approx(_dense_residual(a, res.p, b), rel=1e-9)
    assert res.residual_undamped > 0.1
    warm = solve_cg(Counting(a), b, x0=exact, tol=1e-10, max_iter=200, damping=0.5)
    assert warm.iterations == 0 and warm.hvps == 2  # the initial residual, the final check


def test_pcg_with_exact_pairs_converges_in_one_step():
    """With P A-conjugate pairs the L-BFGS matrix is A⁻¹ exactly, so PCG needs one iteration."""
    a, b = _spd(8, 5), _b(8)
    _, vecs = torch.linalg.eigh(a)
    pairs = [(vecs[:, i].clone(), a @ vecs[:, i]) for i in range(8)]
    res = solve_cg(Counting(a), b, tol=1e-12, preconditioner=lbfgs_preconditioner(pairs))
    assert res.converged and res.iterations == 1
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b), rtol=1e-10, atol=1e-12)


def test_pcg_with_inner_lbfgs_pairs_is_exact_and_cheaper():
    """Pairs from an L-BFGS minimisation of ½θᵀAθ − cᵀθ precondition A: same answer, fewer HVPs."""
    a, b = _spd(60, 7, cond=1e3), _b(60)
    c = _b(60, 11)
    inner = lbfgs_minimize(lambda t: (0.5 * t @ a @ t - c @ t, a @ t - c), torch.zeros(60, dtype=DT),
                           tol=1e-8, max_iter=300, history=20)
    pairs = inner.new_pairs
    cg = solve_cg(Counting(a), b, tol=1e-8, max_iter=500)
    pcg = LINEAR_SOLVERS.get("pcg")(LinearSystem(hvp=Counting(a), b=b, pairs=pairs),
                                    SolveOptions(tol=1e-8, max_iter=500))
    exact = torch.linalg.solve(a, b)
    for res in (cg, pcg):
        assert res.converged
        assert float((res.p - exact).norm() / exact.norm()) < 1e-5
    assert pcg.hvps < cg.hvps


def test_pcg_preconditioner_with_damping_is_positive_definite():
    a = _spd(10, 8)
    _, vecs = torch.linalg.eigh(a)
    pairs = [(vecs[:, i].clone(), a @ vecs[:, i]) for i in range(10)]
    m = lbfgs_preconditioner(pairs, damping=2.0)
    dense = torch.stack([m(e) for e in torch.eye(10, dtype=DT)], dim=1)
    torch.testing.assert_close(dense, torch.linalg.inv(a + 2.0 * torch.eye(10, dtype=DT)), rtol=1e-9, atol=1e-11)
    assert lbfgs_preconditioner([]) is None


def test_cg_detects_negative_curvature():
    a = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=DT))
    b = torch.ones(3, dtype=DT)
    res = solve_cg(Counting(a), b, tol=1e-12, max_iter=10)
    assert res.negative_curvature and not res.converged and res.stop_reason == "negative-curvature"
    assert torch.isfinite(res.p).all()
    assert res.residual == pytest.approx(_dense_residual(a, res.p, b), rel=1e-9)


def test_neumann_sets_alpha_from_power_iteration_and_converges():
    a, b = _spd(10, 4), torch.ones(10, dtype=DT)
    lmax = float(torch.linalg.eigvalsh(a).max())
    res = solve_neumann(Counting(a), b, options=SolveOptions(tol=1e-8, neumann_max_terms=20000, power_iters=50))
    assert res.converged and res.stop_reason == "converged"
    assert res.lambda_max == pytest.approx(lmax, rel=1e-2) and res.alpha == pytest.approx(1 / res.lambda_max)
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b), rtol=1e-6, atol=1e-7)
    assert res.residual == pytest.approx(_dense_residual(a, res.p, b), rel=1e-6)


def test_neumann_short_series_does_not_claim_convergence():
    a, b = _spd(30, 3, cond=1e3), _b(30)
    res = solve_neumann(Counting(a), b, options=SolveOptions(tol=1e-8, neumann_max_terms=50))
    assert not res.converged and res.stop_reason == "max_iter"
    assert res.residual == pytest.approx(_dense_residual(a, res.p, b), rel=1e-9)
    assert res.residual > 1e-8


def test_neumann_detects_divergence_of_a_too_large_step():
    """α = 3/λ_max: the top eigencomponent grows by |1 − 3| = 2 per term."""
    a, b = _spd(10, 4), _b(10)
    lmax = float(torch.linalg.eigvalsh(a).max())
    res = solve_neumann(Counting(a), b, options=SolveOptions(neumann_alpha=3.0 / lmax, tol=1e-8, neumann_max_terms=5000,
                                                           neumann_restarts=0))
    assert res.diverged and not res.converged and res.stop_reason == "diverged"
    assert res.hvps < 200  # stopped once the residual grew, not after 5000 terms
    assert torch.isfinite(res.p).all() and float(res.p.norm()) < 10 * float(torch.linalg.solve(a, b).norm())


def test_neumann_restarts_after_an_underestimated_lambda_max():
    """A warm start on the eigenvector of the smallest eigenvalue makes the power iteration
    return λ_min (an exact eigenvector is invariant): α = 1/λ_min is far too large; the growing
    residual is detected, λ_max re-estimated from it, and the series restarted."""
    a, b = _spd(10, 4), _b(10)
    evals, vecs = torch.linalg.eigh(a)
    res = solve_neumann(Counting(a), b, eigvec=vecs[:, 0].clone(),
                        options=SolveOptions(tol=1e-8, neumann_max_terms=20000, power_iters=5))
    assert res.restarts >= 1 and res.converged and not res.diverged
    assert res.lambda_max == pytest.approx(float(evals.max()), rel=1e-2)
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b), rtol=1e-6, atol=1e-7)


def test_neumann_reports_negative_curvature_instead_of_blowing_up():
    """The issue's ReLU case: α = 1/λ_max and 5000 terms on an indefinite matrix blew up to
    4e20× and still said converged. Now the growth is caught and reported."""
    d = torch.tensor([2.0, 1.0, 0.5, -0.05], dtype=DT)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=DT))
    a = q @ torch.diag(d) @ q.T
    b = torch.ones(4, dtype=DT)
    res = solve_neumann(Counting(a), b, options=SolveOptions(neumann_alpha=0.5, tol=1e-10, neumann_max_terms=5000))
    assert res.negative_curvature and not res.converged and res.stop_reason == "negative-curvature"
    assert float(res.p.norm()) < 1e3 and res.hvps < 5000
    assert res.residual == pytest.approx(_dense_residual(a, res.p, b), rel=1e-9)
    # a dominant negative eigenvalue is caught by the power iteration itself
    res2 = solve_neumann(Counting(-a), b, options=SolveOptions(tol=1e-10, neumann_max_terms=5000))
    assert res2.negative_curvature and not res2.converged


def test_power_iteration_matches_eigvalsh_and_warm_start_helps():
    a = _spd(40, 9, cond=50.0)
    lmax = float(torch.linalg.eigvalsh(a).max())
    lam, rq, v, used = estimate_lambda_max(Counting(a), _b(40), iters=300)
    assert lam == pytest.approx(lmax, rel=1e-8) and rq == pytest.approx(lmax, rel=1e-8) and used == 300
    cold, *_ = estimate_lambda_max(Counting(a), _b(40), iters=3)
    warm, *_ = estimate_lambda_max(Counting(a), v, iters=3)
    assert abs(warm - lmax) < abs(cold - lmax)


def test_qn_reports_its_residual_and_only_exact_pairs_converge():
    a = _spd(5, 5)
    _, vecs = torch.linalg.eigh(a)
    b = torch.ones(5, dtype=DT)
    pairs = [(vecs[:, i].clone(), a @ vecs[:, i]) for i in range(5)]
    res = solve_qn(pairs, b, hvp=Counting(a))
    assert res.hvps == 1 and res.converged
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b))
    rough = solve_qn(pairs[:2], b, hvp=Counting(a))  # two pairs: the two-loop matrix is not A⁻¹
    assert not rough.converged
    assert rough.residual == pytest.approx(_dense_residual(a, rough.p, b), rel=1e-9) and rough.residual > 1e-3


def test_hessian_operator_matches_autograd_hessian(problem_factory):
    p = problem_factory("tanh-mlp", seed=1)
    theta = 0.3 * torch.randn(p.layout.size, generator=torch.Generator().manual_seed(0), dtype=DT)
    h = torch.autograd.functional.hessian(lambda t: p.energy(p.x, t), theta)
    op = HessianOperator(p.energy, p.x, theta)
    v = torch.randn(p.layout.size, generator=torch.Generator().manual_seed(1), dtype=DT)
    torch.testing.assert_close(op(v), h @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(op(v), h @ v, rtol=1e-10, atol=1e-12)  # graph reusable
    assert op.count == 2


@pytest.mark.parametrize("kind", ["relu-mlp", "tanh-mlp"])
def test_gauss_newton_operator_matches_dense_jacobian_formula(problem_factory, kind):
    """G = Jᵀ ∇²_ΦL J + wd·I with J from autograd's dense Jacobian and ∇²_ΦL dense."""
    p = problem_factory(kind, seed=2)
    theta = 0.5 * torch.randn(p.layout.size, generator=torch.Generator().manual_seed(3), dtype=DT)
    jac = torch.autograd.functional.jacobian(lambda t: p.energy.outputs(p.x, t).reshape(-1), theta)
    out = p.energy.outputs(p.x, theta).detach()
    hl = torch.autograd.functional.hessian(lambda o: p.energy.data_loss(o.reshape(out.shape)), out.reshape(-1))
    g = jac.T @ hl @ jac + p.wd * torch.eye(p.layout.size, dtype=DT)
    op = GaussNewtonOperator(p.energy, p.x, theta)
    v = torch.randn(p.layout.size, generator=torch.Generator().manual_seed(4), dtype=DT)
    torch.testing.assert_close(op(v), g @ v, rtol=1e-10, atol=1e-12)
    assert float(torch.linalg.eigvalsh(g).min()) >= p.wd - 1e-12  # positive definite
    # the mixed product is E's exact one (same as the Hessian operator's)
    torch.testing.assert_close(op.mixed(v), HessianOperator(p.energy, p.x, theta).mixed(v), rtol=1e-12, atol=1e-14)


def test_gauss_newton_equals_hessian_for_an_affine_model(problem_factory):
    """Φ linear in θ: ∇²_θΦ = 0, so G is the Hessian exactly."""
    p = problem_factory("affine", seed=0)
    theta = torch.randn(p.layout.size, generator=torch.Generator().manual_seed(5), dtype=DT)
    v = torch.randn(p.layout.size, generator=torch.Generator().manual_seed(6), dtype=DT)
    torch.testing.assert_close(GaussNewtonOperator(p.energy, p.x, theta)(v), HessianOperator(p.energy, p.x, theta)(v),
                               rtol=1e-11, atol=1e-13)


def test_softplus_surrogate_replaces_relu_only(problem_factory):
    from torch import nn

    p = problem_factory("relu-mlp", seed=0)
    smooth = with_activation(p.model, lambda m: nn.Softplus(beta=50.0) if type(m) is nn.ReLU else None)
    assert has_kinks(p.model) and not has_kinks(smooth) and not has_kinks(problem_factory("tanh-mlp").model)
    assert any(isinstance(m, nn.ReLU) for m in p.model.modules())  # the original is untouched
    e_s = make_energy(smooth, p.layout, p.labels, loss=p.loss, weight_decay=p.wd)
    theta = torch.randn(p.layout.size, generator=torch.Generator().manual_seed(0), dtype=DT)
    # softplus_β → ReLU as β grows: |softplus_β(z) − relu(z)| ≤ log 2 / β
    assert abs(float(e_s(p.x, theta)) - float(p.energy(p.x, theta))) < 0.1


def test_registry_lists_valid_names():
    assert LINEAR_SOLVERS.names() == ["cg", "neumann", "pcg", "qn"]
    with pytest.raises(DataReconError, match="valid names: cg, neumann, pcg, qn"):
        LINEAR_SOLVERS.get("lu")
    a = _spd(4, 0)
    sol = LINEAR_SOLVERS.get("cg")(LinearSystem(hvp=Counting(a), b=torch.ones(4, dtype=DT)),
                                   SolveOptions(tol=1e-12))
    torch.testing.assert_close(sol.p, torch.linalg.solve(a, torch.ones(4, dtype=DT)))
