"""The bilevel problem's pieces as small pure functions (Runkel et al. 2024, eq. 2).

    min_x  l(θ*, θ(x))   s.t.  θ(x) = argmin_θ E(x, y; θ)

* :class:`FlatLayout` turns the parameter dict θ = {name: tensor} into one flat vector and
  back (views, so gradients flow), so the inner solver, the linear solvers and the
  curvature pairs all work on plain vectors of length P.
* :func:`make_energy` gives E(x, θ_flat) = mean loss + (wd/2)‖θ‖², the target's own training
  energy (``datarecon.kernel.losses.energy``), with the attack's weight decay, as an
  :class:`Energy` that also exposes Φ and L.
* :data:`INNER_ACTIVATIONS`: the inner energy with the target's activations or with a smooth
  surrogate (softplus for ReLU); :func:`has_kinks` tells whether a target needs one.
* :func:`resolve_weight_decay` refuses an energy without a finite minimiser.
* :data:`UPPER_LOSSES`: upper-level losses l(θ*, θ) with their gradient in θ.
* :data:`THETA0`: first inner iterate θ⁰ ("uniform" U(0,1) as in the paper, "target" θ*,
  "default" the architecture's default initialisation).
* :class:`HessianOperator`: Hessian-vector products ∇²_θE·v and the mixed product
  ∇_x⟨∇_θE(x, θ), p⟩ from ONE graph of ∇_θE built with ``create_graph`` (double backward),
  counting the products; :class:`GaussNewtonOperator`: the same interface with the generalised
  Gauss–Newton matrix instead of ∇²_θE (:data:`CURVATURES`).

References: Runkel, Gandikota, Geiping, Schönlieb, Moeller, "Training Data Reconstruction:
Privacy due to Uncertainty?" (arXiv 2412.08544), eq. 2 and update 7.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from datarecon.errors import DataReconError
from datarecon.registry import Registry
from datarecon.kernel.losses import resolve_loss
from datarecon.kernel.losses import energy as training_energy

EnergyFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""E(x, θ_flat) -> scalar; x: (m, *input_shape), θ_flat: (P,)."""

# Losses whose minimiser over θ runs off to infinity on separable data unless weight decay is added.
UNBOUNDED_WITHOUT_DECAY = frozenset({"logistic", "cross-entropy"})


