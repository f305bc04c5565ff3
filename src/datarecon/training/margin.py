"""Margin ascent: keep maximising the normalised margin once the training loss has stalled.

For a positively L-homogeneous network (a bias-free ReLU MLP: Φ(x; cθ) = c^L Φ(x; θ)) trained on an
exponentially tailed loss (logistic, cross-entropy), gradient flow converges in direction to a KKT
point of the max-margin problem (Lyu & Li 2020; Ji & Telgarsky 2020). That is the premise of the
KKT attack (Haim et al. 2022): θ* = Σ_i λ_i y_i ∇_θΦ(x_i; θ*), λ_i ≥ 0. In practice, full-batch GD
drives the loss towards the float64 floor and then stalls: the step ∝ L(θ) vanishes, ‖θ‖ stops
growing (a float64 loss underflows long before the direction has converged), and θ keeps much of
its random initialisation (in a wide MLP, mostly in the square middle layer), which no combination
of training gradients explains (docs/RESULTS.md, "Why the paper-scale target failed").

Margin ascent minimises the same training loss on the sphere ‖θ‖ = R, R the norm when it starts:

    min_θ  log L(θ)   s.t.  ‖θ‖ = R,          L(θ) = (1/n) Σ_i ℓ(s_i(θ))

with s_i the "negative margin" the loss sees (logistic: s_i = −y_i Φ(x_i); cross-entropy:
s_i = logsumexp_{j≠y_i}(Φ_j − Φ_{y_i})) and ℓ(s) = log(1 + e^s). For a homogeneous Φ, θ = R·u and
log L(Ru) ≈ −R^L·γ̃(u) − log n: ascent of the smoothed normalised margin γ̃ at temperature R^L
(Lyu & Li 2020, §4). A stationary point satisfies θ ∝ Σ_i w_i ∇_θ(−s_i) with w_i ∝ ℓ'(s_i) > 0, i.e.
exactly the KKT stationarity the attack inverts; its normalised margin is (locally) maximal.

The update is Riemannian gradient descent with a normalised step of angle η (radians):

    g = ∇_θ log L(θ),   g⊥ = g − ⟨g, θ⟩ θ / R²,   θ ← R · normalise(θ − η R g⊥ / ‖g⊥‖)

with backtracking: a step that does not lower log L is undone and η halved; an accepted step grows η
by ``growth`` (up to ``max_step``). log L is computed in the log domain
(log ℓ(s) = s + log1p(−e^s/2 + …) for s ≪ 0), so nothing underflows however large the margins get.

Pure functions (:func:`log_softplus`, :func:`negative_margins`, :func:`log_mean_loss`,
:func:`tangent_step`) and one stateful stepper (:class:`MarginAscentStepper`) driven by the shared
:class:`~datarecon.kernel.engine.Engine` through :func:`datarecon.training.fit.ascend_margin`.

References:
    Lyu & Li (2020), "Gradient descent maximizes the margin of homogeneous neural networks", ICLR,
    Thm 4.4 and §4 (smoothed margin); Ji & Telgarsky (2020), "Directional convergence and alignment
    in deep learning", NeurIPS; Haim et al. (2022) eq. 3–4; Absil, Mahony & Sepulchre (2008),
    "Optimization algorithms on matrix manifolds", §4 (retraction by normalisation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from datarecon.errors import DataReconError
from datarecon.kernel.losses import margins, squared_norm

#: Losses with an exponential tail (margin ascent maximises their smoothed margin).
EXP_TAILED = ("logistic", "cross-entropy")

_SWITCH = -30.0  # below this, log softplus(s) = s + log1p(-e^s/2) to double precision


def log_softplus(s: torch.Tensor) -> torch.Tensor:
    """log(log(1 + e^s)), elementwise, finite for every finite s (no underflow for s ≪ 0).

    For s < −30: log softplus(s) = s + log(1 − e^s/2 + e^{2s}/3 − …) = s + log1p(−e^s/2) + O(e^{2s}),
    exact to double precision there; otherwise the direct formula (softplus(s) ≥ 1e-13).
    """
    small = s < _SWITCH
    direct = torch.log(nn.functional.softplus(torch.where(small, torch.zeros_like(s), s)))
    tail = s + torch.log1p(-0.5 * torch.exp(torch.where(small, s, torch.full_like(s, _SWITCH))))
    return torch.where(small, tail, direct)


def negative_margins(outputs: torch.Tensor, y: torch.Tensor, *, loss: str) -> torch.Tensor:
    """s_i with ℓ_i = log(1 + e^{s_i}) for the exp-tailed losses of :data:`EXP_TAILED`.

    Args:
        outputs: (n, 1) logits (logistic) or (n, k) logits (cross-entropy).
        y: (n,) ±1 floats (logistic) or int64 classes (cross-entropy).
        loss: ``logistic`` or ``cross-entropy``.

    Returns:
        (n,) s_i = −y_i Φ(x_i) (logistic) or logsumexp_{j≠y_i}(Φ_j − Φ_{y_i}) (cross-entropy).
    """
    if loss == "logistic":
        return -margins(outputs, y, multiclass=False)
    if loss == "cross-entropy":
        idx = y.long()[:, None]
        diff = outputs - outputs.gather(1, idx)
        return diff.scatter(1, idx, float("-inf")).logsumexp(dim=1)
    raise DataReconError(f"margin ascent needs an exponentially tailed loss ({', '.join(EXP_TAILED)}), got {loss!r}")


def log_mean_loss(outputs: torch.Tensor, y: torch.Tensor, *, loss: str) -> torch.Tensor:
    """log L = log((1/n) Σ_i log(1 + e^{s_i})) in the log domain (scalar, differentiable)."""
    s = negative_margins(outputs, y, loss=loss)
    return torch.logsumexp(log_softplus(s), dim=0) - math.log(s.shape[0])


def tangent_step(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], *, radius: float,
                 angle: float) -> float:
    """One normalised Riemannian step on the sphere ‖θ‖ = ``radius``, in place.

    θ ← radius · normalise(θ − angle · radius · g⊥/‖g⊥‖), g⊥ the component of g orthogonal to θ.
    For small ``angle`` the new θ makes an angle ≈ ``angle`` (radians) with the old one.

    Args:
        params: the tensors of θ (modified in place); ‖θ‖ must equal ``radius``.
        grads: ∇_θ of the objective, same shapes.
        radius: R > 0.
        angle: η > 0.

    Returns:
        ‖g⊥‖ (0 at a stationary point; then θ is left unchanged).
    """
    with torch.no_grad():
        dot = sum(float(torch.dot(g.reshape(-1).double(), p.reshape(-1).double())) for g, p in zip(grads, params)) / radius ** 2
        tang = [g - dot * p for g, p in zip(grads, params)]
        gnorm = math.sqrt(sum(float(squared_norm(t)) for t in tang))
        if gnorm == 0.0 or not math.isfinite(gnorm):
            return gnorm
        scale = angle * radius / gnorm
        for p, t in zip(params, tang):
            p.sub_(t, alpha=scale)
        norm = math.sqrt(sum(float(squared_norm(p)) for p in params))
        for p in params:
            p.mul_(radius / norm)
    return gnorm


class MarginAscentStepper:
    """One backtracking step of margin ascent per call (for :class:`~datarecon.kernel.engine.Engine`).

    State (all checkpointable as JSON scalars): ``radius`` R, the current angle ``step_size``, the
    current objective ``log_loss`` and counts of accepted / rejected steps. The gradient at the
    current θ is recomputed on resume (one extra forward/backward), so a resumed run is
    bit-identical to an uninterrupted one.

    Args:
        model: the network (trained in place); x (n, …) inputs, y (n,) labels.
        loss: ``logistic`` or ``cross-entropy``.
        step_size: initial angle η₀ (radians).
        growth: factor on η after an accepted step (≥ 1).
        max_step: upper bound of η.
        min_step: when η falls below this, the loop stops (converged to the resolution η).
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss: str, step_size: float,
                 growth: float, max_step: float, min_step: float) -> None:
        if loss not in EXP_TAILED:
            raise DataReconError(f"margin ascent needs an exponentially tailed loss ({', '.join(EXP_TAILED)}); "
                                 f"the target was trained with {loss!r}: set margin_ascent steps to 0")
        self.model, self.x, self.y, self.loss = model, x, y, loss
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.radius = math.sqrt(sum(float(squared_norm(p.detach())) for p in self.params))
        if self.radius == 0.0:
            raise DataReconError("margin ascent needs non-zero weights; train the target first")
        self.step_size, self.growth, self.max_step, self.min_step = step_size, growth, max_step, min_step
        self.accepted = 0
        self.rejected = 0
        self.in_update = False
        self._value: float | None = None
        self._grads: list[torch.Tensor] | None = None
        self._metrics: dict[str, float] = {}

    def state(self) -> dict[str, Any]:
        """JSON scalars for a checkpoint."""
        return {"radius": self.radius, "step_size": self.step_size, "accepted": self.accepted,
                "rejected": self.rejected}

    def load_state(self, state: dict[str, Any]) -> None:
        self.radius = float(state["radius"])
        self.step_size = float(state["step_size"])
        self.accepted, self.rejected = int(state["accepted"]), int(state["rejected"])
        self._value = self._grads = None

    def _evaluate(self) -> tuple[float, list[torch.Tensor], dict[str, float]]:
        outputs = self.model(self.x)
        obj = log_mean_loss(outputs, self.y, loss=self.loss)
        grads = torch.autograd.grad(obj, self.params)
        with torch.no_grad():
            m = margins(outputs.detach(), self.y)
            metrics = {"log_loss": float(obj), "loss": math.exp(float(obj)),
                       "train_acc": float((m > 0).double().mean()), "min_margin": float(m.min()),
                       "mean_margin": float(m.mean())}
        return float(obj.detach()), [g.detach() for g in grads], metrics

    def __call__(self, step: int) -> dict[str, float]:
        if self._value is None or self._grads is None:
            self._value, self._grads, self._metrics = self._evaluate()
        backup = [p.detach().clone() for p in self.params]
        self.in_update = True
        gnorm = tangent_step(self.params, self._grads, radius=self.radius, angle=self.step_size)
        value, grads, metrics = self._evaluate()
        accepted = math.isfinite(value) and value < self._value
        if accepted:
            self._value, self._grads, self._metrics = value, grads, metrics
            self.accepted += 1
            tried = self.step_size
            self.step_size = min(self.step_size * self.growth, self.max_step)
        else:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)
            self.rejected += 1
            tried = self.step_size
            self.step_size *= 0.5
        self.in_update = False
        return {**self._metrics, "weight_norm": self.radius, "riemannian_grad_norm": gnorm,
                "step_size": tried, "accepted": float(accepted), "energy": self._value}

    def converged(self) -> bool:
        return self.step_size < self.min_step
