"""Does a step along −hypergradient actually lower ‖θ* − θ(x)‖²? The descent-rate measurement.

On targets with kinks (ReLU) the implicit-function hypergradient is not defined at the inner
solution, and each treatment (damped Hessian, Gauss–Newton matrix, a smooth surrogate energy)
computes some other direction. Which one is best is an empirical question with a clean answer:
move x a small distance t along the unit direction d = −g/‖g‖ and re-solve the inner problem
on the target's own energy, warm-started from θ̂(x); the descent rate

    r(t) = [l(θ*, θ̂(x)) − l(θ*, θ̂(x + t·d))] / t

is how fast the true upper loss falls per unit of movement in x. For a smooth energy and an
exact hypergradient r(t) → ‖∇_x l‖ as t → 0 (the steepest possible rate); a random direction
gives ≈ 0. Both ends are re-solved by the same procedure from the same θ̂(x), so the solver's
own drift cancels.

Pure functions; the inner solver is passed in.

References: Runkel et al. 2024, eq. 2 (the upper loss); the treatments are those of
:mod:`datarecon.attacks.bilevel.problem` (``CURVATURES``, ``INNER_ACTIVATIONS``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Resolve = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(x, θ_start) -> θ̂(x): the inner solve on the target's own energy, warm-started from θ_start."""


@dataclass(frozen=True)
class DescentRate:
    """The measured descent rates along one direction.

    Attributes:
        steps: the step lengths t (in the units of ‖x‖, Frobenius over all candidates).
        upper_before: l(θ*, θ̂(x)) after the re-solve at x.
        upper_after: l(θ*, θ̂(x + t·d)) per t.
        rates: (upper_before − upper_after) / t per t (positive: the loss fell).
        predicted: −⟨g_true, d⟩ if a reference gradient was given (else NaN): the rate an exact
            first-order model predicts.
    """

    steps: tuple[float, ...]
    upper_before: float
    upper_after: tuple[float, ...]
    rates: tuple[float, ...]
    predicted: float = float("nan")


def unit_descent_direction(grad_x: torch.Tensor) -> torch.Tensor:
    """d = −g / ‖g‖ (Frobenius norm over all candidates); zeros when g = 0."""
    n = float(torch.linalg.vector_norm(grad_x))
    return torch.zeros_like(grad_x) if n == 0.0 else -grad_x / n


def descent_rate(resolve: Resolve, upper: Callable[[torch.Tensor], float], x: torch.Tensor, theta: torch.Tensor,
                 direction: torch.Tensor, *, steps: Sequence[float],
                 reference_grad: torch.Tensor | None = None) -> DescentRate:
    """Measure r(t) = [l(θ̂(x)) − l(θ̂(x + t·d))] / t with the inner problem re-solved at both ends.

    Args:
        resolve: (x, θ_start) -> θ̂(x), the inner solve on the target's own energy.
        upper: θ -> l(θ*, θ) (e.g. ‖θ* − θ‖²).
        x: (m, *input_shape) candidates.
        theta: (P,) the warm start (θ̂(x) from the attack's own inner solve).
        direction: shape of x, the direction d (normally unit length, see
            :func:`unit_descent_direction`).
        steps: step lengths t > 0.
        reference_grad: an independent estimate of ∇_x l (e.g. finite differences) for
            ``predicted``.

    Returns:
        :class:`DescentRate`.

    Raises:
        ValueError: a step length ≤ 0.
    """
    if any(t <= 0 for t in steps):
        raise ValueError(f"step lengths must be > 0, got {list(steps)}")
    before = upper(resolve(x, theta))
    after = tuple(upper(resolve(x + t * direction, theta)) for t in steps)
    rates = tuple((before - a) / t for a, t in zip(after, steps, strict=True))
    pred = float("nan") if reference_grad is None else -float((reference_grad * direction).sum())
    return DescentRate(tuple(float(t) for t in steps), before, after, rates, pred)
