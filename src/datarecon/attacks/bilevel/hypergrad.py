"""The implicit-function hypergradient of the bilevel reconstruction objective.

Derivation (Runkel et al. 2024, eq. 2 and update 7). Let θ̂(x) solve the lower level, so
F(x, θ̂(x)) := ∇_θE(x, θ̂(x)) = 0. Differentiating in x,

    ∇²_θθE · Dθ̂ + ∇²_θxE = 0   ⇒   Dθ̂ = −H⁻¹ ∇²_θxE,   H = ∇²_θθE(x, θ̂)  (symmetric, invertible).

For L(x) = l(θ*, θ̂(x)) the chain rule gives

    ∇_x L = Dθ̂ᵀ ∇_θ l = −(∇²_θxE)ᵀ H⁻¹ ∇_θ l = −∇_x ⟨∇_θE(x, θ̂), p⟩,   p = H⁻¹ ∇_θ l(θ*, θ̂),

with θ̂ and p held fixed inside the last gradient. Hence with the paper's a(x) =
⟨∇_θE(x, θ̂), p⟩ the descent step on L is x ← x − η∇_x L = x + η∇_x a(x): update 7 written
as "x − η∇a" holds with p defined as −H∇_θ l. This module returns ∇_x L itself (sign
included), so the caller always *subtracts* it. Verified against central finite
differences in float64 (tests/attacks/bilevel/test_bilevel_hypergrad.py).

Cost per call: the Hessian products of the chosen strategy (one of them to measure the
residual of its answer) plus one double backward (one graph of ∇_θE is built and shared by the
HVPs and the mixed product). With ``curvature="gauss-newton"`` the products are with the
Gauss–Newton matrix G instead of ∇²_θE and p = G⁻¹∇_θ l: an approximation of the implicit
function theorem's p that exists also where E has kinks (ReLU targets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from datarecon.attacks.bilevel.lbfgs import Pair
from datarecon.attacks.bilevel.linear_solve import LINEAR_SOLVERS, LinearSystem, SolveOptions, SolveResult
from datarecon.attacks.bilevel.problem import CURVATURES, UPPER_LOSSES, EnergyFn


@dataclass(frozen=True)
class Hypergradient:
    """∇_x l(θ*, θ̂(x)) and its ingredients.

    Attributes:
        grad_x: shape of x, ∇_x L (subtract it to descend).
        p: (P,) H⁻¹ ∇_θ l (warm start for the next CG solve).
        upper: l(θ*, θ̂) (scalar tensor).
        energy: E(x, θ̂) (scalar tensor).
        solve: the linear solve's result (HVP count, residual, ...).
    """

    grad_x: torch.Tensor
    p: torch.Tensor
    upper: torch.Tensor
    energy: torch.Tensor
    solve: SolveResult


def implicit_gradient(op, p: torch.Tensor) -> torch.Tensor:
    """∇_x L = −∇_x⟨∇_θE(x, θ̂), p⟩ for p = H⁻¹∇_θ l (see module docstring)."""
    return -op.mixed(p)


@dataclass(frozen=True)
class HypergradientSettings:
    """How :func:`hypergradient` forms p = M⁻¹∇_θ l: the method's fixed choices (the warm starts are per call).

    Attributes:
        upper: ``UPPER_LOSSES`` name of l(θ*, θ̂) ("sq" = ‖θ* − θ̂‖², "normalised").
        strategy: ``LINEAR_SOLVERS`` name ("qn", "cg", "pcg", "neumann").
        options: the linear solve's parameters (tolerance, caps, damping μ, ...).
        curvature: ``CURVATURES`` name of M: "hessian" (∇²_θE, the implicit function theorem's
            matrix) or "gauss-newton" (its positive-definite Gauss–Newton part; needs an
            ``Energy`` from ``make_energy``).
    """

    upper: str = "sq"
    strategy: str = "cg"
    options: SolveOptions = field(default_factory=SolveOptions)
    curvature: str = "hessian"


def hypergradient(energy_fn: EnergyFn, x: torch.Tensor, theta: torch.Tensor, theta_star: torch.Tensor, *,
                  settings: HypergradientSettings | None = None, pairs: Sequence[Pair] = (),
                  previous_p: torch.Tensor | None = None, eigvec: torch.Tensor | None = None) -> Hypergradient:
    """Hypergradient of x ↦ l(θ*, θ̂(x)) at a solved lower level θ̂ ≈ θ(x).

    Args:
        energy_fn: E(x, θ_flat) (``problem.make_energy``).
        x: (m, *input_shape) candidates.
        theta: (P,) θ̂, a (near-)minimiser of E(x, ·); the formula assumes ∇_θE(x, θ̂) ≈ 0.
        theta_star: (P,) the target's parameters θ*.
        settings: upper loss, strategy, its options and curvature (default ``HypergradientSettings()``:
            "sq", "cg", ``SolveOptions()``, "hessian").
        pairs: inner L-BFGS curvature pairs ("qn": the answer; "pcg": the preconditioner).
        previous_p: the previous outer step's p (warm start for "cg", "pcg", "neumann").
        eigvec: the previous power-iteration vector (warm start of "neumann"'s λ_max estimate).

    Returns:
        :class:`Hypergradient`.

    Raises:
        DataReconError: unknown upper loss, strategy or curvature (the message lists the valid names).
    """
    settings = settings or HypergradientSettings()
    loss = UPPER_LOSSES.get(settings.upper)
    solver = LINEAR_SOLVERS.get(settings.strategy)
    options = settings.options
    op = CURVATURES.get(settings.curvature)(energy_fn, x, theta)
    th = theta.detach()
    b = loss.grad(th, theta_star)
    solve = solver(LinearSystem(hvp=op, b=b, previous=previous_p, pairs=list(pairs), eigvec=eigvec), options)
    grad_x = implicit_gradient(op, solve.p)
    return Hypergradient(grad_x=grad_x, p=solve.p, upper=loss.value(th, theta_star), energy=op.value, solve=solve)
