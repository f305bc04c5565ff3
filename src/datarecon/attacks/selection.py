"""Attacker-side model selection, per-candidate scores and early stopping.

The reference code picks hyper-parameters and stops early by distances to the true training
set; an attacker cannot. Everything here uses only what an attacker has: θ*, the model, the
candidates x, labels y and multipliers λ.

Run-level criteria (:data:`CRITERIA`; each documents whether lower or higher is better):

* ``relative_residual``   ‖θ* − g‖² / ‖θ*‖² with the *exact* ReLU model (g as in the attack's
                          formulation; gradnorm: ‖∇_θE‖² / ‖θ*‖²). Lower = closer to a KKT point.
* ``lambda_at_min``       fraction of λ_i at (within 0.1% of) λ_min: candidates pinned at the floor
                          are not supporting θ*. Lower is better. (Signed λ: fraction with |λ| < 1e-3.)
* ``lambda_spread``       std(λ) / mean(|λ|): information only.
* ``mean_cosine``         mean pairwise cosine similarity of flattened candidates. Lower = more diverse.
* ``duplicate_fraction``  fraction of candidate pairs with cosine > ``dup_threshold``
                          (duplicate collapse). Lower is better.
* ``margin_positive``     fraction of candidates with y_i·Φ(x_i) > 0 (classified as their own
                          label; regression: sign agreement). Higher is better.

Per-candidate scores (saved as ``score_<name>`` in candidates.safetensors; higher = more trusted):

* ``lambda``        λ_i (|λ_i| for signed formulations).
* ``margin``        output margin y_i·Φ(x_i) (multiclass: Φ_y − max_{j≠y} Φ_j).
* ``contribution``  first-order increase of the residual R = ‖θ* − g‖² when candidate i is left
                    out of g: 2⟨θ* − g, (1/m)∇_θ out_i⟩, computed for all i by one double-backward
                    (:func:`datarecon.attacks.kkt_math.per_candidate_directional`).
* ``uniqueness``    1 − max_{j≠i} cos(x_i, x_j).

An early stop is not selection: it is the run loop's plateau rule (:class:`datarecon.attacks.loop.Plateau`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from datarecon.attacks import kkt_math
from datarecon.registry import Registry
from datarecon.kernel.losses import margins as output_margins


@dataclass(frozen=True)
class SelectionContext:
    """Attacker-side quantities the criteria read.

    Attributes:
        forward: Φ(x; params) with the exact (ReLU) model.
        params: θ* (name → tensor).
        x: (m, C, H, W) candidates; labels (m,); lam (m,) multipliers (ones for gradnorm).
        formulation: a key of :data:`kkt_math.MARGINS`, or None for the gradient-norm objective.
        loss, weight_decay: the target's training loss (for formulation None).
        lambda_min: the λ floor (None: signed λ).
        dup_threshold: cosine above which two candidates count as duplicates.
        reference: θ_ref where the combination gradient g is taken (None: ``params``).
        init, coefficient: a known initialisation: g matches θ* − a·θ_init (a None: fitted).
    """

    forward: kkt_math.ForwardFn
    params: Mapping[str, torch.Tensor]
    x: torch.Tensor
    labels: torch.Tensor
    lam: torch.Tensor
    formulation: str | None
    loss: str
    weight_decay: float
    lambda_min: float | None
    dup_threshold: float = 0.99
    reference: Mapping[str, torch.Tensor] | None = None
    init: Mapping[str, torch.Tensor] | None = None
    coefficient: float | None = 1.0


@dataclass(frozen=True)
class Criterion:
    """A run-level selection criterion: fn(context) -> float, ``better`` in lower|higher|info."""

    fn: Callable[[SelectionContext], float]
    better: str
    doc: str


CRITERIA: Registry[Criterion] = Registry("selection criterion")


def _gradient(ctx: SelectionContext) -> dict[str, torch.Tensor]:
    with torch.enable_grad():
        if ctx.formulation is None:
            return kkt_math.energy_gradient(ctx.forward, ctx.params, ctx.x.detach(), ctx.labels,
                                            loss=ctx.loss, weight_decay=ctx.weight_decay, create_graph=False)
        ref = ctx.params if ctx.reference is None else ctx.reference
        return kkt_math.combination_gradient(ctx.forward, ref, ctx.x.detach(), ctx.labels,
                                             ctx.lam.detach(), margin=ctx.formulation, create_graph=False)


def _goal(ctx: SelectionContext, g: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What g must match: θ*, or θ* − a·θ_init with a known initialisation."""
    return kkt_math.matching_goal(ctx.params, g, init=ctx.init, coefficient=ctx.coefficient)[0]


