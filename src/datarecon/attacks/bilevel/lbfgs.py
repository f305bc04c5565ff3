"""L-BFGS for the inner problem θ(x) = argmin_θ E(x, y; θ), with its curvature pairs kept.

The curvature pairs (s_k, y_k) = (θ_{k+1} − θ_k, ∇E(θ_{k+1}) − ∇E(θ_k)) serve twice: as the
inner solver's quasi-Newton model, and — through :func:`two_loop` — as the approximation
H ≈ [∇²_θE]⁻¹ of the paper's update 7 (strategy "qn", no extra Hessian products).

* :class:`LBFGSMemory`: a fixed-size ring buffer of pairs stored in two (size, P) tensors
  (so an attack can keep them in its checkpointable state dict, bit-identically).
* :func:`two_loop`: H·v by the two-loop recursion (Nocedal & Wright, Alg. 7.4), H₀ = γI with
  γ = sᵀy / yᵀy of the newest pair.
* :func:`lbfgs_minimize`: L-BFGS with a strong-Wolfe (default) or Armijo backtracking line
  search (:class:`LBFGSSettings`; the searches' constants: :class:`LineSearchSettings`). A line
  search is required: undamped (quasi-)Newton steps from θ⁰ ~ U(0,1) oscillate
  on saturated logistic losses (METHODS §7). Pure-ish: it does not mutate the memory it is
  given; it returns the new pairs, and the caller commits them (so a non-finite step can be
  discarded without touching the state).

Memory: each pair costs 2P numbers (the one-hidden CIFAR target, P = 18.9 M, float32:
151 MB per pair; history 10 ≈ 1.5 GB).

References: Nocedal & Wright, Numerical Optimization (2006), Alg. 3.5/3.6 (strong-Wolfe line
search with zoom), Alg. 7.4/7.5 (L-BFGS two-loop recursion); Runkel et al. 2024 update 7.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from datarecon.registry import Registry

Pair = tuple[torch.Tensor, torch.Tensor]
ValueGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class LBFGSMemory:
    """Ring buffer of up to ``size`` curvature pairs in preallocated tensors.

    Args:
        s, y: (size, P) storage (may be views into an attack's state dict; written in place).
        meta: int64 tensor [count, head] (written in place); head = next slot to write.
    """

    def __init__(self, s: torch.Tensor, y: torch.Tensor, meta: torch.Tensor) -> None:
        self.s, self.y, self.meta = s, y, meta

    @classmethod
    def empty(cls, size: int, numel: int, *, dtype: torch.dtype, device: torch.device | str) -> LBFGSMemory:
        """A memory with no pairs."""
        return cls(torch.zeros(size, numel, dtype=dtype, device=device),
                   torch.zeros(size, numel, dtype=dtype, device=device),
                   torch.zeros(2, dtype=torch.int64))

    @property
    def size(self) -> int:
        return int(self.s.shape[0])

    @property
    def count(self) -> int:
        return int(self.meta[0])

    def pairs(self) -> list[Pair]:
        """Stored pairs, oldest first (views, not copies)."""
        count, head = int(self.meta[0]), int(self.meta[1])
        idx = [(head - count + i) % self.size for i in range(count)] if self.size else []
        return [(self.s[i], self.y[i]) for i in idx]

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        """Add a pair, dropping the oldest when full."""
        if self.size == 0:
            return
        head = int(self.meta[1])
        self.s[head].copy_(s)
        self.y[head].copy_(y)
        self.meta[1] = (head + 1) % self.size
        self.meta[0] = min(int(self.meta[0]) + 1, self.size)

    def extend(self, pairs: Sequence[Pair]) -> None:
        """Add pairs in order (oldest first)."""
        for s, y in pairs:
            self.push(s, y)

    def clear(self) -> None:
        self.meta.zero_()


def two_loop(pairs: Sequence[Pair], v: torch.Tensor, *, gamma: float | torch.Tensor | None = None) -> torch.Tensor:
    """H·v with H the L-BFGS inverse-Hessian approximation built from ``pairs``.

    Args:
        pairs: (s_i, y_i), oldest first; every pair must have s·y > 0.
        v: (P,) vector.
        gamma: H₀ = γI; default sᵀy / yᵀy of the newest pair (1 when there are no pairs).

    Returns:
        (P,) H·v. With pairs from a quadratic ½θᵀAθ whose s_i are A-conjugate and span R^P,
        H = A⁻¹ exactly.
    """
    q = v.clone()
    rhos = [1.0 / torch.dot(y, s) for s, y in pairs]
    alphas = []
    for (s, y), rho in zip(reversed(pairs), reversed(rhos)):
        a = rho * torch.dot(s, q)
        q.sub_(y * a)
        alphas.append(a)
    if gamma is None:
        if pairs:
            s, y = pairs[-1]
            gamma = torch.dot(s, y) / torch.dot(y, y)
        else:
            gamma = 1.0
    r = q.mul_(gamma)
    for (s, y), rho, a in zip(pairs, rhos, reversed(alphas)):
        b = rho * torch.dot(y, r)
        r.add_(s * (a - b))
    return r


# --------------------------------------------------------------------------- line searches


@dataclass(frozen=True)
class LineSearchResult:
    """Outcome of a line search along d from θ.

    Attributes:
        t: accepted step (0 when ``ok`` is False).
        value, grad: E and ∇E at θ + t·d (those at θ when not ok).
        evaluations: function+gradient evaluations used.
        ok: a step with sufficient decrease was found.
    """

    t: float
    value: torch.Tensor
    grad: torch.Tensor
    evaluations: int
    ok: bool


def _finite(v: torch.Tensor) -> bool:
    return bool(torch.isfinite(v).all())


@dataclass(frozen=True)
class LineSearchSettings:
    """Tolerances and limits of a line search (:data:`LINE_SEARCHES`); each search reads the ones it needs.

    Attributes:
        c1: sufficient-decrease constant of E(θ+td) ≤ E(θ) + c1·t·∇Eᵀd, in (0, c2).
        c2: curvature constant of the strong Wolfe condition |∇E(θ+td)ᵀd| ≤ c2·|∇Eᵀd|, in (c1, 1)
            (strong Wolfe only).
        max_evals: cap on the E+∇E evaluations of one search (≥ 1).
        shrink: backtracking factor t ← shrink·t, in (0, 1) (Armijo only).
        expand: bracketing growth factor t ← expand·t, > 1 (strong Wolfe only).
    """

    c1: float = 1e-4
    c2: float = 0.9
    max_evals: int = 30
    shrink: float = 0.5
    expand: float = 4.0


DEFAULT_LINE_SEARCH = LineSearchSettings()


def armijo_backtracking(fun: ValueGrad, theta: torch.Tensor, d: torch.Tensor, f0: torch.Tensor, g0: torch.Tensor,
                        *, t: float = 1.0, f_eps: float = 0.0,
                        settings: LineSearchSettings = DEFAULT_LINE_SEARCH) -> LineSearchResult:
    """Backtracking: the first t = t₀·shrinkᵏ with E(θ+td) ≤ E(θ) + c1·t·∇Eᵀd + f_eps (c2 unused).

    ``f_eps`` (≥ 0) is the rounding noise of E: within it, a step counts as decreasing when
    the slope along d has not turned positive (otherwise a line search stalls near the
    minimiser, where E no longer resolves the decrease). ``settings``: c1, shrink, max_evals.
    """
    c1, shrink, max_evals = settings.c1, settings.shrink, settings.max_evals
    gtd0 = float(torch.dot(g0, d))
    f0v = float(f0)
    for k in range(max_evals):
        f, g = fun(theta + t * d)
        if not (_finite(f) and _finite(g)):
            t *= shrink
            continue
        fv = float(f)
        if fv <= f0v + c1 * t * gtd0 or (fv <= f0v + f_eps and float(torch.dot(g, d)) <= 0):
            return LineSearchResult(t, f, g, k + 1, True)
        t *= shrink
    return LineSearchResult(0.0, f0, g0, max_evals, False)


def _cubic_min(t1: float, f1: float, d1: float, t2: float, f2: float, d2: float) -> float:
    """Minimiser of the cubic through (t1, f1, d1), (t2, f2, d2); bisection if it has none."""
    d_1 = d1 + d2 - 3.0 * (f1 - f2) / (t1 - t2)
    sq = d_1 * d_1 - d1 * d2
    if sq < 0 or not math.isfinite(sq):
        return 0.5 * (t1 + t2)
    d_2 = math.copysign(math.sqrt(sq), t2 - t1)
    denom = d2 - d1 + 2.0 * d_2
    if denom == 0:
        return 0.5 * (t1 + t2)
    return t2 - (t2 - t1) * (d2 + d_2 - d_1) / denom


def strong_wolfe(fun: ValueGrad, theta: torch.Tensor, d: torch.Tensor, f0: torch.Tensor, g0: torch.Tensor,
                 *, t: float = 1.0, f_eps: float = 0.0,
                 settings: LineSearchSettings = DEFAULT_LINE_SEARCH) -> LineSearchResult:
    """Step satisfying the strong Wolfe conditions (Nocedal & Wright Alg. 3.5 with zoom, Alg. 3.6).

    E(θ+td) ≤ E(θ) + c1·t·∇Eᵀd and |∇E(θ+td)ᵀd| ≤ c2·|∇Eᵀd|; guarantees sᵀy > 0 for the new pair.
    Non-finite trial values are treated as "too far" (the bracket shrinks). If the budget runs
    out, the best point with sufficient decrease found so far is returned. ``f_eps`` ≥ 0 is the
    rounding noise of E: the decrease tests are relaxed by it (Hager & Zhang's "approximate
    Wolfe" idea), so near the minimiser, where E no longer resolves the decrease, the search
    is steered by the slope. ``settings``: c1, c2, max_evals, expand.
    """
    c1, c2, max_evals, expand = settings.c1, settings.c2, settings.max_evals, settings.expand
    f0v, gtd0 = float(f0), float(torch.dot(g0, d))
    evals = 0
    # (t, f, gtd, value tensor, grad tensor) of the bracket ends
    prev = (0.0, f0v, gtd0, f0, g0)
    best: tuple[float, torch.Tensor, torch.Tensor] | None = None
    lo = hi = None
    while evals < max_evals:
        f, g = fun(theta + t * d)
        evals += 1
        fv = float(f) if _finite(f) and _finite(g) else math.inf
        gtd = float(torch.dot(g, d)) if math.isfinite(fv) else math.inf
        cur = (t, fv, gtd, f, g)
        if fv > f0v + c1 * t * gtd0 + f_eps or (evals > 1 and fv >= prev[1] + f_eps):
            lo, hi = prev, cur
            break
        if best is None or fv < float(best[1]):
            best = (t, f, g)
        if abs(gtd) <= -c2 * gtd0:
            return LineSearchResult(t, f, g, evals, True)
        if gtd >= 0:
            lo, hi = cur, prev
            break
        prev = cur
        t *= expand
    else:
        return _fallback(best, f0, g0, evals)
    # zoom between lo (sufficient decrease, lowest f so far) and hi
    while evals < max_evals:
        t_lo, f_lo, gtd_lo = lo[0], lo[1], lo[2]
        t_hi, f_hi, gtd_hi = hi[0], hi[1], hi[2]
        width = abs(t_hi - t_lo)
        if width <= 1e-12 * max(1.0, abs(t_lo)):
            break
        if math.isfinite(f_hi) and math.isfinite(gtd_hi):
            t = _cubic_min(t_lo, f_lo, gtd_lo, t_hi, f_hi, gtd_hi)
        else:
            t = 0.5 * (t_lo + t_hi)
        a, b = min(t_lo, t_hi), max(t_lo, t_hi)
        if not (a + 0.1 * width <= t <= b - 0.1 * width):
            t = 0.5 * (t_lo + t_hi)
        f, g = fun(theta + t * d)
        evals += 1
        fv = float(f) if _finite(f) and _finite(g) else math.inf
        gtd = float(torch.dot(g, d)) if math.isfinite(fv) else math.inf
        cur = (t, fv, gtd, f, g)
        if fv > f0v + c1 * t * gtd0 + f_eps or fv >= f_lo + f_eps:
            hi = cur
        else:
            if best is None or fv < float(best[1]):
                best = (t, f, g)
            if abs(gtd) <= -c2 * gtd0:
                return LineSearchResult(t, f, g, evals, True)
            if gtd * (t_hi - t_lo) >= 0:
                hi = lo
            lo = cur
    return _fallback(best, f0, g0, evals)


def _fallback(best, f0, g0, evals) -> LineSearchResult:
    if best is not None and best[0] > 0:
        return LineSearchResult(best[0], best[1], best[2], evals, True)
    return LineSearchResult(0.0, f0, g0, evals, False)


LINE_SEARCHES: Registry[Callable[..., LineSearchResult]] = Registry("line search")
LINE_SEARCHES.register("strong-wolfe", strong_wolfe)
LINE_SEARCHES.register("armijo", armijo_backtracking)


# --------------------------------------------------------------------------- L-BFGS


@dataclass(frozen=True)
class LBFGSResult:
    """Result of :func:`lbfgs_minimize`.

    Attributes:
        theta: (P,) final iterate.
        value, grad: E and ∇E there.
        grad_norm: ‖∇E(θ)‖₂ (the inner residual).
        iterations: accepted steps.
        evaluations: E+∇E evaluations (each one forward + one backward).
        converged: grad_norm ≤ tol.
        new_pairs: curvature pairs produced by this call, oldest first (commit them with
            ``LBFGSMemory.extend``).
        stop_reason: "converged" | "max_iter" | "line-search" | "non-finite".
    """

    theta: torch.Tensor
    value: torch.Tensor
    grad: torch.Tensor
    grad_norm: float
    iterations: int
    evaluations: int
    converged: bool
    new_pairs: list[Pair] = field(default_factory=list)
    stop_reason: str = ""


@dataclass(frozen=True)
class LBFGSSettings:
    """How :func:`lbfgs_minimize` steps (its stopping rule and memory size are per call).

    Attributes:
        line_search: :data:`LINE_SEARCHES` name ("strong-wolfe", "armijo").
        search: the line search's constants (c1, c2, evaluations per search, ...).
        curvature_eps: a pair is kept only when sᵀy > eps·‖s‖·‖y‖ (skips non-convex steps), ≥ 0.
        f_rtol: relative rounding noise of E passed to the line search as f_eps = f_rtol·|E|;
            None (default): 16·(machine epsilon of θ's dtype).
    """

    line_search: str = "strong-wolfe"
    search: LineSearchSettings = DEFAULT_LINE_SEARCH
    curvature_eps: float = 1e-10
    f_rtol: float | None = None


DEFAULT_LBFGS = LBFGSSettings()


def lbfgs_minimize(fun: ValueGrad, theta0: torch.Tensor, *, pairs: Sequence[Pair] = (), history: int = 10,
                   tol: float = 1e-6, max_iter: int = 100, settings: LBFGSSettings = DEFAULT_LBFGS) -> LBFGSResult:
    """Minimise a smooth function by L-BFGS with a line search.

    Args:
        fun: θ ↦ (E(θ), ∇E(θ)), detached, θ: (P,).
        theta0: (P,) start (warm start: the previous outer step's θ).
        pairs: curvature pairs to start from (oldest first; e.g. from the previous outer step).
            Not modified.
        history: number of pairs the quasi-Newton model keeps.
        tol: stop when ‖∇E‖₂ ≤ tol.
        max_iter: cap on accepted steps.
        settings: the line search (name and constants), the pair filter and E's rounding noise.

    Returns:
        :class:`LBFGSResult`.

    Raises:
        DataReconError: unknown ``settings.line_search`` (the message lists the valid names).
    """
    search = LINE_SEARCHES.get(settings.line_search)
    curvature_eps, f_rtol = settings.curvature_eps, settings.f_rtol
    theta = theta0.detach().clone()
    f, g = fun(theta)
    evals, it = 1, 0
    model = list(pairs)[-history:] if history > 0 else []
    new: list[Pair] = []
    if not (_finite(f) and _finite(g)):
        return LBFGSResult(theta, f, g, float("nan"), 0, evals, False, new, "non-finite")
    f_rtol = 16 * torch.finfo(theta.dtype).eps if f_rtol is None else f_rtol
    reason = "max_iter"
    while True:
        gnorm = float(torch.linalg.vector_norm(g))
        if gnorm <= tol:
            reason = "converged"
            break
        if it >= max_iter:
            break
        if model:
            d = -two_loop(model, g)
            t0 = 1.0
        else:
            d = -g
            t0 = min(1.0, 1.0 / gnorm)
        if float(torch.dot(g, d)) >= 0:  # quasi-Newton model lost positive definiteness: restart
            model = []
            d, t0 = -g, min(1.0, 1.0 / gnorm)
        ls = search(fun, theta, d, f, g, t=t0, f_eps=f_rtol * abs(float(f)), settings=settings.search)
        evals += ls.evaluations
        if not ls.ok:
            if model:  # retry once along steepest descent before giving up
                model = []
                continue
            reason = "line-search"
            break
        s = ls.t * d
        y = ls.grad - g
        sy = float(torch.dot(s, y))
        if history > 0 and sy > curvature_eps * float(torch.linalg.vector_norm(s) * torch.linalg.vector_norm(y)):
            model.append((s, y))
            new.append((s, y))
            if len(model) > history:
                model.pop(0)
            if len(new) > history:
                new.pop(0)
        theta = theta + s
        f, g = ls.value, ls.grad
        it += 1
    gnorm = float(torch.linalg.vector_norm(g))
    return LBFGSResult(theta, f, g, gnorm, it, evals, reason == "converged", new, reason)
