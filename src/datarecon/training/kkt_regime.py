"""Is a trained network in the KKT regime? Pure functions (no logging, no state).

Haim et al. (2022) rest on Lyu & Li (2020) / Ji & Telgarsky (2020): gradient flow on
logistic loss over a positively L-homogeneous network (bias-free ReLU MLP with L linear
layers) converges in direction to a KKT point of

    min ‖θ‖²  s.t.  y_i Φ(θ; x_i) ≥ 1,

i.e. θ* ∝ Σ_i λ_i y_i ∇_θΦ(θ*; x_i) with λ_i ≥ 0 (stationarity) — the condition the KKT
attack inverts. Two diagnostics:

* the normalised margin  γ̄(θ) = min_i y_i Φ(θ; x_i) / ‖θ‖^L,  non-decreasing along the flow
  once the data are separated (Lyu & Li 2020, Thm 4.1); it stabilises when training has
  gone far enough;
* the KKT-regime score  s(θ*) = min_{λ ≥ 0} ‖θ* − Jᵀ(λ ⊙ y)‖² / ‖θ*‖²,
  with J the (n × P) matrix of per-sample gradients ∇_θΦ(θ*; x_i) (binary tasks) or of
  per-sample margin gradients ∇_θ(Φ_{y_i} − max_{j≠y_i} Φ_j) (multiclass, Buzaglo et al.
  2023). The scale of λ is free, so s ∈ [0, 1]: 0 means θ* is exactly a non-negative
  combination of the training gradients (the attack's premise holds), 1 means no
  non-negative combination explains any part of θ*.

s(θ*) is a non-negative least-squares problem in λ for fixed data: with A = (diag(y) J)ᵀ
(P × n), min_{λ≥0} ‖A λ − θ*‖². We solve it on the small n × n normal equations
(G = AᵀA = J Jᵀ with the label sign inside J, b = Aᵀθ*) — P may be millions, n hundreds.
For the plain MLPs of :mod:`datarecon.models.spec`, G and b come layer by layer from one
forward/backward pass (per-sample gradients of a linear layer are outer products δ aᵀ); other models
use torch.func per-sample gradients. We solve with either
scipy's Lawson–Hanson NNLS on a Cholesky factor of G, or projected gradient (FISTA) on
½λᵀGλ − bᵀλ. The two agree; the tests check both against each other and against a planted
solution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from datarecon.errors import DataReconError
from datarecon.kernel.losses import margins


def homogeneity_degree(model: nn.Module) -> int:
    """L = number of linear and convolution layers; a bias-free ReLU MLP or CNN satisfies Φ(cθ; x) = c^L Φ(θ; x)."""
    return sum(1 for m in model.modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)))


def params_norm(params: Mapping[str, torch.Tensor] | nn.Module) -> float:
    """‖θ‖₂ over all parameters (computed in float64)."""
    tensors = params.parameters() if isinstance(params, nn.Module) else params.values()
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def normalised_margin(sample_margins: torch.Tensor, weight_norm: float, degree: int) -> float:
    """γ̄ = min_i margin_i / ‖θ‖^L (Lyu & Li 2020, eq. 5). Negative while some sample is misclassified.

    Args:
        sample_margins: (n,) output margins (``datarecon.kernel.losses.margins``).
        weight_norm: ‖θ‖₂.
        degree: L, the homogeneity degree.
    """
    if sample_margins.numel() == 0 or weight_norm == 0.0:
        return float("nan")
    return float(sample_margins.min()) / weight_norm ** degree


# --------------------------------------------------------------------------------------------
# KKT-regime score


def per_sample_gradients(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                         y: torch.Tensor, *, chunk_size: int = 64) -> torch.Tensor:
    """J: per-sample gradients of the signed output, one row per sample.

    Row i is ∇_θ (y_i · Φ(θ; x_i)) for binary labels (float ±1), or ∇_θ (Φ_{y_i} − max_{j≠y_i} Φ_j)
    for class-index labels. Computed with ``torch.func`` (vmap over grad), ``chunk_size`` samples at
    a time to bound memory.

    Args:
        model: the network (called functionally with ``params``).
        params: θ, name -> tensor.
        x: (n, *input_shape) model input space.
        y: (n,) labels.

    Returns:
        (n, P) tensor in the parameters' dtype, parameters flattened in ``params`` order.
    """
    names = list(params)
    detached = {k: v.detach() for k, v in params.items()}

    def signed_output(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return margins(out, yi.unsqueeze(0))[0]

    g = vmap(grad(signed_output), in_dims=(None, 0, 0), chunk_size=chunk_size)(detached, x, y)
    return torch.cat([g[k].reshape(x.shape[0], -1) for k in names], dim=1)


@dataclass(frozen=True)
class KKTRegimeScore:
    """Result of :func:`kkt_regime_score`.

    Attributes:
        score: min_{λ≥0} ‖θ* − Aλ‖² / ‖θ*‖² ∈ [0, 1].
        multipliers: (n,) the minimising λ ≥ 0 (scale relative to the un-normalised J).
        num_active: number of λ_i > 1e-8·max λ (support vectors).
        solver: ``nnls`` or ``fista``.
    """

    score: float
    multipliers: torch.Tensor
    num_active: int
    solver: str


def nnls_normal_equations(gram: np.ndarray, b: np.ndarray, c: float, *,
                          solver: str = "nnls", max_iter: int = 20000, tol: float = 1e-12) -> tuple[np.ndarray, float]:
    """min_{λ ≥ 0} ‖Aλ − t‖² given only G = AᵀA (n×n), b = Aᵀt (n,) and c = ‖t‖².

    ‖Aλ − t‖² = λᵀGλ − 2bᵀλ + c.

    Args:
        solver: ``nnls``: factor G = RᵀR (eigen-decomposition, eigenvalues below 1e-10·max dropped) and run
            scipy's Lawson–Hanson NNLS on ‖Rλ − R⁻ᵀb‖ (exactly equivalent up to the constant);
            ``fista``: accelerated projected gradient on ½λᵀGλ − bᵀλ with step 1/‖G‖₂.

    Returns:
        (λ, residual ‖Aλ − t‖² ≥ 0).
    """
    gram = np.asarray(gram, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n = b.shape[0]
    # samples with a (numerically) zero gradient, e.g. all ReLUs dead: λ_i has no effect; fix it to 0
    diag = np.diag(gram)
    live = diag > max(float(diag.max(initial=0.0)), 0.0) * 1e-12
    if not live.all():
        lam = np.zeros(n)
        if live.any():
            sub, _ = nnls_normal_equations(gram[np.ix_(live, live)], b[live], c, solver=solver,
                                           max_iter=max_iter, tol=tol)
            lam[live] = sub
        residual = float(lam @ gram @ lam - 2.0 * b @ lam + c)
        return lam, max(residual, 0.0)
    if solver == "nnls":
        from scipy.optimize import nnls  # lazy: scipy.optimize is slow to import; only this solver needs it

        w, v = np.linalg.eigh(0.5 * (gram + gram.T))
        # drop numerically-null directions (relative 1e-10): along them λ is not identifiable and
        # dividing rounding noise of b by √w would produce huge spurious multipliers
        keep = w > max(w.max(initial=0.0), 0.0) * 1e-10
        if not keep.any():
            return np.zeros(n), float(c)
        # G ≈ V_k diag(w_k) V_kᵀ = RᵀR with R = diag(√w_k) V_kᵀ; target d with Rᵀd = projection of b.
        r = np.sqrt(w[keep])[:, None] * v[:, keep].T
        d = (v[:, keep].T @ b) / np.sqrt(w[keep])
        lam, _ = nnls(r, d, maxiter=max(50 * n, 1000))
    elif solver == "fista":
        lipschitz = float(np.linalg.eigvalsh(0.5 * (gram + gram.T)).max(initial=0.0))
        if lipschitz <= 0.0:
            return np.zeros(n), float(c)
        lam = np.zeros(n)
        z, t = lam.copy(), 1.0
        for _ in range(max_iter):
            lam_new = np.maximum(z - (gram @ z - b) / lipschitz, 0.0)
            t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
            z = lam_new + ((t - 1.0) / t_new) * (lam_new - lam)
            if np.linalg.norm(lam_new - lam) <= tol * max(1.0, np.linalg.norm(lam_new)):
                lam = lam_new
                break
            lam, t = lam_new, t_new
    else:
        raise DataReconError(f"unknown NNLS solver {solver!r}; valid names: fista, nnls")
    residual = float(lam @ gram @ lam - 2.0 * b @ lam + c)
    return lam, max(residual, 0.0)


def kkt_regime_score(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                     params: Mapping[str, torch.Tensor] | None = None, solver: str = "nnls",
                     chunk_size: int = 64, max_bytes: int = 1 << 30, method: str = "auto") -> KKTRegimeScore:
    """How far θ* is from a KKT point of the max-margin problem on (x, y).

        s = min_{λ ≥ 0} ‖θ* − Σ_i λ_i y_i ∇_θΦ(θ*; x_i)‖² / ‖θ*‖²

    (Haim et al. 2022, eq. 4 stationarity; for multiclass, the margin gradients of Buzaglo et al.
    2023). Computed in float64 (J is built in the parameters' dtype, then accumulated to the
    n × n Gram matrix in float64).

    Args:
        model: the network; its parameters are θ* unless ``params`` is given.
        x: (n, *input_shape) training inputs in model input space.
        y: (n,) training labels (float ±1 or int64 classes).
        solver: ``nnls`` (scipy Lawson–Hanson) or ``fista`` (projected gradient).
        chunk_size: samples per vmap chunk (lowered automatically to respect ``max_bytes``).
        method: how the Gram matrix G = J Jᵀ and b = J θ* are built. ``layerwise``: for the
            ``nn.Sequential`` MLPs of :mod:`datarecon.models.spec` (Flatten/Linear/ReLU only), the
            per-sample gradient of a linear layer is the outer product δ_i a_iᵀ (backpropagated
            signal × layer input), so ⟨J_i, J_k⟩ = Σ_l (δ_li·δ_lk)(a_li·a_lk + [bias]) and
            (Jθ)_i = Σ_l δ_li·z_li (z = pre-activation): one forward/backward in float64, no n × P
            matrix. ``jacobian``: generic ``torch.func`` per-sample gradients (any model).
            ``auto``: ``layerwise`` when the model allows it.
        max_bytes: memory budget for per-sample gradients (``jacobian`` method). When the whole J (n × P) fits, it is
            built once; otherwise J is streamed in row blocks and blocks are recomputed for each
            pair of blocks of the Gram matrix (more time, bounded memory).

    Returns:
        :class:`KKTRegimeScore`.

    References:
        Haim et al. 2022 (NeurIPS), §3; Lyu & Li 2020 Thm 4.4; Runkel et al. 2024 §2.
    """
    if params is None:
        params = {k: v.detach() for k, v in model.named_parameters()}
    if x.shape[0] != y.shape[0]:
        raise DataReconError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
    theta = torch.cat([p.detach().reshape(-1) for p in params.values()]).double()
    c = float(theta @ theta)
    if c == 0.0:
        raise DataReconError("all parameters are zero; the KKT-regime score is undefined")
    if method not in ("auto", "layerwise", "jacobian"):
        raise DataReconError(f"unknown Gram method {method!r}; valid names: auto, jacobian, layerwise")
    layers = _layerwise_plan(model, params)
    if method == "layerwise" and layers is None:
        raise DataReconError("method 'layerwise' needs an nn.Sequential of Flatten/Linear/ReLU; use method 'jacobian'")
    if layers is not None and method != "jacobian":
        gram, b = _gram_and_rhs_layerwise(layers, x, y)
    else:
        gram, b = _gram_and_rhs(model, params, x, y, theta, chunk_size=chunk_size, max_bytes=max_bytes)
    lam, residual = nnls_normal_equations(gram.numpy(), b.numpy(), c, solver=solver)
    lam_t = torch.from_numpy(lam)
    top = float(lam.max()) if lam.size else 0.0
    return KKTRegimeScore(score=min(max(residual / c, 0.0), 1.0), multipliers=lam_t,
                          num_active=int((lam_t > 1e-8 * top).sum()) if top > 0 else 0,
                          solver=solver)


def _gram_and_rhs(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  theta: torch.Tensor, *, chunk_size: int, max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """G = J Jᵀ (n × n) and b = J θ (n,) in float64 (CPU), J streamed in row blocks."""
    n = x.shape[0]
    num_params = theta.numel()
    elem = next(iter(params.values())).element_size()
    # at most two row blocks alive at once, plus their float64 copies in the product
    per_row = num_params * (elem + 8)
    chunk = max(1, min(chunk_size, max_bytes // max(1, 2 * per_row)))
    slices = [slice(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    store_all = n * num_params * elem <= max_bytes

    def block(sl: slice) -> torch.Tensor:
        return per_sample_gradients(model, params, x[sl], y[sl], chunk_size=chunk)

    theta_dev = theta.to(x.device)
    gram = torch.zeros(n, n, dtype=torch.float64)
    b = torch.zeros(n, dtype=torch.float64)
    cache: list[torch.Tensor] = []
    for i, si in enumerate(slices):
        ji = block(si)
        if store_all:
            cache.append(ji)
        ji64 = ji.double()
        b[si] = (ji64 @ theta_dev).cpu()
        for k in range(i + 1):
            sk = slices[k]
            jk64 = ji64 if k == i else (cache[k] if store_all else block(sk)).double()
            g = (ji64 @ jk64.T).cpu()
            gram[si, sk] = g
            gram[sk, si] = g.T
    return gram, b


def _layerwise_plan(model: nn.Module, params: Mapping[str, torch.Tensor]) -> list[tuple[str, Any]] | None:
    """[("flatten"|"relu", None) | ("linear", (W, b|None))] for a plain MLP, else None."""
    if not isinstance(model, nn.Sequential):
        return None
    plan: list[tuple[str, Any]] = []
    used = set()
    for idx, m in enumerate(model):
        if isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
            plan.append(("flatten", None))
        elif isinstance(m, nn.ReLU):
            plan.append(("relu", None))
        elif isinstance(m, nn.Linear):
            w = params.get(f"{idx}.weight")
            bias = params.get(f"{idx}.bias")
            if w is None or (m.bias is not None and bias is None):
                return None
            used.update({f"{idx}.weight"} | ({f"{idx}.bias"} if bias is not None else set()))
            plan.append(("linear", (w, bias)))
        else:
            return None
    return plan if used == set(params) else None


def _gram_and_rhs_layerwise(plan: list[tuple[str, Any]], x: torch.Tensor,
                            y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """G and b from layer inputs a_l and backpropagated signals δ_l (float64, one pass)."""
    h = x.detach().double()
    inputs: list[torch.Tensor] = []
    pre: list[torch.Tensor] = []
    has_bias: list[bool] = []
    with torch.enable_grad():
        for kind, arg in plan:
            if kind == "flatten":
                h = h.flatten(1)
            elif kind == "relu":
                h = torch.relu(h)
            else:
                w, bias = arg
                inputs.append(h.detach())
                z = h @ w.detach().double().T
                if bias is not None:
                    z = z + bias.detach().double()
                if not z.requires_grad:
                    z.requires_grad_(True)
                pre.append(z)
                has_bias.append(bias is not None)
                h = z
        signed = margins(h, y.to(h.dtype) if y.dtype.is_floating_point else y)
        deltas = torch.autograd.grad(signed.sum(), pre)
    n = x.shape[0]
    gram = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    b = torch.zeros(n, dtype=torch.float64, device=x.device)
    for a, z, d, bias in zip(inputs, pre, deltas, has_bias):
        dd = d @ d.T
        gram += dd * (a @ a.T + (1.0 if bias else 0.0))
        b += (d * z.detach()).sum(1)
    return gram.cpu(), b.cpu()