class FlatLayout:
    """Names, shapes and offsets of a parameter dict, to move between dict and flat vector.

    Args:
        params: θ as name -> tensor (defines order, shapes, dtype and device).
    """

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.names = list(params)
        self.shapes = [tuple(p.shape) for p in params.values()]
        self.numels = [p.numel() for p in params.values()]
        first = next(iter(params.values()))
        self.dtype, self.device = first.dtype, first.device

    @property
    def size(self) -> int:
        """P, the total number of parameters."""
        return sum(self.numels)

    def flatten(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """dict -> (P,) vector (a copy)."""
        return torch.cat([params[k].reshape(-1) for k in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """(P,) vector -> dict of views into it (differentiable)."""
        parts = torch.split(flat, self.numels)
        return {k: v.view(s) for k, v, s in zip(self.names, parts, self.shapes)}


def resolve_weight_decay(loss: str, weight_decay: float, override: float | None) -> float:
    """The weight decay of the lower-level energy, refusing one without a finite minimiser.

    Args:
        loss: the target's training loss name.
        weight_decay: the target's training weight decay.
        override: the attack's weight decay, replacing the target's when given.

    Returns:
        The weight decay to use in E.

    Raises:
        DataReconError: logistic / cross-entropy loss with zero weight decay (the energy has no
            finite minimiser on separable data, so θ(x) does not exist).
    """
    wd = float(override) if override is not None else float(weight_decay)
    if wd < 0 or not math.isfinite(wd):
        raise DataReconError(f"weight decay must be a finite number >= 0, got {wd}; fix weight_decay_override")
    if wd == 0.0 and loss in UNBOUNDED_WITHOUT_DECAY:
        raise DataReconError(
            f"the bilevel attack needs a finite minimiser of the training energy, but {loss} loss with zero weight "
            "decay has none; pass a weight decay for the attack (weight_decay_override, e.g. 1e-2)"
        )
    return wd


@dataclass(frozen=True)
class Energy:
    """The lower-level energy E(x, θ) = (1/m) Σ_i L(Φ(x_i; θ), y_i) + (wd/2)‖θ‖² on flat θ, with its parts.

    Callable as ``energy(x, theta_flat) -> scalar`` (an :data:`EnergyFn`); the parts serve the
    Gauss–Newton products (:class:`GaussNewtonOperator`), which need Φ and L separately.

    Attributes:
        model: the architecture, called functionally (its own parameters are ignored); for a
            surrogate inner energy, a copy with the activation replaced (:data:`INNER_ACTIVATIONS`).
        layout: how θ_flat maps to the model's parameter names.
        labels: (m,) candidate labels (float ±1 binary, int64 multiclass).
        loss: loss name (``datarecon.kernel.losses.LOSSES``).
        weight_decay: wd ≥ 0.
    """

    model: nn.Module
    layout: FlatLayout
    labels: torch.Tensor
    loss: str
    weight_decay: float

    def outputs(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Φ(x; θ_flat), shape (m, num_outputs)."""
        return functional_call(self.model, self.layout.unflatten(theta), (x,))

    def data_loss(self, outputs: torch.Tensor) -> torch.Tensor:
        """(1/m) Σ_i L(outputs_i, y_i) (scalar), the weight-decay term excluded."""
        return resolve_loss(self.loss)(outputs, self.labels)

    def __call__(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        params = self.layout.unflatten(theta)
        out = functional_call(self.model, params, (x,))
        return training_energy(out, self.labels, params, loss=self.loss, weight_decay=self.weight_decay)


def make_energy(model: nn.Module, layout: FlatLayout, labels: torch.Tensor, *, loss: str,
                weight_decay: float) -> Energy:
    """The lower-level energy E(x, θ) = (1/m) Σ_i L(Φ(x_i; θ), y_i) + (wd/2)‖θ‖² on flat θ.

    Args:
        model: the architecture, called functionally (its own parameters are ignored).
        layout: how θ_flat maps to the model's parameter names.
        labels: (m,) candidate labels (float ±1 binary, int64 multiclass).
        loss: loss name (``datarecon.kernel.losses.LOSSES``).
        weight_decay: wd ≥ 0.

    Returns:
        An :class:`Energy`, callable as ``energy(x, theta_flat) -> scalar`` with x: (m, *input_shape),
        θ_flat: (P,).
    """
    return Energy(model=model, layout=layout, labels=labels, loss=loss, weight_decay=float(weight_decay))


# --------------------------------------------------------------------------- non-smooth activations

#: Activations whose second derivative does not exist at a kink (ReLU and relatives).
KINKED_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Hardtanh, nn.Hardshrink,
                                                   nn.Softshrink, nn.Threshold)


def has_kinks(model: nn.Module) -> bool:
    """Whether ``model`` contains an activation module with a kink (then E is not twice
    differentiable everywhere and the implicit-function hypergradient is not defined at a kink)."""
    return any(isinstance(m, KINKED_ACTIVATIONS) for m in model.modules())


def with_activation(model: nn.Module, factory: Callable[[nn.Module], nn.Module | None]) -> nn.Module:
    """A copy of ``model`` whose activation modules ``m`` are replaced by ``factory(m)`` (None: kept).

    Parameter names are unchanged (activations hold no parameters), so the copy is called with
    the same flat layout.
    """
    import copy

    new = copy.deepcopy(model)
    for mod in list(new.modules()):
        for child_name, child in list(mod.named_children()):
            repl = factory(child)
            if repl is not None:
                setattr(mod, child_name, repl)
    return new


def _softplus_for_relu(beta: float) -> Callable[[nn.Module], nn.Module | None]:
    def factory(m: nn.Module) -> nn.Module | None:
        return nn.Softplus(beta=beta) if type(m) is nn.ReLU else None
    return factory


#: Inner-energy activations: ``factory(model, beta) -> model`` ("target": the target's own
#: activations; "softplus": every nn.ReLU replaced by softplus_β(z) = log(1 + e^{βz})/β, a smooth
#: surrogate whose minimiser θ_β(x) is differentiable in x; β → ∞ recovers ReLU).
INNER_ACTIVATIONS: Registry[Callable[[nn.Module, float], nn.Module]] = Registry("inner-energy activation")
INNER_ACTIVATIONS.register("target", lambda model, beta: model)
INNER_ACTIVATIONS.register("softplus", lambda model, beta: with_activation(model, _softplus_for_relu(beta)))


# --------------------------------------------------------------------------- upper-level losses


@dataclass(frozen=True)
class UpperLoss:
    """An upper-level loss l(θ*, θ) with its θ-gradient, both closed form.

    Attributes:
        value: (θ, θ*) -> scalar tensor.
        grad: (θ, θ*) -> (P,) ∇_θ l.
        doc: one line.
    """

    value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    grad: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    doc: str


UPPER_LOSSES: Registry[UpperLoss] = Registry("upper-level loss")
UPPER_LOSSES.register("sq", UpperLoss(
    value=lambda th, ts: ((th - ts) ** 2).sum(),
    grad=lambda th, ts: 2.0 * (th - ts),
    doc="‖θ* − θ‖² (Runkel eq. 2; Table 1 reports this quantity)",
))
UPPER_LOSSES.register("normalised", UpperLoss(
    value=lambda th, ts: ((th - ts) ** 2).sum() / (ts * ts).sum(),
    grad=lambda th, ts: 2.0 * (th - ts) / (ts * ts).sum(),
    doc="‖θ* − θ‖² / ‖θ*‖² (scale-free)",
))


# --------------------------------------------------------------------------- first inner iterate


Theta0Fn = Callable[..., torch.Tensor]
THETA0: Registry[Theta0Fn] = Registry("first inner iterate (theta0)")


@THETA0.register("uniform")
def theta0_uniform(model: nn.Module, layout: FlatLayout, theta_star: torch.Tensor, *,
                   generator: torch.Generator) -> torch.Tensor:
    """U(0, 1) per weight (Runkel et al. 2024, §4: "θ⁰ drawn randomly")."""
    u = torch.rand(layout.size, generator=generator, dtype=torch.float64)
    return u.to(dtype=layout.dtype, device=layout.device)


@THETA0.register("target")
def theta0_target(model: nn.Module, layout: FlatLayout, theta_star: torch.Tensor, *,
                  generator: torch.Generator) -> torch.Tensor:
    """θ⁰ = θ* (the attacker knows θ*; the inner solve then starts at the upper-level optimum)."""
    return theta_star.clone()


@THETA0.register("default")
def theta0_default(model: nn.Module, layout: FlatLayout, theta_star: torch.Tensor, *,
                   generator: torch.Generator) -> torch.Tensor:
    """PyTorch's default Linear init U(−1/√fan_in, 1/√fan_in) for weight and bias of each Linear.

    Parameters not owned by an ``nn.Linear`` use fan_in = size of their last dimension (1-D: zeros).
    """
    bounds: dict[str, float] = {}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            for pname, _ in mod.named_parameters(recurse=False):
                bounds[f"{mod_name}.{pname}" if mod_name else pname] = 1.0 / math.sqrt(mod.in_features)
    parts = []
    for name, shape, numel in zip(layout.names, layout.shapes, layout.numels):
        b = bounds.get(name, 1.0 / math.sqrt(shape[-1]) if len(shape) >= 2 else 0.0)
        u = torch.rand(numel, generator=generator, dtype=torch.float64)
        parts.append((2.0 * u - 1.0) * b)
    return torch.cat(parts).to(dtype=layout.dtype, device=layout.device)


# --------------------------------------------------------------------------- second derivatives


class HessianOperator:
    """Second derivatives of E at (x, θ) from one double-backward graph.

    Builds g = ∇_θE(x, θ) once with ``create_graph=True``; then

    * ``op(v)``   = ∇²_θθE · v            (one backward through g; counted in ``count``),
    * ``op.mixed(p)`` = ∇_x⟨∇_θE(x, θ), p⟩ (one backward through g into x; not counted).

    Memory: one graph of the forward pass plus P-vectors; never a dense Hessian.

    Args:
        energy_fn: E(x, θ_flat).
        x: (m, *input_shape) inputs (detached here).
        theta: (P,) point (detached here).
        need_x: build the graph so that ``mixed`` works.
    """

    def __init__(self, energy_fn: EnergyFn, x: torch.Tensor, theta: torch.Tensor, *, need_x: bool = True) -> None:
        self.x = x.detach().requires_grad_(need_x)
        self.theta = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            value = energy_fn(self.x, self.theta)
            (self.grad,) = torch.autograd.grad(value, self.theta, create_graph=True)
        self.value = value.detach()
        self.count = 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        """∇²_θE · v, shape (P,)."""
        self.count += 1
        (hv,) = torch.autograd.grad(self.grad, self.theta, v, retain_graph=True, allow_unused=True)
        return torch.zeros_like(v) if hv is None else hv.detach()

    def mixed(self, p: torch.Tensor) -> torch.Tensor:
        """∇_x⟨∇_θE(x, θ), p⟩ with θ and p held fixed, shape of x."""
        (gx,) = torch.autograd.grad(self.grad, self.x, p, retain_graph=True, allow_unused=True)
        return torch.zeros_like(self.x) if gx is None else gx.detach()


class GaussNewtonOperator:
    """The generalised Gauss–Newton matrix G = Jᵀ ∇²_ΦL J + wd·I of E at (x, θ), and E's mixed product.

    J = ∂Φ(x; θ)/∂θ (outputs × P), ∇²_ΦL the Hessian of the mean loss in the outputs (positive
    semi-definite for logistic, cross-entropy and squared losses). G drops the term
    Σ_i ∂L/∂Φ_i · ∇²_θΦ_i of the Hessian, the one that is indefinite on a ReLU network and
    undefined at its kinks; G is positive definite whenever wd > 0 and exists at every θ.

    * ``op(v)`` = G v: J v by differentiating Jᵀu in u (the double-vjp trick, one backward),
      the loss Hessian in output space, then Jᵀ(·) (one backward); counted in ``count``;
    * ``op.mixed(p)`` = ∇_x⟨∇_θE(x, θ), p⟩, the exact mixed derivative of E (not counted).

    Same interface as :class:`HessianOperator`.

    Args:
        energy_fn: an :class:`Energy` (its parts Φ and L are needed).
        x: (m, *input_shape) inputs (detached here).
        theta: (P,) point (detached here).
        need_x: build the graph so that ``mixed`` works.

    References: Schraudolph, "Fast curvature matrix-vector products for second-order gradient
    descent" (Neural Computation 2002); Martens, "New insights and perspectives on the natural
    gradient method" (JMLR 2020), §8.
    """

    def __init__(self, energy_fn: Energy, x: torch.Tensor, theta: torch.Tensor, *, need_x: bool = True) -> None:
        if not isinstance(energy_fn, Energy):
            raise TypeError("GaussNewtonOperator needs an Energy (make_energy), not a bare function")
        self.energy = energy_fn
        self.x = x.detach().requires_grad_(need_x)
        self.theta = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            value = energy_fn(self.x, self.theta)
            (self.grad,) = torch.autograd.grad(value, self.theta, create_graph=True)
        self.value = value.detach()
        th = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            self._outputs = energy_fn.outputs(x.detach(), th)
            self._u = torch.zeros_like(self._outputs, requires_grad=True)
            # Jᵀu, linear in u: its derivative in u along v is J v (the "double-vjp" trick)
            (self._jtu,) = torch.autograd.grad(self._outputs, th, self._u, create_graph=True)
            self._out = self._outputs.detach().requires_grad_(True)
            (self._gout,) = torch.autograd.grad(energy_fn.data_loss(self._out), self._out, create_graph=True)
        self._th = th
        self.count = 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        """G v, shape (P,)."""
        self.count += 1
        (jv,) = torch.autograd.grad(self._jtu, self._u, v, retain_graph=True)
        (hjv,) = torch.autograd.grad(self._gout, self._out, jv, retain_graph=True)
        (jt,) = torch.autograd.grad(self._outputs, self._th, hjv, retain_graph=True)
        return jt.detach() + self.energy.weight_decay * v

    def mixed(self, p: torch.Tensor) -> torch.Tensor:
        """∇_x⟨∇_θE(x, θ), p⟩ with θ and p held fixed, shape of x."""
        (gx,) = torch.autograd.grad(self.grad, self.x, p, retain_graph=True, allow_unused=True)
        return torch.zeros_like(self.x) if gx is None else gx.detach()


#: Which matrix the linear solve inverts: "hessian" ∇²_θE (exact; the implicit function theorem's
#: matrix) or "gauss-newton" G (positive definite, defined at ReLU kinks; an approximation of ∇²_θE).
CURVATURES: Registry[type] = Registry("curvature")
CURVATURES.register("hessian", HessianOperator)
CURVATURES.register("gauss-newton", GaussNewtonOperator)


def value_and_grad(energy_fn: EnergyFn, x: torch.Tensor) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """θ ↦ (E(x, θ), ∇_θE(x, θ)) for fixed x, both detached (one forward + backward)."""
    xd = x.detach()

    def fun(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        th = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            value = energy_fn(xd, th)
            (g,) = torch.autograd.grad(value, th)
        return value.detach(), g

    return fun