def relative_residual(ctx: SelectionContext) -> float:
    """‖goal − g‖² / ‖goal‖² (goal = θ*, or θ* − a·θ_init with a known initialisation; KKT
    formulations) or ‖∇_θE‖² / ‖θ*‖² (gradnorm), exact ReLU."""
    g = _gradient(ctx)
    if ctx.formulation is None:
        return float(kkt_math.squared_norm(g) / kkt_math.squared_norm(ctx.params))
    goal = _goal(ctx, g)
    return float(kkt_math.stationarity_residual(goal, g) / kkt_math.squared_norm(goal))


def cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    """(m, m) cosine similarities of flattened candidates (diagonal included)."""
    flat = x.detach().reshape(x.shape[0], -1)
    unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return unit @ unit.T


def _offdiag(c: torch.Tensor) -> torch.Tensor:
    m = c.shape[0]
    return c[~torch.eye(m, dtype=torch.bool, device=c.device)]


def mean_cosine(ctx: SelectionContext) -> float:
    """Mean pairwise cosine similarity (NaN for m = 1)."""
    off = _offdiag(cosine_matrix(ctx.x))
    return float(off.mean()) if off.numel() else float("nan")


def duplicate_fraction(ctx: SelectionContext) -> float:
    """Fraction of unordered pairs with cosine > dup_threshold (0 for m = 1)."""
    off = _offdiag(cosine_matrix(ctx.x))
    return float((off > ctx.dup_threshold).double().mean()) if off.numel() else 0.0


def lambda_at_min(ctx: SelectionContext) -> float:
    """Fraction of λ at the floor (λ ≤ λ_min·1.001 + 1e-12; signed λ: |λ| < 1e-3)."""
    lam = ctx.lam.detach().double()
    if ctx.lambda_min is None:
        return float((lam.abs() < 1e-3).double().mean())
    return float((lam <= ctx.lambda_min * 1.001 + 1e-12).double().mean())


def lambda_spread(ctx: SelectionContext) -> float:
    """std(λ) / mean(|λ|) (0 for m = 1)."""
    lam = ctx.lam.detach().double()
    if lam.numel() < 2:
        return 0.0
    return float(lam.std() / lam.abs().mean().clamp_min(1e-30))


def candidate_margins(ctx: SelectionContext) -> torch.Tensor:
    """y_i·Φ(x_i) (binary/regression) or Φ_y − max_{j≠y}Φ_j (multiclass), (m,)."""
    with torch.no_grad():
        out = ctx.forward(ctx.x.detach(), ctx.params)
    return output_margins(out, ctx.labels)


def margin_positive(ctx: SelectionContext) -> float:
    """Fraction of candidates with a positive output margin."""
    return float((candidate_margins(ctx) > 0).double().mean())


