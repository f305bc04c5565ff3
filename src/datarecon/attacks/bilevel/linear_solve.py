"""Inverse-Hessian products p ≈ [∇²_θE + μI]⁻¹ b, as pluggable strategies.

Each strategy is a pure function of a Hessian-vector product callable ``hvp: v ↦ H v`` (or
of curvature pairs) and a right-hand side b; none forms a dense Hessian.

* ``qn``      two-loop recursion over the inner L-BFGS curvature pairs, exactly the paper's
              update 7 (Runkel et al. 2024): no Hessian-vector product in the solve itself, a
              rough approximation (measured accuracy in docs/PERFORMANCE.md).
* ``cg``      conjugate gradients on (H + μI) p = b with exact HVPs, warm-started from the
              previous p; stops at a relative-residual tolerance; detects non-positive curvature.
* ``pcg``     the same, preconditioned by the L-BFGS inverse of the inner solve's pairs (the
              paper's quasi-Newton matrix used as a preconditioner, not as the answer): as exact
              as ``cg``; on the attack's systems it did not save HVPs (the warm-started ``cg``
              needs 6–17) and costs a two-loop recursion per iteration (docs/PERFORMANCE.md §5).
* ``neumann`` truncated Neumann series p = p₀ + α Σ_k (I − α(H + μI))ᵏ r₀ with α = 1/λ̂_max
              from a warm-started power iteration; stops at the tolerance; a growing residual
              is reported as divergence (then λ̂_max is re-estimated and the series restarted) or
              as negative curvature.

Every strategy tells the truth about its answer: after the solve it spends one HVP on the
relative residual ‖(H + μI)p − b‖ / ‖b‖ (and ‖Hp − b‖ / ‖b‖, the residual of the undamped
system, from the same product), and ``converged`` is true only when that residual is within
the tolerance.

:data:`LINEAR_SOLVERS` maps a name to an adapter ``(LinearSystem, SolveOptions) -> SolveResult``.

References: Nocedal & Wright (2006) Alg. 5.2 (CG), Alg. 5.3 (preconditioned CG), Alg. 7.4
(two-loop); Lorraine, Vicol & Duvenaud, "Optimizing Millions of Hyperparameters by Implicit
Differentiation" (AISTATS 2020) for the Neumann series; Runkel et al. 2024 update 7.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.bilevel.lbfgs import Pair, two_loop
from datarecon.registry import Registry

HVP = Callable[[torch.Tensor], torch.Tensor]
Preconditioner = Callable[[torch.Tensor], torch.Tensor]

NAN = float("nan")


@dataclass(frozen=True)
class SolveResult:
    """p ≈ (H + μI)⁻¹ b, what it cost, and how good it is.

    Attributes:
        p: (P,) solution.
        hvps: Hessian-vector products used, the residual check included.
        iterations: solver iterations (CG steps, Neumann terms, pairs for qn).
        residual: ‖(H + μI)p − b‖ / ‖b‖, computed from one HVP after the solve (0 when b = 0).
        residual_undamped: ‖Hp − b‖ / ‖b‖ from the same product: how far p is from H⁻¹b
            itself (equals ``residual`` when μ = 0; qn always solves the undamped system).
        converged: ``residual`` ≤ the tolerance.
        negative_curvature: the solve met a direction d with dᵀ(H + μI)d ≤ 0 (CG), or a
            Neumann residual that grew along negative curvature.
        diverged: the Neumann residual grew along a direction of positive curvature (α·λ > 2)
            and kept growing after ``neumann_restarts`` re-estimates of λ_max.
        lambda_max: Neumann only: the λ_max(H + μI) estimate behind α (NaN otherwise).
        alpha: Neumann only: the step α of the series (NaN otherwise).
        eigvec: Neumann only: the power iteration's last vector (warm start of the next one).
        restarts: Neumann only: restarts after a detected divergence.
        stop_reason: "converged" | "max_iter" | "negative-curvature" | "diverged" | "no-tolerance".
    """

    p: torch.Tensor
    hvps: int
    iterations: int
    residual: float = NAN
    residual_undamped: float = NAN
    converged: bool = False
    negative_curvature: bool = False
    diverged: bool = False
    lambda_max: float = NAN
    alpha: float = NAN
    eigvec: torch.Tensor | None = None
    restarts: int = 0
    stop_reason: str = ""


class _Counted:
    """v ↦ (H + μI)v, counting the products of H."""

    def __init__(self, hvp: HVP, damping: float) -> None:
        self.hvp, self.damping, self.count = hvp, damping, 0

    def plain(self, v: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return self.hvp(v)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        hv = self.plain(v)
        return hv + self.damping * v if self.damping else hv


def relative_residuals(hvp: HVP, p: torch.Tensor, b: torch.Tensor, *, damping: float = 0.0) -> tuple[float, float]:
    """(‖(H + μI)p − b‖ / ‖b‖, ‖Hp − b‖ / ‖b‖) from one product H·p.

    Args:
        hvp: v ↦ H v.
        p: (P,) candidate solution.
        b: (P,) right-hand side.
        damping: μ ≥ 0.

    Returns:
        The two relative residuals (0, 0 when b = 0 and p = 0; inf when b = 0 and p ≠ 0).
    """
    bnorm = float(torch.linalg.vector_norm(b))
    hp = hvp(p)
    r = hp - b
    res_u = float(torch.linalg.vector_norm(r))
    res_d = float(torch.linalg.vector_norm(r + damping * p)) if damping else res_u
    if bnorm == 0.0:
        return (0.0 if res_d == 0 else math.inf), (0.0 if res_u == 0 else math.inf)
    return res_d / bnorm, res_u / bnorm


def _finish(op: _Counted, p: torch.Tensor, b: torch.Tensor, tol: float, *, iterations: int, reason: str,
            **flags) -> SolveResult:
    res_d, res_u = relative_residuals(op.plain, p, b, damping=op.damping)
    converged = res_d <= tol and not flags.get("negative_curvature", False) and not flags.get("diverged", False)
    if converged:
        reason = "converged"
    elif reason == "converged":  # the recursion's residual said so; the true residual does not
        reason = "max_iter"
    return SolveResult(p, op.count, iterations, res_d, res_u, converged, stop_reason=reason, **flags)


def solve_qn(pairs: Sequence[Pair], b: torch.Tensor, *, hvp: HVP | None = None, tol: float = 1e-6) -> SolveResult:
    """p = H_LBFGS b by the two-loop recursion over ``pairs`` (Runkel et al. 2024, update 7).

    The answer is the paper's, unchanged; ``hvp`` (when given) is used once, only to report
    the residual ‖Hp − b‖ / ‖b‖ of that answer.

    Args:
        pairs: (s_i, y_i) curvature pairs, oldest first (identity when empty).
        b: (P,) right-hand side.
        hvp: v ↦ H v for the residual report (None: residual NaN, converged False).
        tol: the residual counted as converged.

    Returns:
        :class:`SolveResult` (``iterations`` = number of pairs).
    """
    p = two_loop(list(pairs), b)
    if hvp is None:
        return SolveResult(p, 0, len(pairs), stop_reason="no-tolerance")
    return _finish(_Counted(hvp, 0.0), p, b, tol, iterations=len(pairs), reason="no-tolerance")


def lbfgs_preconditioner(pairs: Sequence[Pair], *, damping: float = 0.0) -> Preconditioner | None:
    """M ≈ (H + μI)⁻¹ from curvature pairs: the two-loop recursion over (s, y + μs).

    Every pair of :func:`~datarecon.attacks.bilevel.lbfgs.lbfgs_minimize` has sᵀy > 0, so M is
    symmetric positive definite (a valid CG preconditioner) for any μ ≥ 0.

    Returns:
        v ↦ M v, or None when there are no pairs (then PCG is plain CG).
    """
    if not pairs:
        return None
    shifted = [(s, y + damping * s) if damping else (s, y) for s, y in pairs]
    return lambda v: two_loop(shifted, v)


def solve_cg(hvp: HVP, b: torch.Tensor, *, x0: torch.Tensor | None = None, tol: float = 1e-6,
             max_iter: int = 100, damping: float = 0.0, preconditioner: Preconditioner | None = None) -> SolveResult:
    """(Preconditioned) conjugate gradients on (H + μI) p = b.

    Args:
        hvp: v ↦ H v (H symmetric).
        b: (P,) right-hand side.
        x0: warm start (e.g. the previous outer step's p); zeros when None or all zero.
        tol: stop when the relative residual ‖r‖ / ‖b‖ ≤ tol (recursive residual; the reported
            one is recomputed from one more HVP).
        max_iter: iteration cap (one HVP each).
        damping: μ ≥ 0.
        preconditioner: v ↦ M v with M ≈ (H + μI)⁻¹ symmetric positive definite (None: plain CG).

    Returns:
        :class:`SolveResult`. On non-positive curvature dᵀ(H + μI)d ≤ 0 it stops and returns the
        current iterate (M b when that is still zero, the preconditioned steepest-descent
        direction) with ``negative_curvature=True``.
    """
    op = _Counted(hvp, damping)
    bnorm = float(torch.linalg.vector_norm(b))
    if bnorm == 0.0:
        return SolveResult(torch.zeros_like(b), 0, 0, 0.0, 0.0, True, stop_reason="converged")
    warm = x0 is not None and bool(torch.any(x0 != 0))
    if warm:
        p = x0.detach().clone()
        r = b - op(p)
    else:
        p = torch.zeros_like(b)
        r = b.clone()
    z = preconditioner(r) if preconditioner is not None else r
    d = z.clone()
    rz = torch.dot(r, z)
    it = 0
    reason = "max_iter"
    while True:
        if float(torch.linalg.vector_norm(r)) <= tol * bnorm:
            reason = "converged"
            break
        if it >= max_iter:
            break
        hd = op(d)
        curv = torch.dot(d, hd)
        if float(curv) <= 0.0:
            if it == 0 and not warm:
                p = preconditioner(b) if preconditioner is not None else b.clone()
            return _finish(op, p, b, tol, iterations=it, reason="negative-curvature", negative_curvature=True)
        alpha = rz / curv
        p.add_(d * alpha)
        r.sub_(hd * alpha)
        z = preconditioner(r) if preconditioner is not None else r
        rz_new = torch.dot(r, z)
        d.mul_(rz_new / rz).add_(z)
        rz = rz_new
        it += 1
    return _finish(op, p, b, tol, iterations=it, reason=reason)


def estimate_lambda_max(hvp: HVP, v0: torch.Tensor, *, iters: int = 20) -> tuple[float, float, torch.Tensor, int]:
    """The largest |eigenvalue| of a symmetric H by power iteration.

    Args:
        hvp: v ↦ H v.
        v0: (P,) start (warm start: the previous call's vector).
        iters: products of H.

    Returns:
        (‖Hv‖ for the last unit v — a lower bound of max |λ| that converges to it; the Rayleigh
        quotient vᵀHv, negative when the dominant eigenvalue is; the last unit vector; HVPs used).
    """
    nrm = float(torch.linalg.vector_norm(v0))
    v = v0 / nrm if nrm > 0 else torch.ones_like(v0) / math.sqrt(v0.numel())
    lam, rq = 0.0, 0.0
    used = 0
    for _ in range(iters):
        hv = hvp(v)
        used += 1
        rq = float(torch.dot(v, hv))
        lam = float(torch.linalg.vector_norm(hv))
        if lam == 0.0:
            break
        v = hv / lam
    return lam, rq, v, used


def solve_neumann(hvp: HVP, b: torch.Tensor, *, x0: torch.Tensor | None = None, eigvec: torch.Tensor | None = None,
                  options: SolveOptions | None = None) -> SolveResult:
    """Neumann series p = p₀ + α Σ_{k<K} (I − αA)ᵏ r₀, A = H + μI, r₀ = b − A p₀.

    The residual after K terms is exactly the next term (I − αA)ᴷ r₀, so the series stops once
    it is below ``tol``·‖b‖. With 0 < α ≤ 1/λ_max(A) and A positive definite every term is
    shorter than the last; a term that grows therefore means an eigenvalue λ with |1 − αλ| > 1:
    either λ < 0 (negative curvature: proved by a negative Rayleigh quotient of the growing
    term, or inferred when a power iteration from it finds no λ > 2/α; stop, report) or
    λ > 2/α (λ_max was underestimated: with α from the power iteration, restart with the new
    estimate, at most ``neumann_restarts`` times; then, or with a fixed α, report divergence). The
    term that started to grow is not added to p.

    Args:
        hvp: v ↦ H v (H symmetric).
        b: (P,) right-hand side.
        x0: warm start (e.g. the previous outer step's p).
        eigvec: warm start of the power iteration (default: b).
        options: ``tol`` (relative-residual tolerance), ``neumann_max_terms`` (cap on the terms, one
            HVP each), ``damping`` μ ≥ 0, ``neumann_alpha`` (fixed step α; None: α = 1/λ̂_max(A) by
            power iteration), ``power_iters`` (power-iteration products), ``neumann_restarts``
            (re-estimates of λ_max after a detected divergence); default ``SolveOptions()``.
            ``max_iter`` and ``warm_start`` are not read (``x0`` is the warm start).

    Returns:
        :class:`SolveResult` with ``lambda_max``, ``alpha``, ``eigvec`` and ``restarts``.

    References: Lorraine, Vicol & Duvenaud (AISTATS 2020), Alg. 3.
    """
    options = options or SolveOptions()
    tol, max_terms, alpha = options.tol, options.neumann_max_terms, options.neumann_alpha
    op = _Counted(hvp, options.damping)
    bnorm = float(torch.linalg.vector_norm(b))
    if bnorm == 0.0:
        return SolveResult(torch.zeros_like(b), 0, 0, 0.0, 0.0, True, stop_reason="converged")
    lam, vec = NAN, eigvec
    fixed_alpha = alpha is not None
    if alpha is None:
        lam, rq, vec, _ = estimate_lambda_max(op, eigvec if eigvec is not None else b, iters=options.power_iters)
        if rq <= 0.0:  # the dominant eigenvalue of A is negative: the series cannot converge
            return _finish(op, alpha_safe(lam) * b, b, tol, iterations=0, reason="negative-curvature",
                           negative_curvature=True, lambda_max=lam, alpha=alpha_safe(lam), eigvec=vec)
        alpha = 1.0 / lam
    warm = x0 is not None and bool(torch.any(x0 != 0))
    p0 = x0.detach().clone() if warm else torch.zeros_like(b)
    r0 = b - op(p0) if warm else b.clone()
    floor = 1e3 * torch.finfo(b.dtype).eps * bnorm
    done_restarts, terms = 0, 0
    while True:
        p, terms, reason, grew = _neumann_terms(op, p0, r0, alpha=alpha, stop=tol * bnorm, floor=floor, terms=terms,
                                                max_terms=max_terms)
        if grew is not None:
            reason, new_lam, new_vec = _neumann_growth(op, grew, alpha=alpha, power_iters=options.power_iters)
        if (grew is None or reason == "negative-curvature" or fixed_alpha
                or done_restarts >= options.neumann_restarts or terms >= max_terms):
            return _finish(op, p, b, tol, iterations=terms, reason=reason,
                           negative_curvature=reason == "negative-curvature", diverged=reason == "diverged",
                           lambda_max=lam, alpha=alpha, eigvec=vec, restarts=done_restarts)
        lam, vec = max(new_lam, lam), new_vec
        alpha = 1.0 / lam
        done_restarts += 1


def _neumann_terms(op: _Counted, p0: torch.Tensor, r0: torch.Tensor, *, alpha: float, stop: float, floor: float,
                   terms: int, max_terms: int) -> tuple[torch.Tensor, int, str, tuple[float, torch.Tensor] | None]:
    """Adds the terms α(I − αA)ᵏ r₀ to p₀ until the next term's norm is ≤ ``stop`` ("converged"),
    ``terms`` (counted over restarts) reaches ``max_terms`` ("max_iter"), or a term grows by more than
    a relative 1e-6 and is above ``floor`` (that term is not added).

    Returns:
        (p, terms, reason, grew): grew is None, or (vᵀAv / ‖v‖² of the last term v that was not
        added, the grown term (I − αA)v).
    """
    p, v = p0.clone(), r0.clone()
    vnorm = float(torch.linalg.vector_norm(v))
    while True:
        if vnorm <= stop:
            return p, terms, "converged", None
        if terms >= max_terms:
            return p, terms, "max_iter", None
        p.add_(v, alpha=alpha)  # p now has the residual (I − αA) v
        av = op(v)
        terms += 1
        v_next = v - alpha * av
        n_next = float(torch.linalg.vector_norm(v_next))
        if n_next > vnorm * (1.0 + 1e-6) and n_next > floor:
            p.sub_(v, alpha=alpha)  # drop the term that started to grow
            return p, terms, "max_iter", (float(torch.dot(v, av)) / (vnorm * vnorm), v_next)
        v, vnorm = v_next, n_next


def _neumann_growth(op: _Counted, grew: tuple[float, torch.Tensor], *, alpha: float,
                    power_iters: int) -> tuple[str, float, torch.Tensor | None]:
    """Why a Neumann term grew: "negative-curvature" or "diverged" (an eigenvalue λ > 2/α), with the
    power iteration's new λ_max estimate and vector (NaN, None when the Rayleigh quotient decided).

    Growth needs an eigenvalue with |1 − αλ| > 1: λ < 0, or λ > 2/α. A negative Rayleigh quotient
    proves λ < 0; otherwise a power iteration from the growing term (dominated by the offending
    eigenvectors) tells whether some λ > 2/α exists.
    """
    rayleigh, direction = grew
    if rayleigh < 0.0:
        return "negative-curvature", NAN, None
    new_lam, rq, new_vec, _ = estimate_lambda_max(op, direction, iters=power_iters)
    if rq < 0.0 or alpha * new_lam <= 2.0 * (1.0 + 1e-3):
        return "negative-curvature", new_lam, new_vec
    return "diverged", new_lam, new_vec


def alpha_safe(lam: float) -> float:
    """1/λ, or 1 when λ is not a positive finite number."""
    return 1.0 / lam if math.isfinite(lam) and lam > 0 else 1.0


# --------------------------------------------------------------------------- registry


class SolveOptions(BaseModel):
    """Parameters of the linear solve (each strategy reads the ones it needs).

    Attributes:
        tol: relative-residual tolerance ‖(H + μI)p − b‖ / ‖b‖ (cg, pcg, neumann; the residual
            every strategy reports is measured against it).
        max_iter: cg / pcg iteration cap.
        damping: μ, solve (H + μI) p = b (cg, pcg, neumann; qn solves the undamped system).
        neumann_max_terms: cap on the Neumann terms.
        neumann_alpha: fixed Neumann step α; None (default): 1/λ̂_max from a warm-started power
            iteration.
        power_iters: power-iteration products per estimate of λ_max.
        neumann_restarts: re-estimates of λ_max after a detected divergence.
        warm_start: start cg / pcg / neumann from the previous p.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tol: float = Field(default=1e-6, gt=0)
    max_iter: int = Field(default=100, ge=1)
    damping: float = Field(default=0.0, ge=0)
    neumann_max_terms: int = Field(default=5000, ge=1)
    neumann_alpha: float | None = Field(default=None, gt=0)
    power_iters: int = Field(default=10, ge=1)
    neumann_restarts: int = Field(default=2, ge=0)
    warm_start: bool = True


@dataclass(frozen=True)
class LinearSystem:
    """What a strategy may use: H·v, b, the previous solution, the inner pairs, a power-iteration vector."""

    hvp: HVP
    b: torch.Tensor
    previous: torch.Tensor | None = None
    pairs: Sequence[Pair] = field(default_factory=list)
    eigvec: torch.Tensor | None = None


Strategy = Callable[[LinearSystem, SolveOptions], SolveResult]
LINEAR_SOLVERS: Registry[Strategy] = Registry("inverse-Hessian strategy")


def _warm(system: LinearSystem, options: SolveOptions) -> torch.Tensor | None:
    return system.previous if options.warm_start else None


@LINEAR_SOLVERS.register("qn")
def _qn(system: LinearSystem, options: SolveOptions) -> SolveResult:
    return solve_qn(system.pairs, system.b, hvp=system.hvp, tol=options.tol)


@LINEAR_SOLVERS.register("cg")
def _cg(system: LinearSystem, options: SolveOptions) -> SolveResult:
    return solve_cg(system.hvp, system.b, x0=_warm(system, options), tol=options.tol, max_iter=options.max_iter,
                    damping=options.damping)


@LINEAR_SOLVERS.register("pcg")
def _pcg(system: LinearSystem, options: SolveOptions) -> SolveResult:
    return solve_cg(system.hvp, system.b, x0=_warm(system, options), tol=options.tol, max_iter=options.max_iter,
                    damping=options.damping,
                    preconditioner=lbfgs_preconditioner(list(system.pairs), damping=options.damping))


@LINEAR_SOLVERS.register("neumann")
def _neumann(system: LinearSystem, options: SolveOptions) -> SolveResult:
    return solve_neumann(system.hvp, system.b, x0=_warm(system, options), eigvec=system.eigvec, options=options)
