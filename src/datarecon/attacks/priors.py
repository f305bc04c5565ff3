"""Priors on the candidates, defined once: the pixel box, total variation, the feature statistics of
batch norm, group consistency across restarts and the principal subspace of the attacker's public images.

A prior in :data:`PRIORS` applies to an attack whose config has its weight field (``box_weight``,
``tv_weight``: the field names recorded runs already have, so their hashes do not change;
``feature_stats_weight``, ``group_weight``, ``pca_weight``); :func:`add_priors` adds every such prior to a step's
objective and gradient. Each prior is a value and its gradient (closed form where one is short,
autograd where the prior runs the network), over all candidates, or per run over a leading run
axis.

References:
    Yin et al. (2020), "Dreaming to Distill" (DeepInversion): the feature-statistics prior R_BN.
    Yin et al. (2021), "See through Gradients" (GradInversion): feature statistics and group
    consistency for gradient inversion of batch-norm ResNets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn
from torch.func import functional_call

from datarecon.attacks.public import pca_value_and_grad
from datarecon.errors import DataReconError
from datarecon.registry import Registry


@dataclass(frozen=True)
class PriorInput:
    """What a prior reads: the candidates and what the attacker has beside them.

    Attributes:
        x: (m, C, H, W) candidates (detached), or (K, m, C, H, W) with ``run_axis``.
        lower, upper: the pixel box, scalars or (C, H, W).
        run_axis: x has a leading run axis (K runs stepped together).
        target: the attacked model (:class:`datarecon.attacks.base.Target`: ``model`` and θ*
            ``params``), for the priors that run the network; None where no prior needs it.
        labels: (m,) the candidates' labels, or (K, m) with ``run_axis``; None where unknown.
        public: the principal subspace of the attacker's public images (:class:`datarecon.attacks.public.
            PublicSubspace`, in x's dtype and device) for the public-data prior; None where none was computed.
    """

    x: torch.Tensor
    lower: torch.Tensor | float
    upper: torch.Tensor | float
    run_axis: bool = False
    target: Any = None
    labels: torch.Tensor | None = None
    public: Any = None


#: PriorInput -> (value scalar or (K,), gradient like x)
PriorFn = Callable[[PriorInput], tuple[torch.Tensor, torch.Tensor]]


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


def batch_norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The batch-norm layers of ``model`` by module name, in registration order (the forward's order
    for the built-in networks)."""
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]


#: the refusal of the feature-statistics prior on a target without batch norm
NO_BATCH_NORM = ("the feature-statistics prior reads batch-norm layers and the target has none; set "
                 "feature_stats_weight to 0")


def feature_stats_value(model: nn.Module, params: Mapping[str, torch.Tensor], stats: Mapping[str, torch.Tensor],
                        x: torch.Tensor) -> torch.Tensor:
    """The feature-statistics prior R_BN(x) = Σ_l ‖μ_l(x) − μ_l‖₂ + ‖σ²_l(x) − σ²_l‖₂ (scalar, differentiable in x).

    For every batch-norm layer l, μ_l(x) and σ²_l(x) are the per-channel mean and (biased) variance of
    the layer's input over the candidate batch and its pixels, and μ_l, σ²_l the layer's running
    statistics (the ones a network in eval mode normalises with: what its training data looked like
    at that layer). The forward runs the network in eval mode at ``params``.

    Args:
        model: the architecture (in eval mode); its own parameters and buffers are not read.
        params: θ by name; stats: the buffers by name (``<layer>.running_mean``, ``<layer>.running_var``).
        x: (m, C, H, W) candidates in model input space, m ≥ 1.

    Raises:
        DataReconError: ``model`` has no batch-norm layer.

    References:
        Yin et al. (2020) DeepInversion, eq. 4; Yin et al. (2021) GradInversion, eq. 6.
    """
    layers = batch_norm_layers(model)
    if not layers:
        raise DataReconError(NO_BATCH_NORM)
    inputs: dict[str, torch.Tensor] = {}
    hooks = [mod.register_forward_hook(lambda _m, inp, _o, name=name: inputs.__setitem__(name, inp[0]))
             for name, mod in layers]
    try:
        functional_call(model, {**stats, **params}, (x,))
    finally:
        for h in hooks:
            h.remove()
    total = x.new_zeros(())
    for name, _ in layers:
        h = inputs[name]
        dims = [0] + list(range(2, h.dim()))
        mean = h.mean(dim=dims)
        var = h.var(dim=dims, unbiased=False)
        total = total + (mean - stats[f"{name}.running_mean"]).norm() + (var - stats[f"{name}.running_var"]).norm()
    return total


def feature_stats_value_and_grad(model: nn.Module, params: Mapping[str, torch.Tensor],
                                 stats: Mapping[str, torch.Tensor], x: torch.Tensor, *,
                                 run_axis: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`feature_stats_value` and its gradient in x (autograd through one forward and backward);
    per run over a leading run axis with ``run_axis`` (values (K,))."""
    if run_axis:
        rows = [feature_stats_value_and_grad(model, params, stats, xk) for xk in x]
        return torch.stack([v for v, _ in rows]), torch.stack([g for _, g in rows])
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        value = feature_stats_value(model, {k: v.detach() for k, v in params.items()}, stats, xg)
        (grad,) = torch.autograd.grad(value, [xg])
    return value.detach(), grad


def register_to(reference: torch.Tensor, x: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """The permutation of x's candidates that best matches ``reference``'s, candidate for candidate:
    ``perm`` with x[perm[i]] paired with reference[i], minimising Σ_i ‖x[perm[i]] − reference[i]‖²,
    candidates paired only within one label (a restart may find the images of a class in another
    order, never across classes).

    Args:
        reference, x: (m, C, H, W); labels: (m,) shared by both, or None (any pairing).

    Returns:
        (m,) int64 permutation.
    """
    m = x.shape[0]
    cost = torch.cdist(reference.reshape(m, -1).double(), x.reshape(m, -1).double()).pow(2)
    if labels is not None:
        cost = cost + (labels.reshape(-1, 1) != labels.reshape(1, -1)).double() * (cost.max() + 1) * m
    rows, cols = linear_sum_assignment(cost.cpu().numpy())
    perm = torch.empty(m, dtype=torch.int64)
    perm[torch.as_tensor(rows)] = torch.as_tensor(cols)
    return perm


def group_value_and_grad(x: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Group consistency over K restarts: Σ_i ‖x^(k)_π_k(i) − x̄_i‖² per run k, x̄_i = mean_k x^(k)_π_k(i),
    and its gradient 2(x^(k) − x̄) (at fixed registration the mean's own dependence on x^(k) cancels:
    Σ_k (x^(k) − x̄) = 0).

    Each restart is registered to the first by :func:`register_to` (candidates of one label paired by
    least squared distance), so restarts that found the same images in another order agree.

    Args:
        x: (K, m, C, H, W) candidates of K ≥ 2 restarts; labels: (K, m) (the rows equal) or None.

    Returns:
        (values (K,), gradient (K, m, C, H, W)).

    Raises:
        DataReconError: fewer than two restarts.

    References:
        Yin et al. (2021) GradInversion, eq. 8 (group consistency, here with a permutation in place of
        image registration).
    """
    if x.dim() < 3 or x.shape[0] < 2:
        raise DataReconError("group consistency pulls restarts toward their consensus and needs at least two "
                             "runs stepped together (reconstruct --runs K with K >= 2); set group_weight to 0")
    xd = x.detach()
    row_labels = None if labels is None else labels[0].reshape(-1)
    perms = [torch.arange(xd.shape[1])] + [register_to(xd[0], xd[k], row_labels) for k in range(1, xd.shape[0])]
    aligned = torch.stack([xd[k][perm.to(xd.device)] for k, perm in enumerate(perms)])
    consensus = aligned.mean(dim=0)
    diff = aligned - consensus
    values = diff.flatten(1).pow(2).sum(dim=1)
    grad = torch.empty_like(xd)
    for k, perm in enumerate(perms):
        grad[k][perm.to(xd.device)] = 2.0 * diff[k]
    return values, grad


def _box(p: PriorInput) -> tuple[torch.Tensor, torch.Tensor]:
    return box_value_and_grad(p.x, p.lower, p.upper, run_axis=p.run_axis)


def tv_mean_value_and_grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tv_value_and_grad` divided by the number of elements of ``x`` (m·C·H·W): the total
    variation per pixel, the one meaning of ``tv_weight`` in every attack (dynamics matching's and
    Geiping et al.'s), so one weight fits any number and size of candidates."""
    value, grad = tv_value_and_grad(x)
    n = x.numel()
    return value / n, grad.div_(n)


def _tv(p: PriorInput) -> tuple[torch.Tensor, torch.Tensor]:
    if not p.run_axis:
        return tv_mean_value_and_grad(p.x)
    rows = [tv_mean_value_and_grad(xk) for xk in p.x]
    return torch.stack([v for v, _ in rows]), torch.stack([g for _, g in rows])


def _feature_stats(p: PriorInput) -> tuple[torch.Tensor, torch.Tensor]:
    if p.target is None:
        raise DataReconError("the feature-statistics prior runs the target network; this attack does not pass it")
    model = p.target.model
    stats = {k: v.to(p.x.dtype) for k, v in model.named_buffers() if v.is_floating_point()}
    params = {k: v.to(p.x.dtype) for k, v in p.target.params.items()}
    return feature_stats_value_and_grad(model, params, stats, p.x, run_axis=p.run_axis)


def _group(p: PriorInput) -> tuple[torch.Tensor, torch.Tensor]:
    if not p.run_axis:
        raise DataReconError("group consistency pulls restarts toward their consensus and needs at least two "
                             "runs stepped together (reconstruct --runs K with K >= 2); set group_weight to 0")
    return group_value_and_grad(p.x, p.labels)


def _pca(p: PriorInput) -> tuple[torch.Tensor, torch.Tensor]:
    if p.public is None:
        raise DataReconError("the public-data prior needs the principal subspace of the public images, which this "
                             "run was not given (datarecon reconstruct computes it for a model fine-tuned from a "
                             "pretrained model); set pca_weight to 0")
    return pca_value_and_grad(p.x, p.public, run_axis=p.run_axis)


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
PRIORS.register("tv", Prior(_tv, "tv_weight", "smoothed total variation per pixel: one image has fewer edges than a "
                                             "mixture"))
PRIORS.register("feature_stats", Prior(_feature_stats, "feature_stats_weight", "Σ over batch-norm layers of the "
                                       "distance of the candidates' per-channel mean and variance to the running ones"))
PRIORS.register("group", Prior(_group, "group_weight", "Σ ‖x − consensus‖² over restarts stepped together "
                               "(registered within each label)"))
PRIORS.register("pca", Prior(_pca, "pca_weight", "squared residual per pixel outside the first pca_components "
                             "principal components of the attacker's public images"))


def add_priors(config: Any, given: PriorInput, terms: dict[str, torch.Tensor], grad: torch.Tensor, *,
               skip: tuple[str, ...] = ()) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A step's objective and gradient with the priors ``config`` weighs: for each prior of
    :data:`PRIORS` (registry order) whose weight field the config has, and whose weight is above 0
    or which is always ``reported``, ``terms[name]`` = its value, ``terms["loss"]`` += weight · value
    and ``grad`` += weight · its gradient (in place).

    Args:
        config: the attack's config (pydantic).
        given: the candidates (detached; (m, C, H, W), or (K, m, C, H, W) with ``run_axis``), the pixel
            box and what the priors that run the network or register restarts read (:class:`PriorInput`).
        terms: the objective's terms, ``"loss"`` included (scalars, or (K,) with ``run_axis``).
        grad: ∂loss/∂x shaped like x.
        skip: names of priors the attack applies itself (or a group of runs applies).

    Returns:
        (terms, grad) with the priors added.
    """
    fields = type(config).model_fields
    for name in PRIORS.ordered():
        entry = PRIORS.get(name)
        if entry.weight_field not in fields or name in skip:
            continue
        weight = getattr(config, entry.weight_field)
        if weight <= 0 and not entry.reported:
            continue
        value, prior_grad = entry.fn(given)
        terms[name], terms["loss"] = value, terms["loss"] + weight * value
        if weight:
            grad = grad.add_(prior_grad, alpha=weight)
    return terms, grad


def check_weights(config: Any) -> None:
    """Refuse a prior weight beyond the range of the attack's dtype (``config.dtype``, float32 without one): the
    step adds weight · gradient in that dtype, which cannot hold the weight.

    Raises:
        DataReconError: one line naming the field, its value and the largest the dtype holds.
    """
    fields = type(config).model_fields
    dtype = str(getattr(config, "dtype", "float32"))
    largest = torch.finfo(getattr(torch, dtype, torch.float32)).max
    for name in PRIORS.ordered():
        field = PRIORS.get(name).weight_field
        if field in fields and getattr(config, field) > largest:
            raise DataReconError(f"{field} {getattr(config, field):g} is beyond the range of {dtype} (largest "
                                 f"{largest:.3g}); pass a smaller --{field.replace('_', '-')} ({field})")


def weighted_total(config: Any, given: PriorInput, *, skip: tuple[str, ...] = ()) -> float:
    """Σ weight · value of the priors ``config`` weighs above 0 (registry order, ``skip`` left out), at one point
    where no gradient is needed (a line search's trial point): the priors' part of the objective
    :func:`add_priors` builds at a step. 0.0 without any."""
    total = 0.0
    for name in weighted_priors(config):
        if name not in skip:
            entry = PRIORS.get(name)
            total += getattr(config, entry.weight_field) * float(entry.fn(given)[0])
    return total


def weighted_priors(config: Any) -> tuple[str, ...]:
    """The names of the priors ``config`` weighs above 0 (registry order)."""
    fields = type(config).model_fields
    return tuple(name for name in PRIORS.ordered()
                 if PRIORS.get(name).weight_field in fields and getattr(config, PRIORS.get(name).weight_field) > 0)


__all__ = ["PRIORS", "Prior", "PriorInput", "add_priors", "batch_norm_layers", "box_penalty", "box_value_and_grad",
           "check_weights",
           "feature_stats_value", "feature_stats_value_and_grad", "group_value_and_grad", "register_to",
           "tv_mean_value_and_grad", "tv_value_and_grad", "weighted_priors", "weighted_total"]
