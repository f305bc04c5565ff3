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
differences in float64 (tests/attacks/bilevel/test_hypergrad.py).

Cost per call: the inner Hessian products of the chosen strategy plus one double backward
(one graph of ∇_θE is built and shared by the HVPs and the mixed product).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from datarecon.attacks.bilevel.lbfgs import Pair
from datarecon.attacks.bilevel.linear_solve import LINEAR_SOLVERS, LinearSystem, SolveOptions, SolveResult
from datarecon.attacks.bilevel.problem import UPPER_LOSSES, EnergyFn, HessianOperator


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


def implicit_gradient(op: HessianOperator, p: torch.Tensor) -> torch.Tensor:
    """∇_x L = −∇_x⟨∇_θE(x, θ̂), p⟩ for p = H⁻¹∇_θ l (see module docstring)."""
    return -op.mixed(p)


def hypergradient(energy_fn: EnergyFn, x: torch.Tensor, theta: torch.Tensor, theta_star: torch.Tensor, *,
                  upper: str = "sq", strategy: str = "cg", options: SolveOptions | None = None,
                  pairs: Sequence[Pair] = (), previous_p: torch.Tensor | None = None) -> Hypergradient:
    """Hypergradient of x ↦ l(θ*, θ̂(x)) at a solved lower level θ̂ ≈ θ(x).

    Args:
        energy_fn: E(x, θ_flat) (``problem.make_energy``).
        x: (m, *input_shape) candidates.
        theta: (P,) θ̂, a (near-)minimiser of E(x, ·); the formula assumes ∇_θE(x, θ̂) ≈ 0.
        theta_star: (P,) the target's parameters θ*.
        upper: ``UPPER_LOSSES`` name.
        strategy: ``LINEAR_SOLVERS`` name ("qn", "cg", "neumann").
        options: the linear solve's parameters.
        pairs: inner L-BFGS curvature pairs (for "qn").
        previous_p: the previous outer step's p (warm start for "cg").

    Returns:
        :class:`Hypergradient`.

    Raises:
        DataReconError: unknown upper loss or strategy (the message lists the valid names).
    """
    loss = UPPER_LOSSES.get(upper)
    solver = LINEAR_SOLVERS.get(strategy)
    options = options or SolveOptions()
    op = HessianOperator(energy_fn, x, theta)
    th = theta.detach()
    b = loss.grad(th, theta_star)
    solve = solver(LinearSystem(hvp=op, b=b, previous=previous_p, pairs=list(pairs)), options)
    grad_x = implicit_gradient(op, solve.p)
    return Hypergradient(grad_x=grad_x, p=solve.p, upper=loss.value(th, theta_star), energy=op.value, solve=solve)
