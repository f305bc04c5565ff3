"""Pure functions of the KKT / DecoReco / gradient-norm objectives (no state, no logging).

Notation: candidates x (m, C, H, W) in model input space, labels y (m,), multipliers λ (m,),
θ* the trained parameters (name → tensor), Φ(x; θ) the network (m, k).

Margins (:data:`MARGINS`, "formulations"), out_i as a function of (Φ(x_i), y_i, λ_i):

* ``binary``      out_i = λ_i y_i Φ(x_i)                       (Haim et al. 2022, eq. 3), λ ≥ λ_min
* ``multiclass``  out_i = λ_i (Φ_{y_i}(x_i) − max_{j≠y_i} Φ_j(x_i))  (Buzaglo et al. 2023), λ ≥ λ_min
* ``regression``  out_i = λ_i Φ(x_i), λ of any sign, no λ_min   (Buzaglo et al. 2023, general losses)

Stationarity (KKT condition of the max-margin problem, or of a weight-decayed loss, λ absorbing
the scale):

    g = ∇_θ [ (1/m) Σ_i out_i ]            one batched vector-Jacobian product (create_graph)
    R(x, λ) = Σ_p ‖θ*_p − g_p‖²

Priors: box(x) = Σ relu(x − upper)² + relu(lower − x)² (elementwise, model input space),
hinge(λ) = Σ relu(λ_min − λ)². The attack minimises

    L(x, λ) = R + w_box · box(x) + w_λ · hinge(λ)      (reference: w_box = 1, w_λ = 5)

Gradient norm (Runkel et al. 2024, eq. 3): G(x) = ‖∇_θ E(x, y; θ*)‖², E the training energy
(mean loss + (wd/2)‖θ‖²) from :func:`datarecon.kernel.losses.energy`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from datarecon.registry import Registry
from datarecon.attacks.priors import box_penalty
from datarecon.kernel.losses import LossFn, energy, margins

ForwardFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]
"""Φ(x; params): x (m, C, H, W), params name → tensor, returns (m, k)."""


def _first(outputs: torch.Tensor) -> torch.Tensor:
    return outputs.reshape(outputs.shape[0], -1)[:, 0]


def binary_margin(outputs: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """λ_i y_i Φ(x_i). outputs (m, 1), labels (m,) ±1, λ (m,) → (m,) (margin: :func:`margins`)."""
    return lam * margins(outputs, labels, multiclass=False)


def multiclass_margin(outputs: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """λ_i (Φ_{y_i}(x_i) − max_{j≠y_i} Φ_j(x_i)). outputs (m, k), labels (m,) int64 → (m,) (margin: :func:`margins`)."""
    return lam * margins(outputs, labels, multiclass=True)


def regression_margin(outputs: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """λ_i Φ(x_i) with signed λ (labels unused: the sign is learnt by λ). → (m,)."""
    return lam * _first(outputs)


@dataclass(frozen=True)
class MarginEntry:
    """A formulation: margin function, whether λ is signed (no λ_min), the label kind it needs."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    signed_lambda: bool
    label_kind: str  # "binary" | "multiclass" | "any"
    doc: str


MARGINS: Registry[MarginEntry] = Registry("formulation")
MARGINS.register("binary", MarginEntry(binary_margin, False, "binary", "lambda_i y_i Phi(x_i) (Haim 2022)"))
MARGINS.register("multiclass", MarginEntry(multiclass_margin, False, "multiclass",
                                           "lambda_i (Phi_y - max_{j!=y} Phi_j) (Buzaglo 2023)"))
MARGINS.register("regression", MarginEntry(regression_margin, True, "any",
                                           "lambda_i Phi(x_i), signed lambda (Buzaglo 2023)"))


Bounds = tuple[torch.Tensor | float, torch.Tensor | float]
"""(lower, upper): per-pixel bounds of valid inputs in model input space, scalars or (C, H, W)."""


@dataclass(frozen=True)
class KKTObjective:
    """The settings of the KKT / DecoReco objective L = R + w_box·box + w_λ·hinge (:func:`kkt_objective`).

    Attributes:
        margin: the formulation, a key of :data:`MARGINS`.
        lambda_min: λ_min of the hinge Σ relu(λ_min − λ_i)² (unused by signed-λ formulations).
        lambda_min_weight: w_λ ≥ 0, the hinge's weight (reference 5).
        box_weight: w_box ≥ 0, the pixel-box prior's weight (reference 1; not read by
            :func:`kkt_residual_and_grads`, whose callers add the box prior themselves).
    """

    margin: str
    lambda_min: float
    lambda_min_weight: float
    box_weight: float


