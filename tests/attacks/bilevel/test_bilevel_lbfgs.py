"""L-BFGS, line searches and the two-loop recursion on problems with known answers (float64)."""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.bilevel.lbfgs import (
    LBFGSMemory,
    LBFGSSettings,
    armijo_backtracking,
    lbfgs_minimize,
    strong_wolfe,
    two_loop,
)
from datarecon.errors import DataReconError

DT = torch.float64


def _spd(n: int, seed: int, cond: float = 100.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=DT))
    eig = torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=DT)
    return q @ torch.diag(eig) @ q.T


def _quadratic(a: torch.Tensor, b: torch.Tensor):
    def fun(theta):
        return 0.5 * theta @ a @ theta - b @ theta, a @ theta - b
    return fun


@pytest.mark.parametrize("line_search", ["strong-wolfe", "armijo"])
def test_lbfgs_converges_on_quadratic(line_search):
    a = _spd(20, 0)
    b = torch.randn(20, generator=torch.Generator().manual_seed(1), dtype=DT)
    res = lbfgs_minimize(_quadratic(a, b), torch.zeros(20, dtype=DT), tol=1e-10, max_iter=500,
                         history=10, settings=LBFGSSettings(line_search=line_search))
    assert res.converged and res.stop_reason == "converged"
    torch.testing.assert_close(res.theta, torch.linalg.solve(a, b), rtol=0, atol=1e-8)
    # every kept pair has positive curvature and satisfies y = A s
    assert res.new_pairs
    for s, y in res.new_pairs:
        assert float(s @ y) > 0
        torch.testing.assert_close(y, a @ s, rtol=1e-9, atol=1e-9)


def test_lbfgs_does_not_mutate_inputs_and_warm_start_is_free():
    a, b = _spd(10, 2), torch.ones(10, dtype=DT)
    fun = _quadratic(a, b)
    theta0 = torch.zeros(10, dtype=DT)
    first = lbfgs_minimize(fun, theta0, tol=1e-11, max_iter=200)
    assert torch.equal(theta0, torch.zeros(10, dtype=DT))
    again = lbfgs_minimize(fun, first.theta, pairs=first.new_pairs, tol=1e-11, max_iter=200)
    assert again.iterations == 0 and again.evaluations == 1 and again.converged


def test_two_loop_equals_dense_inverse_with_conjugate_pairs():
    """With P A-conjugate pairs (here eigenvectors, y = A s) the BFGS matrix is exactly A⁻¹."""
    n = 8
    a = _spd(n, 3)
    _, vecs = torch.linalg.eigh(a)
    pairs = [(vecs[:, i].clone(), a @ vecs[:, i]) for i in range(n)]
    v = torch.randn(n, generator=torch.Generator().manual_seed(4), dtype=DT)
    torch.testing.assert_close(two_loop(pairs, v), torch.linalg.solve(a, v), rtol=1e-10, atol=1e-12)


def test_two_loop_secant_and_identity_without_pairs():
    a = _spd(6, 5)
    s = torch.randn(6, generator=torch.Generator().manual_seed(6), dtype=DT)
    y = a @ s
    torch.testing.assert_close(two_loop([(s, y)], y), s)  # H y = s for the newest pair
    v = torch.arange(6, dtype=DT)
    torch.testing.assert_close(two_loop([], v), v)


def test_memory_ring_buffer_keeps_newest_in_order():
    mem = LBFGSMemory.empty(3, 2, dtype=DT, device="cpu")
    for k in range(5):
        mem.push(torch.full((2,), float(k), dtype=DT), torch.full((2,), float(k) + 0.5, dtype=DT))
    got = [float(s[0]) for s, _ in mem.pairs()]
    assert got == [2.0, 3.0, 4.0] and mem.count == 3
    empty = LBFGSMemory.empty(0, 2, dtype=DT, device="cpu")
    empty.push(torch.ones(2, dtype=DT), torch.ones(2, dtype=DT))
    assert empty.pairs() == []


def test_logistic_from_uniform_start_converges_with_line_search():
    """METHODS §7: from θ⁰ ~ U(0,1) on saturated logistic loss undamped steps oscillate; with a
    line search L-BFGS converges, and the warm start then converges at once."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 30, generator=g, dtype=DT) * 3
    y = torch.sign(torch.randn(40, generator=g, dtype=DT))
    wd = 1e-2

    def fun(theta):
        th = theta.detach().requires_grad_(True)
        e = torch.nn.functional.softplus(-y * (x @ th)).mean() + 0.5 * wd * (th * th).sum()
        (grad,) = torch.autograd.grad(e, th)
        return e.detach(), grad

    theta0 = torch.rand(30, generator=g, dtype=DT)
    res = lbfgs_minimize(fun, theta0, tol=1e-9, max_iter=500)
    assert res.converged
    warm = lbfgs_minimize(fun, res.theta, pairs=res.new_pairs, tol=1e-9)
    assert warm.iterations == 0


@pytest.mark.parametrize("search", [strong_wolfe, armijo_backtracking], ids=["strong-wolfe", "armijo"])
def test_line_search_conditions(search):
    a, b = _spd(5, 7), torch.ones(5, dtype=DT)
    fun = _quadratic(a, b)
    theta = torch.zeros(5, dtype=DT)
    f0, g0 = fun(theta)
    d = -g0
    res = search(fun, theta, d, f0, g0, t=10.0)
    assert res.ok
    assert float(res.value) <= float(f0) + 1e-4 * res.t * float(g0 @ d)
    if search is strong_wolfe:
        assert abs(float(res.grad @ d)) <= 0.9 * abs(float(g0 @ d))


def test_unknown_line_search_lists_names():
    with pytest.raises(DataReconError, match="armijo, strong-wolfe"):
        lbfgs_minimize(_quadratic(_spd(3, 0), torch.ones(3, dtype=DT)), torch.zeros(3, dtype=DT),
                       settings=LBFGSSettings(line_search="newton"))
