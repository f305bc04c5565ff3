"""Inverse-Hessian strategies against dense solves (float64, tiny problems)."""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.bilevel.linear_solve import (
    LINEAR_SOLVERS,
    LinearSystem,
    SolveOptions,
    solve_cg,
    solve_neumann,
    solve_qn,
)
from datarecon.attacks.bilevel.problem import HessianOperator
from datarecon.errors import DataReconError

DT = torch.float64


def _spd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, n, generator=g, dtype=DT)
    return m @ m.T / n + 0.1 * torch.eye(n, dtype=DT)


class Counting:
    def __init__(self, a):
        self.a, self.count = a, 0

    def __call__(self, v):
        self.count += 1
        return self.a @ v


def test_cg_matches_dense_solve_and_counts_hvps():
    a = _spd(30, 0)
    b = torch.randn(30, generator=torch.Generator().manual_seed(1), dtype=DT)
    hvp = Counting(a)
    res = solve_cg(hvp, b, tol=1e-12, max_iter=200)
    assert res.converged and not res.negative_curvature
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b), rtol=1e-9, atol=1e-10)
    assert res.hvps == hvp.count == res.iterations
    assert res.residual <= 1e-12


def test_cg_damping_and_warm_start():
    a = _spd(20, 2)
    b = torch.randn(20, generator=torch.Generator().manual_seed(3), dtype=DT)
    exact = torch.linalg.solve(a + 0.5 * torch.eye(20, dtype=DT), b)
    res = solve_cg(Counting(a), b, tol=1e-12, max_iter=200, damping=0.5)
    torch.testing.assert_close(res.p, exact, rtol=1e-9, atol=1e-10)
    warm = solve_cg(Counting(a), b, x0=exact, tol=1e-10, max_iter=200, damping=0.5)
    assert warm.iterations == 0 and warm.hvps == 1  # one product for the initial residual


def test_cg_detects_negative_curvature():
    a = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=DT))
    res = solve_cg(Counting(a), torch.ones(3, dtype=DT), tol=1e-12, max_iter=10)
    assert res.negative_curvature and not res.converged
    assert torch.isfinite(res.p).all()


def test_neumann_converges_for_small_step():
    a = _spd(10, 4)
    lmax = float(torch.linalg.eigvalsh(a).max())
    b = torch.ones(10, dtype=DT)
    res = solve_neumann(Counting(a), b, alpha=1.0 / lmax, terms=3000)
    torch.testing.assert_close(res.p, torch.linalg.solve(a, b), rtol=1e-8, atol=1e-8)
    assert res.hvps == 2999


def test_qn_needs_no_hvps():
    a = _spd(5, 5)
    _, vecs = torch.linalg.eigh(a)
    pairs = [(vecs[:, i].clone(), a @ vecs[:, i]) for i in range(5)]
    res = solve_qn(pairs, torch.ones(5, dtype=DT))
    assert res.hvps == 0
    torch.testing.assert_close(res.p, torch.linalg.solve(a, torch.ones(5, dtype=DT)))


def test_hessian_operator_matches_autograd_hessian(problem_factory):
    p = problem_factory("tanh-mlp", seed=1)
    theta = 0.3 * torch.randn(p.layout.size, generator=torch.Generator().manual_seed(0), dtype=DT)
    h = torch.autograd.functional.hessian(lambda t: p.energy(p.x, t), theta)
    op = HessianOperator(p.energy, p.x, theta)
    v = torch.randn(p.layout.size, generator=torch.Generator().manual_seed(1), dtype=DT)
    torch.testing.assert_close(op(v), h @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(op(v), h @ v, rtol=1e-10, atol=1e-12)  # graph reusable
    assert op.count == 2


def test_registry_lists_valid_names():
    assert LINEAR_SOLVERS.names() == ["cg", "neumann", "qn"]
    with pytest.raises(DataReconError, match="valid names: cg, neumann, qn"):
        LINEAR_SOLVERS.get("lu")
    a = _spd(4, 0)
    sol = LINEAR_SOLVERS.get("cg")(LinearSystem(hvp=Counting(a), b=torch.ones(4, dtype=DT)),
                                   SolveOptions(tol=1e-12))
    torch.testing.assert_close(sol.p, torch.linalg.solve(a, torch.ones(4, dtype=DT)))