@dataclass(frozen=True)
class Matching:
    """What the combination gradient g must match (:func:`matching_goal`): θ*, or θ* − a·θ_init with a
    known initialisation (Loo et al. 2023).

    Attributes:
        theta: θ* (name → tensor); None: the parameters g is taken at.
        init: θ_init (name → tensor, shaped like θ*); None: no known initialisation, the goal is θ*.
        coefficient: a; None (with ``init``): fitted at every call by :func:`init_factor`.
    """

    theta: Mapping[str, torch.Tensor] | None = None
    init: Mapping[str, torch.Tensor] | None = None
    coefficient: float | None = None


@dataclass(frozen=True)
class GradNormObjective:
    """The settings of the gradient-norm objective G(x) + w_box·box (Runkel et al. 2024, eq. 3).

    Attributes:
        loss: the target's training loss, a key of :data:`datarecon.kernel.losses.LOSSES` or a loss
            function (see :func:`datarecon.kernel.losses.resolve_loss`).
        weight_decay: wd ≥ 0 of the training energy E = mean loss + (wd/2)‖θ‖².
        box_weight: w_box ≥ 0, the pixel-box prior's weight.
    """

    loss: str | LossFn
    weight_decay: float
    box_weight: float


def _leaves(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fresh leaves sharing θ*'s storage that require grad (θ* itself is never modified)."""
    return {k: v.detach().requires_grad_(True) for k, v in params.items()}


def combination_gradient(forward: ForwardFn, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                         labels: torch.Tensor, lam: torch.Tensor, *, margin: str,
                         create_graph: bool = True) -> dict[str, torch.Tensor]:
    """g = ∇_θ [(1/m) Σ_i out_i(x_i, λ_i; θ)] at θ = params, as ONE batched VJP.

    Args:
        forward: Φ(x; params).
        params: θ* (name → tensor).
        x: (m, C, H, W); labels (m,); lam (m,).
        margin: a key of :data:`MARGINS`.
        create_graph: keep the graph so g can be differentiated w.r.t. x and λ.

    Returns:
        g, name → tensor shaped like params.
    """
    leaves = _leaves(params)
    outputs = forward(x, leaves)
    total = MARGINS.get(margin).fn(outputs, labels, lam).sum() / x.shape[0]
    grads = torch.autograd.grad(total, list(leaves.values()), create_graph=create_graph, allow_unused=True)
    return {k: (gr if gr is not None else torch.zeros_like(leaves[k])) for k, gr in zip(leaves, grads)}


def _total(t: torch.Tensor, run_axis: bool) -> torch.Tensor:
    """Σ of all elements (scalar), or per run over a leading run axis ((K,))."""
    return t.flatten(1).sum(1) if run_axis else t.sum()


def stationarity_residual(theta: Mapping[str, torch.Tensor], g: Mapping[str, torch.Tensor], *,
                          run_axis: bool = False, difference: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """R = Σ_p ‖θ*_p − g_p‖² (scalar; ``run_axis``: g carries a leading run axis K and R is (K,)).
    ``difference``: θ* − g, when the caller has computed it (the same values: one pass fewer)."""
    if difference is not None:
        return sum(_total(difference[k] ** 2, run_axis) for k in theta)  # type: ignore[return-value]
    return sum(_total((theta[k] - g[k]) ** 2, run_axis) for k in theta)  # type: ignore[return-value]


def init_factor(theta: Mapping[str, torch.Tensor], g: Mapping[str, torch.Tensor],
                init: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """a = ⟨θ* − g, θ_init⟩ / ‖θ_init‖²: the factor of θ_init that best explains θ* − g (scalar).

    Without weight decay the true factor is 1; with weight decay GD shrinks θ_init by
    Π_t (1 − η_t·wd), which the attacker does not know, so it is fitted (Loo et al. 2023).
    """
    num = sum(((theta[k] - g[k]) * init[k]).sum() for k in theta)
    den = sum((init[k] * init[k]).sum() for k in theta)
    return num / den


def matching_goal(theta: Mapping[str, torch.Tensor], g: Mapping[str, torch.Tensor], *,
                  init: Mapping[str, torch.Tensor] | None = None,
                  coefficient: float | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The vector g must match: θ* (weights only) or θ* − a·θ_init (known initialisation).

    Args:
        theta: θ*.
        g: the combination gradient (only read when ``coefficient`` is None, to fit a).
        init: θ_init, or None.
        coefficient: a; None with ``init``: fitted by :func:`init_factor`.

    Returns:
        (goal name → tensor, a as a scalar tensor or None without ``init``).
    """
    if init is None:
        return dict(theta), None
    a = init_factor(theta, g, init) if coefficient is None else torch.as_tensor(
        float(coefficient), dtype=next(iter(theta.values())).dtype)
    return {k: theta[k] - a * init[k] for k in theta}, a


def squared_norm(theta: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Σ_p ‖θ_p‖² (scalar)."""
    return sum((v * v).sum() for v in theta.values())  # type: ignore[return-value]


def lambda_hinge(lam: torch.Tensor, lambda_min: float, *, run_axis: bool = False) -> torch.Tensor:
    """Σ relu(λ_min − λ_i)² (scalar; (K,) per run with ``run_axis``, λ (K, m))."""
    return _total(torch.relu(lambda_min - lam) ** 2, run_axis)


def kkt_objective(g: Mapping[str, torch.Tensor], goal: Mapping[str, torch.Tensor], lam: torch.Tensor, *,
                  objective: KKTObjective, run_axis: bool = False, difference: Mapping[str, torch.Tensor] | None = None,
                  hinge: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """THE KKT / DecoReco objective, defined here once, at the combination gradient g.

    R = Σ_p ‖goal_p − g_p‖² (goal = θ*, or θ* − a·θ_init with a known initialisation),
    hinge = Σ_i relu(λ_min − λ_i)² (0 for the signed-λ ``regression`` formulation),
    L = R + w_λ·hinge. Every path computes its value with this function: the single run
    (:func:`kkt_residual_and_grads`), the batched runs (``run_axis``, :mod:`datarecon.attacks.batched`),
    the autograd reference (:func:`kkt_terms`) and the compiled step (:func:`kkt_value_and_grad`);
    the first two differentiate it by a backward of g seeded with ∂R/∂g = −2(goal − g)
    (:func:`seeded_gradients`), the last two by autograd / torch.func.

    Args:
        g: name → tensor (``run_axis``: with a leading run axis K); goal: name → tensor (no run axis).
        lam: (m,) multipliers, or (K, m).
        objective: the margin (a key of :data:`MARGINS`) and the hinge (λ_min, w_λ); w_box is not read.
        difference: goal − g when the caller has it (:func:`seeded_gradients`, whose seed it is).
        hinge: Σ_i relu(λ_min − λ_i)² when the caller has it (:func:`seeded_gradients` differentiates it).

    Returns:
        ``{"loss": L, "residual": R, "lambda_hinge": hinge}``, scalars or (K,).

    References:
        Haim et al. (2022) eq. 5; Buzaglo et al. (2023) eq. 4 (multiclass) and §4 (regression).
    """
    residual = stationarity_residual(goal, g, run_axis=run_axis, difference=difference)
    if MARGINS.get(objective.margin).signed_lambda:
        hinge = torch.zeros_like(residual)
    elif hinge is None:
        hinge = lambda_hinge(lam, objective.lambda_min, run_axis=run_axis)
    return {"loss": residual + objective.lambda_min_weight * hinge, "residual": residual, "lambda_hinge": hinge}


def seeded_gradients(g: Mapping[str, torch.Tensor], goal: Mapping[str, torch.Tensor], x: torch.Tensor,
                      lam: torch.Tensor, *, objective: KKTObjective,
                      run_axis: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """:func:`kkt_objective`'s value (detached) and its gradient w.r.t. (x, λ) through g's graph,
    seeded by ∂R/∂g = −2(goal − g) and ∂/∂hinge = w_λ: the θ-sized square and sum of R stay out of
    the graph. With ``run_axis`` one backward of Σ_k L_k gives every run its own gradient (the runs
    share θ* and nothing else, so ∂L_j/∂x_k = 0 for j ≠ k). ``objective``: margin, λ_min, w_λ (w_box
    is not read)."""
    margin, lambda_min, lambda_min_weight = objective.margin, objective.lambda_min, objective.lambda_min_weight
    names = [k for k in goal if g[k].requires_grad]
    # the hinge once, in λ's graph: its value for L, its sum for the gradient
    hinge = None if MARGINS.get(margin).signed_lambda else lambda_hinge(lam, lambda_min, run_axis=run_axis)
    with torch.no_grad():
        detached = {k: v.detach() for k, v in g.items()}
        difference = {k: goal[k] - detached[k] for k in goal}  # once: R's term and (×−2, in place) the seed
        terms = kkt_objective(detached, goal, lam.detach(), objective=objective, run_axis=run_axis,
                              difference=difference, hinge=None if hinge is None else hinge.detach())
        seeds: list[torch.Tensor] = [difference[k].mul_(-2.0) for k in names]
    outputs: list[torch.Tensor] = [g[k] for k in names]
    if hinge is not None and lambda_min_weight:
        outputs.append(hinge.sum())
        seeds.append(torch.full((), float(lambda_min_weight), dtype=x.dtype, device=x.device))
    gx, gl = torch.autograd.grad(outputs, [x, lam], grad_outputs=seeds, allow_unused=True)
    gx = torch.zeros_like(x) if gx is None else gx
    gl = torch.zeros_like(lam) if gl is None else gl
    return terms, gx, gl


def kkt_terms(forward: ForwardFn, params: Mapping[str, torch.Tensor], x: torch.Tensor, labels: torch.Tensor,
              lam: torch.Tensor, *, objective: KKTObjective, box: Bounds | None,
              matching: Matching = Matching()) -> dict[str, torch.Tensor]:
    """:func:`kkt_objective` at (x, λ) plus the box prior, differentiable in x and λ (the autograd reference).

    Args:
        forward: Φ(x; params).
        params: θ_ref (name → tensor), where g is taken.
        x: (m, C, H, W); labels (m,); lam (m,).
        objective: margin, λ_min, w_λ, w_box.
        box: (lower, upper) of the box prior; None leaves the box prior out (``box`` = 0, not in
            ``loss``), for callers that add it with :func:`box_value_and_grad`.
        matching: known initialisation (Loo et al. 2023; ``matching.init`` given): g is taken at
            ``params`` (θ_ref: θ* for the KKT attack with a known initialisation, θ_init for ``loo``)
            and must match θ* − a·θ_init (``matching.theta`` = θ*, default ``params``; a fitted when
            ``matching.coefficient`` is None): R = ‖θ* − a·θ_init − g(θ_ref)‖².

    Returns:
        ``{"loss": R + w_box·box + w_λ·hinge, "residual": R, "box": box, "lambda_hinge": hinge}``;
        the hinge is 0 for signed-λ formulations (``regression``).
    """
    g = combination_gradient(forward, params, x, labels, lam, margin=objective.margin, create_graph=True)
    goal, _ = matching_goal(params if matching.theta is None else matching.theta, g, init=matching.init,
                            coefficient=matching.coefficient)
    terms = kkt_objective(g, goal, lam, objective=objective)
    prior = box_penalty(x, *box) if box is not None else torch.zeros((), dtype=x.dtype, device=x.device)
    return {"loss": terms["loss"] + objective.box_weight * prior, "residual": terms["residual"], "box": prior,
            "lambda_hinge": terms["lambda_hinge"]}


def kkt_residual_and_grads(forward: ForwardFn, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                           labels: torch.Tensor, lam: torch.Tensor, *, objective: KKTObjective,
                           matching: Matching = Matching()
                           ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """:func:`kkt_objective` and its gradient w.r.t. (x, λ), without the box prior (see :func:`box_value_and_grad`).

    The same numbers as autograd of :func:`kkt_terms` (``box=None``), computed with one backward
    of g seeded by ∂R/∂g (:func:`seeded_gradients`). ``objective``: margin, λ_min, w_λ (w_box is not
    read); ``matching``: the known initialisation as in :func:`kkt_terms` (with a fitted a the seed
    is the same: ∂R/∂a = 0 at the fitted a, so a is held fixed in the backward).

    Returns:
        (``{"loss", "residual", "box" (0), "lambda_hinge"}`` detached scalars, plus ``init_coefficient``
        with a known initialisation; ∂/∂x (like x), ∂/∂λ (m,)).
    """
    x = x.detach().requires_grad_(True)
    lam = lam.detach().requires_grad_(True)
    g = combination_gradient(forward, params, x, labels, lam, margin=objective.margin, create_graph=True)
    with torch.no_grad():
        goal, a = matching_goal(params if matching.theta is None else matching.theta,
                                {k: v.detach() for k, v in g.items()}, init=matching.init,
                                coefficient=matching.coefficient)
    terms, gx, gl = seeded_gradients(g, goal, x, lam, objective=objective, run_axis=False)
    terms["box"] = torch.zeros((), dtype=x.dtype, device=x.device)
    if a is not None:
        terms["init_coefficient"] = a.detach()
    return terms, gx, gl


def kkt_value_and_grad(model: torch.nn.Module, *, objective: KKTObjective) -> Callable[..., tuple]:
    """:func:`kkt_terms` and its gradient w.r.t. (x, λ) as ONE pure torch.func function.

    For ``torch.compile`` (double backward through a compiled module is unsupported, so the inner
    VJP and the outer gradient must be one graph). ``model`` must be free of autograd.Functions
    (see :func:`datarecon.attacks.surrogate.functional_surrogate`).

    Returns:
        f(x, λ, params, labels, lower, upper) → ((∂L/∂x, ∂L/∂λ), (L, (R, box, hinge))), the same
        maths as :func:`kkt_terms` + autograd (L = R + w_box·box + w_λ·hinge) for ``objective``.
    """
    from torch.func import functional_call, grad, grad_and_value

    margin = objective.margin
    box_weight = objective.box_weight
    entry = MARGINS.get(margin)

    def value(x, lam, params, labels, lower, upper):
        def total(p):
            return entry.fn(functional_call(model, p, (x,)), labels, lam).sum() / x.shape[0]

        terms = kkt_objective(grad(total)(params), params, lam, objective=objective)
        box = box_penalty(x, lower, upper)
        return terms["loss"] + box_weight * box, (terms["residual"], box, terms["lambda_hinge"])

    return grad_and_value(value, argnums=(0, 1), has_aux=True)


def energy_gradient(forward: ForwardFn, params: Mapping[str, torch.Tensor], x: torch.Tensor, labels: torch.Tensor,
                    *, loss: str, weight_decay: float, create_graph: bool = True) -> dict[str, torch.Tensor]:
    """∇_θ E(x, y; θ) at θ = params, E = mean loss + (wd/2)‖θ‖² (one batched VJP)."""
    leaves = _leaves(params)
    e = energy(forward(x, leaves), labels, leaves, loss=loss, weight_decay=weight_decay)
    grads = torch.autograd.grad(e, list(leaves.values()), create_graph=create_graph, allow_unused=True)
    return {k: (gr if gr is not None else torch.zeros_like(leaves[k])) for k, gr in zip(leaves, grads)}


def gradnorm_terms(forward: ForwardFn, params: Mapping[str, torch.Tensor], x: torch.Tensor, labels: torch.Tensor,
                   *, objective: GradNormObjective, box: Bounds) -> dict[str, torch.Tensor]:
    """Runkel eq. 3: ``{"loss": ‖∇_θE‖² + w_box·box, "residual": ‖∇_θE‖², "box": box}``.

    ``objective``: E's loss and weight decay, w_box; ``box``: (lower, upper) of the box prior.
    """
    g = energy_gradient(forward, params, x, labels, loss=objective.loss, weight_decay=objective.weight_decay,
                        create_graph=True)
    residual = squared_norm(g)
    prior = box_penalty(x, *box)
    return {"loss": residual + objective.box_weight * prior, "residual": residual, "box": prior}


def per_candidate_directional(forward: ForwardFn, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                              direction: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """d_i = ⟨∇_θ Φ_1(x_i; θ), v⟩ for all i (m,), with v = ``direction``, for a single-output Φ.

    For k outputs, returns (m, k): d_ij = ⟨∇_θ Φ_j(x_i), v⟩. Computed without per-sample gradients:
    u ↦ ⟨∇_θ(u·Φ), v⟩ is linear in u, so its gradient w.r.t. u is J v (double-backward trick).
    """
    leaves = _leaves(params)
    with torch.enable_grad():
        outputs = forward(x.detach(), leaves)
        u = torch.zeros_like(outputs, requires_grad=True)
        grads = torch.autograd.grad((u * outputs).sum(), list(leaves.values()), create_graph=True,
                                    allow_unused=True)
        inner = sum((gr * direction[k]).sum() for k, gr in zip(leaves, grads) if gr is not None)
        (jv,) = torch.autograd.grad(inner, u)
    return jv[:, 0] if jv.shape[1] == 1 else jv
