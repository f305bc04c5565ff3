"""When does an attack's objective identify the training data? The defender's check, with no attack run.

The KKT family of attacks (Haim et al. 2022; Buzaglo et al. 2023; Loo et al. 2023) searches for inputs x
and multipliers λ ≥ 0 such that a target vector t is a combination of per-example margin gradients:

    t ≈ Σ_i λ_i ∇_θ m(x_i; θ_g),          m the formulation's margin (binary: y·Φ; multiclass: Φ_y − max_{j≠y} Φ_j)

* ``kkt``: t = θ*, gradients at θ_g = θ* (weights only);
* ``kkt-init``: t = θ* − θ_init, gradients at θ* (the initialisation known);
* ``loo``: t = θ* − θ_init, gradients at θ_init (Loo et al.'s linearisation);
* ``path``: t = θ* − θ_init, gradients at the points θ_init + s·(θ* − θ_init), s ∈ {0, 1/3, 2/3, 1}, one λ
  per example and point.

An attack, run perfectly, ends at the x whose best λ leaves the smallest residual. A defender who holds the
training set can therefore ask, for each objective, whether the training set leaves a smaller residual than
plausible fakes — held-out images, means of two training images, partition images — with the **optimal**
multipliers of each set: a non-negative least-squares problem on the Gram matrix of the per-example
gradients, solved exactly (:func:`optimal_multipliers`). Where a fake fits better than the truth, the
objective does not identify the training set, whatever the optimiser.

The Gram matrices come in closed form for ``nn.Linear`` layers (a per-example weight gradient is the outer
product δ aᵀ of the layer's output gradient and input, so ⟨g_i, g_j⟩ = (δ_i·δ_j)(a_i·a_j)) and from
per-example gradients (``torch.func``) for every other parameter. The residual is reported per parameter
tensor and in total, relative to ‖t‖² (the attacks' ``relative_residual``).

References:
    Haim, Vardi, Yehudai, Shamir, Irani (2022), eq. 3–5; Buzaglo et al. (2023), §3; Loo, Hasani, Lechner,
    Amini, Rus (2023), "Dataset distillation fixes dataset reconstruction attacks", §3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from datarecon.errors import DataReconError
from datarecon.kernel.losses import margins

__all__ = ["GradientFeatures", "ObjectiveFit", "fit_objective", "gradient_features", "gram_blocks",
           "optimal_multipliers", "target_products"]

Params = Mapping[str, torch.Tensor]


@dataclass
class GradientFeatures:
    """Per-example margin gradients at one parameter point, kept in factored form.

    Attributes:
        linear: ``weight name → (δ (n, out), a (n, in))``: the per-example gradient of that weight is δ_i a_iᵀ.
        bias: ``bias name → δ (n, out)``: the per-example gradient of a linear layer's bias.
        dense: ``name → (n, numel)``: explicit per-example gradients of every other parameter.
    """

    linear: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    bias: dict[str, torch.Tensor] = field(default_factory=dict)
    dense: dict[str, torch.Tensor] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [*self.linear, *self.bias, *self.dense]


def _margin(out: torch.Tensor, y: torch.Tensor, formulation: str) -> torch.Tensor:
    if formulation == "regression":
        return out.reshape(out.shape[0], -1)[:, 0]
    return margins(out, y, multiclass=formulation == "multiclass")


def gradient_features(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, *,
                      formulation: str, factor_linear: bool = True) -> GradientFeatures:
    """The per-example gradients of the margin m(x_i; θ) at ``params``, in factored form for ``nn.Linear`` layers.

    Args:
        model: the architecture (called functionally with ``params``; buffers are its own).
        params: θ by name (all floating parameters of the model).
        x: (n, *input_shape) inputs; y: (n,) labels.
        formulation: ``binary``, ``multiclass`` or ``regression`` (:data:`datarecon.attacks.kkt_math.MARGINS`).
        factor_linear: keep linear layers factored (False: explicit gradients for every parameter, the
            reference the factored form is tested against).
    """
    linear_mods = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)} if factor_linear else {}
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {name: [] for name in linear_mods}
    hooks = []
    for name, mod in linear_mods.items():
        def hook(_m, inp, out, name=name):  # type: ignore[no-untyped-def]
            out.retain_grad()
            seen[name].append((inp[0].detach(), out))
        hooks.append(mod.register_forward_hook(hook))
    leaf = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    try:
        out = functional_call(model, leaf, (x,))
        _margin(out, y, formulation).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    feats = GradientFeatures()
    factored: set[str] = set()
    for name, calls in seen.items():
        if len(calls) != 1 or calls[0][1].grad is None or calls[0][0].dim() != 2:
            continue  # applied several times (shared weights) or on non-flat inputs: explicit gradients instead
        a, z = calls[0]
        feats.linear[f"{name}.weight" if name else "weight"] = (z.grad.detach(), a)
        factored.add(f"{name}.weight" if name else "weight")
        if linear_mods[name].bias is not None:
            feats.bias[f"{name}.bias" if name else "bias"] = z.grad.detach()
            factored.add(f"{name}.bias" if name else "bias")
    rest = [k for k in params if k not in factored]
    if rest:
        feats.dense = _dense_gradients(model, params, rest, x, y, formulation)
    return feats


def _dense_gradients(model: nn.Module, params: Params, names: list[str], x: torch.Tensor, y: torch.Tensor,
                     formulation: str) -> dict[str, torch.Tensor]:
    """Explicit per-example gradients of ``names`` (the others held at ``params``), (n, numel) each."""
    fixed = {k: v.detach() for k, v in params.items() if k not in names}

    def one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, {**fixed, **p}, (xi[None],))
        return _margin(out, yi[None], formulation)[0]

    free = {k: params[k].detach() for k in names}
    rows: dict[str, list[torch.Tensor]] = {k: [] for k in names}
    for i in range(0, x.shape[0], 32):
        g = vmap(grad(one), in_dims=(None, 0, 0))(free, x[i:i + 32], y[i:i + 32])
        for k in names:
            rows[k].append(g[k].reshape(g[k].shape[0], -1))
    return {k: torch.cat(v) for k, v in rows.items()}


def gram_blocks(fa: GradientFeatures, fb: GradientFeatures) -> dict[str, torch.Tensor]:
    """⟨g_i^a, g_j^b⟩ per parameter tensor, (n_a, n_b) each, for two sets of features of the same model."""
    out = {}
    for k, (da, aa) in fa.linear.items():
        db, ab = fb.linear[k]
        out[k] = (da @ db.T) * (aa @ ab.T)
    for k, da in fa.bias.items():
        out[k] = da @ fb.bias[k].T
    for k, ga in fa.dense.items():
        out[k] = ga @ fb.dense[k].T
    return out


def target_products(f: GradientFeatures, target: Params) -> dict[str, torch.Tensor]:
    """⟨t, g_i⟩ per parameter tensor, (n,) each: for a linear weight δ_iᵀ T a_i."""
    out = {}
    for k, (d, a) in f.linear.items():
        out[k] = ((d @ target[k].to(d.dtype)) * a).sum(1)
    for k, d in f.bias.items():
        out[k] = d @ target[k].to(d.dtype)
    for k, g in f.dense.items():
        out[k] = g @ target[k].reshape(-1).to(g.dtype)
    return out


def optimal_multipliers(gram: torch.Tensor, cross: torch.Tensor, *, signed: bool = False) -> np.ndarray:
    """argmin_λ ‖t − Gλ‖² = ‖t‖² − 2 cᵀλ + λᵀ K λ over λ ≥ 0 (or any sign), from K = GᵀG and c = Gᵀt.

    With K = V diag(s) Vᵀ (eigenvalues s > 0 kept), ‖t − Gλ‖² = ‖diag(√s)Vᵀλ − diag(1/√s)Vᵀc‖² + a constant, a
    non-negative least-squares problem of the size of the set, solved exactly (scipy's NNLS; ``signed``: the
    pseudo-inverse).

    Args:
        gram: (n, n) symmetric positive semi-definite; cross: (n,).
        signed: λ of any sign (the regression formulation).

    Returns:
        (n,) float64 λ.
    """
    from scipy.optimize import nnls  # lazy: scipy.optimize is slow to import and only this fit uses it

    k = gram.detach().to(torch.float64).cpu().numpy()
    c = cross.detach().to(torch.float64).cpu().numpy()
    k = 0.5 * (k + k.T)
    s, v = np.linalg.eigh(k)
    keep = s > max(float(s.max(initial=0.0)), 1e-300) * 1e-12
    a = np.sqrt(s[keep])[:, None] * v[:, keep].T
    rhs = (v[:, keep].T @ c) / np.sqrt(s[keep])
    if signed:
        return np.linalg.lstsq(a, rhs, rcond=None)[0]
    return nnls(a, rhs, maxiter=50 * k.shape[0])[0]


@dataclass(frozen=True)
class ObjectiveFit:
    """How well a set of inputs explains a target vector with its optimal multipliers.

    Attributes:
        relative_residual: ‖t − Gλ*‖² / ‖t‖² in total.
        per_layer: parameter tensor → ‖t_l − G_l λ*‖² / ‖t_l‖² at the same λ*.
        multipliers: (columns,) λ*.
    """

    relative_residual: float
    per_layer: dict[str, float]
    multipliers: np.ndarray


def fit_objective(features: list[GradientFeatures], target: Params, *, signed: bool = False) -> ObjectiveFit:
    """The optimal multipliers of the columns of ``features`` (one λ per example and feature set) for ``target``.

    Args:
        features: one :class:`GradientFeatures` per gradient point (one for ``kkt``, ``kkt-init`` and ``loo``;
            one per path point for ``path``), each of the same examples.
        target: t by parameter name.
        signed: λ of any sign.
    """
    names = features[0].names()
    blocks = [[gram_blocks(fa, fb) for fb in features] for fa in features]
    crosses = [target_products(f, target) for f in features]
    gram = {k: torch.cat([torch.cat([blocks[i][j][k] for j in range(len(features))], 1)
                          for i in range(len(features))], 0) for k in names}
    cross = {k: torch.cat([c[k] for c in crosses]) for k in names}
    norms = {k: float(target[k].to(torch.float64).pow(2).sum()) for k in names}
    total = sum(norms.values())
    if total <= 0:
        raise DataReconError("the target vector is zero (all-zero weights, or θ* = θ_init): no residual to fit")
    lam = optimal_multipliers(sum(gram.values()), sum(cross.values()), signed=signed)  # type: ignore[arg-type]
    lt = torch.as_tensor(lam)

    def resid(k: str) -> float:
        g, c = gram[k].to(torch.float64).cpu(), cross[k].to(torch.float64).cpu()
        return norms[k] - 2 * float(c @ lt) + float(lt @ g @ lt)

    per = {k: max(resid(k), 0.0) / norms[k] if norms[k] > 0 else float("nan") for k in names}
    return ObjectiveFit(relative_residual=max(sum(resid(k) for k in names), 0.0) / total, per_layer=per,
                        multipliers=lam)