CRITERIA.register("relative_residual", Criterion(relative_residual, "lower", "||theta*-g||^2/||theta*||^2"))
#: the criterion runs are ranked and pooled by when none is named (sweeps, ``--runs K``, the paper pools)
DEFAULT_CRITERION = "relative_residual"
CRITERIA.register("lambda_at_min", Criterion(lambda_at_min, "lower", "fraction of lambda at lambda_min"))
CRITERIA.register("lambda_spread", Criterion(lambda_spread, "info", "std(lambda)/mean|lambda|"))
CRITERIA.register("mean_cosine", Criterion(mean_cosine, "lower", "mean pairwise cosine of candidates"))
CRITERIA.register("duplicate_fraction", Criterion(duplicate_fraction, "lower",
                                                  "fraction of pairs with cosine > dup_threshold"))
CRITERIA.register("margin_positive", Criterion(margin_positive, "higher", "fraction with y*Phi(x) > 0"))


def evaluate_criteria(ctx: SelectionContext, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{name: {"value", "better", "doc"}}`` for the given (default: all) criteria."""
    out = {}
    for name in names or CRITERIA.names():
        c = CRITERIA.get(name)
        out[name] = {"value": c.fn(ctx), "better": c.better, "doc": c.doc}
    return out


def contribution_scores(ctx: SelectionContext) -> torch.Tensor:
    """2⟨goal − g, (1/m)∇_θ out_i⟩ for every i, (m,) (see module docstring; goal θ* or θ* − a·θ_init,
    gradients at θ_ref). Zeros for gradnorm."""
    if ctx.formulation is None:
        return torch.zeros(ctx.x.shape[0], dtype=ctx.x.dtype, device=ctx.x.device)
    g = _gradient(ctx)
    goal = _goal(ctx, g)
    ref = ctx.params if ctx.reference is None else ctx.reference
    r = {k: goal[k] - g[k] for k in ctx.params}
    d = kkt_math.per_candidate_directional(ctx.forward, ref, ctx.x, r)  # (m,) or (m, k)
    d = d[:, None] if d.dim() == 1 else d
    with torch.enable_grad():
        out = ctx.forward(ctx.x.detach(), ref).detach().requires_grad_(True)
        total = kkt_math.MARGINS.get(ctx.formulation).fn(out, ctx.labels, ctx.lam.detach()).sum()
        (a,) = torch.autograd.grad(total, out)  # (m, k): ∂out_i/∂Φ_i (rows independent)
    return 2.0 / ctx.x.shape[0] * (a * d).sum(dim=1)


def candidate_scores(ctx: SelectionContext) -> dict[str, torch.Tensor]:
    """Per-candidate scores ``lambda``, ``margin``, ``contribution``, ``uniqueness`` (m,) each."""
    lam = ctx.lam.detach()
    c = cosine_matrix(ctx.x)
    if c.shape[0] > 1:
        c = c.clone()
        c.fill_diagonal_(-float("inf"))
        uniq = 1.0 - c.max(dim=1).values
    else:
        uniq = torch.ones(1, dtype=c.dtype, device=c.device)
    return {
        "lambda": lam.abs() if ctx.lambda_min is None else lam.clone(),
        "margin": candidate_margins(ctx).detach(),
        "contribution": contribution_scores(ctx).detach(),
        "uniqueness": uniq,
    }


def merge_duplicates(x: torch.Tensor, *, threshold: float) -> torch.Tensor:
    """Keep-mask (m,) that drops near-duplicates: a candidate whose cosine to an earlier *kept*
    candidate exceeds ``threshold`` is dropped (order = priority, e.g. best run first).

    Attacker side: pooled runs of one target often find the same mixture many times, which only
    inflates m (and a calibrated null with it).
    """
    c = cosine_matrix(x)
    keep = torch.zeros(x.shape[0], dtype=torch.bool)
    for i in range(x.shape[0]):
        kept = torch.nonzero(keep).flatten()
        keep[i] = kept.numel() == 0 or bool(c[i, kept].max() <= threshold)
    return keep


def select(ctx: SelectionContext) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """(per-candidate scores, run-level criteria) for a finished attack."""
    return candidate_scores(ctx), evaluate_criteria(ctx)
