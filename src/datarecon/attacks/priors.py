"""Priors on the candidates, defined once: the pixel box and total variation.

A prior named ``p`` in :data:`PRIORS` applies to an attack whose config has the field ``p_weight``
(``box_weight``, ``tv_weight``: the field names recorded runs already have, so their hashes do not
change); :func:`add_priors` adds every such prior to a step's objective and gradient. Each prior is
a value and its gradient in closed form (no autograd), over all candidates, or per run over a
leading run axis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from datarecon.registry import Registry

#: (x, lower, upper, run_axis) -> (value scalar or (K,), gradient like x)
PriorFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]


def _total(t: torch.Tensor, run_axis: bool) -> torch.Tensor:
    """Σ of all elements (scalar), or per run over a leading run axis ((K,))."""
    return t.flatten(1).sum(1) if run_axis else t.sum()


def box_penalty(x: torch.Tensor, lower: torch.Tensor | float, upper: torch.Tensor | float, *,
                run_axis: bool = False) -> torch.Tensor:
    """The pixel-box prior Σ (x − clamp(x, lower, upper))² = Σ relu(x − upper)² + relu(lower − x)²
    (scalar; (K,) per run with ``run_axis``); bounds scalars or (C, H, W). Differentiable; the
    attack steps use :func:`box_value_and_grad` (the same values, its gradient in closed form)."""
    lo = torch.as_tensor(lower, dtype=x.dtype, device=x.device)
    hi = torch.as_tensor(upper, dtype=x.dtype, device=x.device)
    d = x - torch.clamp(x, lo, hi)
    return _total(d * d, run_axis)


def box_value_and_grad(x: torch.Tensor, lower: torch.Tensor | float, upper: torch.Tensor | float, *,
                       run_axis: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`box_penalty` and its gradient in closed form, without autograd.

    With d = x − clamp(x, lower, upper): box = Σ d², ∂box/∂x = 2d (d is zero inside the box): three
    passes over x where autograd spends about ten. ``run_axis``: x (K, m, ...) → values (K,).

    Returns:
        (value, gradient shaped like x).
    """
    lo = torch.as_tensor(lower, dtype=x.dtype, device=x.device)
    hi = torch.as_tensor(upper, dtype=x.dtype, device=x.device)
    d = x - torch.clamp(x, lo, hi)
    return _total(d * d, run_axis), d.mul_(2.0)


def tv_value_and_grad(x: torch.Tensor, *, eps: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed anisotropic total variation Σ √(Δ² + ε²) − ε over vertical and horizontal neighbour
    differences of every candidate and channel, and its gradient (closed form, like x).

    x: (m, C, H, W) (model input space; the mean shift cancels in differences). A natural-image prior
    ("No Prior, No Leakage", 2025): mixtures of several images have more edges than one image.
    """
    xd = x.detach()
    grad = torch.zeros_like(xd)
    total = torch.zeros((), dtype=xd.dtype, device=xd.device)
    for dim in (-2, -1):
        d = xd.diff(dim=dim)
        root = torch.sqrt(d * d + eps * eps)
        total = total + (root - eps).sum()
        w = d / root  # ∂/∂d
        if dim == -1:
            grad[..., :, 1:] += w
            grad[..., :, :-1] -= w
        else:
            grad[..., 1:, :] += w
            grad[..., :-1, :] -= w
    return total, grad


def _box(x: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, run_axis: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return box_value_and_grad(x, lower, upper, run_axis=run_axis)


def _tv(x: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, run_axis: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not run_axis:
        return tv_value_and_grad(x)
    rows = [tv_value_and_grad(xk) for xk in x]
    return torch.stack([v for v, _ in rows]), torch.stack([g for _, g in rows])


@dataclass(frozen=True)
class Prior:
    """A prior on the candidates.

    Attributes:
        fn: (x, lower, upper, run_axis) → (value, gradient like x).
        weight_field: the config field that weighs it (off when absent or 0).
        description: one line for docs and help.
        reported: its value is computed and reported even at weight 0 (so every history has it).
    """

    fn: PriorFn
    weight_field: str
    description: str
    reported: bool = False


PRIORS: Registry[Prior] = Registry("prior")
PRIORS.register("box", Prior(_box, "box_weight", "Σ (x − clamp(x, lower, upper))²: candidates inside the pixel box",
                             reported=True))
PRIORS.register("tv", Prior(_tv, "tv_weight", "smoothed total variation: one image has fewer edges than a mixture"))


def add_priors(config: Any, x: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, terms: dict[str, torch.Tensor],
               grad: torch.Tensor, *, run_axis: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A step's objective and gradient with the priors ``config`` weighs: for each prior of
    :data:`PRIORS` (registry order) whose weight field the config has, and whose weight is above 0
    or which is always ``reported``, ``terms[name]`` = its value, ``terms["loss"]`` += weight · value
    and ``grad`` += weight · its gradient (in place).

    Args:
        config: the attack's config (pydantic).
        x: (m, C, H, W) candidates (detached), or (K, m, C, H, W) with ``run_axis``.
        lower, upper: the pixel box, scalars or (C, H, W).
        terms: the objective's terms, ``"loss"`` included (scalars, or (K,) with ``run_axis``).
        grad: ∂loss/∂x shaped like x.

    Returns:
        (terms, grad) with the priors added.
    """
    fields = type(config).model_fields
    for name in PRIORS.ordered():
        entry = PRIORS.get(name)
        if entry.weight_field not in fields:
            continue
        weight = getattr(config, entry.weight_field)
        if weight <= 0 and not entry.reported:
            continue
        value, prior_grad = entry.fn(x, lower, upper, run_axis)
        terms[name], terms["loss"] = value, terms["loss"] + weight * value
        if weight:
            grad = grad.add_(prior_grad, alpha=weight)
    return terms, grad


__all__ = ["PRIORS", "Prior", "add_priors", "box_penalty", "box_value_and_grad", "tv_value_and_grad"]
