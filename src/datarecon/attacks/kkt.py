"""KKT (Haim et al. 2022), DecoReco (Buzaglo et al. 2023) and gradient-norm (Runkel eq. 3) attacks.

Thin stateful wrappers around the pure math of :mod:`datarecon.attacks.kkt_math`; each
implements the :class:`~datarecon.attacks.base.IterativeAttack` protocol and is registered in
:data:`~datarecon.attacks.base.ATTACKS` (in ``datarecon/attacks/__init__.py``) as a class with
``config_cls`` and ``from_config``:

* ``kkt``: minimise R(x, λ) + w_box·box(x) + w_λ·hinge(λ) (see kkt_math), reference settings:
  SGD momentum 0.9, λ₀ ~ U(0,1), lr_λ 1e-4, float64, sigmoid surrogate.
* ``decoreco``: the same objective with formulation chosen from the target (``auto``:
  multiclass for k > 1 outputs, regression for mse/huber losses, else binary) and a larger λ
  learning rate (0.5). With weight decay, θ* is a stationary point of the regularised loss and λ
  absorbs the scale, so the residual is the same.
* ``gradnorm``: minimise ‖∇_θ E(x, y; θ*)‖² + w_box·box(x) over x only (no λ).

State (flat dict, checkpointed by the runner): ``x`` (m, C, H, W), ``lambda`` (m,) and optimiser
buffers ``opt.*``. ``step`` computes the update and commits it only when it is finite.

Example::

    attack = KKTAttack(KKTConfig(steps=1000, lr_x=0.1, alpha=20))
    rec = run_attack(attack, target, prior, x0=x0, generator=g, out="runs/kkt")
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from datarecon.utils.dtypes import torch_dtype
from datarecon.registry import registered
from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior, Reconstruction, Target
from datarecon.attacks.optim import OPTIMIZERS, OptimizerSettings, init_optimizer_state, optimizer_step
from datarecon.attacks.selection import SelectionContext, select
from datarecon.attacks.surrogate import SURROGATES, make_surrogate
from datarecon.errors import DataReconError
from datarecon.training.losses import LOSSES, loss_name
from datarecon.config import MAX_STEPS

LAMBDA_INITS = ("uniform", "uniform-signed", "ones")


class _AttackConfigBase(BaseModel):
    """Fields shared by the x-optimising attacks (every weight a named field)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    steps: int = Field(default=1000, ge=0, le=MAX_STEPS, description="optimisation steps")
    lr_x: float = Field(default=0.1, gt=0, description="learning rate of the candidates x")
    optimizer: Annotated[str, registered(OPTIMIZERS)] = Field(default="sgd", description="key of attacks.optim.OPTIMIZERS")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum")
    nesterov: bool = False
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_eps: float = Field(default=1e-8, gt=0)
    box_weight: float = Field(default=1.0, ge=0, description="weight of the pixel-box prior")
    surrogate: Annotated[str, registered(SURROGATES)] = Field(default="sigmoid-surrogate", description="key of attacks.surrogate.SURROGATES")
    alpha: float = Field(default=20.0, gt=0, description="surrogate sharpness: ReLU' := sigmoid(alpha z)")
    # float32: same reconstructions as float64 on digits and MNIST (identical SSIM > 0.4 counts,
    # residual curves equal to 1e-7; benchmarks/bench_dtype.py, docs/PERFORMANCE.md) and ~1.1-2x faster.
    dtype: Literal["float32", "float64"] = Field(default="float32", description="float32 | float64")
    dup_threshold: float = Field(default=0.99, gt=-1, le=1, description="cosine of near-duplicate candidates")



    def optimizer_settings(self) -> OptimizerSettings:
        return OptimizerSettings(momentum=self.momentum, nesterov=self.nesterov, beta1=self.adam_beta1,
                                 beta2=self.adam_beta2, eps=self.adam_eps)


class KKTConfig(_AttackConfigBase):
    """KKT attack (Haim et al. 2022); defaults near the reference's best shipped runs.

    ``formulation``: ``auto`` (default: from the target: k > 1 → multiclass; mse/huber →
    regression; else binary, Haim's setting) or one of ``binary`` | ``multiclass`` |
    ``regression`` (kkt_math.MARGINS) to force it.
    """

    lr_lambda: float = Field(default=1e-4, ge=0, description="learning rate of the multipliers")
    lambda_init: Literal["uniform", "uniform-signed", "ones"] = Field(
        default="uniform", description="U(0,1), U(-1,1) or all ones")
    lambda_min: float = Field(default=0.45, ge=0, description="floor of lambda (hinge)")
    lambda_min_weight: float = Field(default=5.0, ge=0, description="weight of relu(lambda_min - lambda)^2")
    formulation: str = "auto"
    compile: bool = Field(default=False, description="torch.compile the step's objective and gradient "
                          "(same maths; pays a one-off compile, see benchmarks/bench_compile.py)")

    @field_validator("formulation")
    @classmethod
    def _form(cls, v: str) -> str:
        if v != "auto":
            kkt_math.MARGINS.get(v)
        return v

    @model_serializer(mode="wrap")
    def _drop_default_compile(self, handler):  # type: ignore[no-untyped-def]
        # compile=False is left out of dumps so config hashes (resume, pieces, sweeps) stay as before
        data = handler(self)
        if isinstance(data, dict) and not self.compile:
            data.pop("compile", None)
        return data


class DecoRecoConfig(KKTConfig):
    """DecoReco (Buzaglo et al. 2023): formulation from the target, λ learning rate 0.5."""

    formulation: str = "auto"
    lr_lambda: float = Field(default=0.5, ge=0)


class GradNormConfig(_AttackConfigBase):
    """Gradient-norm attack (Runkel et al. 2024, eq. 3): min_x ‖∇_θ E(x, y; θ*)‖² + box."""


def resolve_formulation(name: str, target: Target) -> str:
    """``auto`` → multiclass (k > 1), regression (mse/huber), binary (otherwise); else ``name``."""
    if name != "auto":
        return name
    if target.num_outputs > 1:
        return "multiclass"
    return "regression" if target.loss in ("mse", "huber") else "binary"


def check_formulation(formulation: str, target: Target, prior: AttackerPrior) -> None:
    """Refuse a formulation that does not fit the model's outputs / labels (one-line error)."""
    entry = kkt_math.MARGINS.get(formulation)
    if entry.label_kind == "multiclass" and target.num_outputs < 2:
        raise DataReconError(f"formulation {formulation!r} needs a multi-output model; this one has 1 output "
                             "(use binary or regression)")
    if entry.label_kind == "binary":
        if target.num_outputs != 1:
            raise DataReconError(f"formulation {formulation!r} needs a single-output model; this one has "
                                 f"{target.num_outputs} (use multiclass)")
        y = prior.labels
        if not bool(((y == 1) | (y == -1)).all()):
            raise DataReconError("binary formulation needs labels in {-1, +1}; use formulation regression otherwise")


def assumption_notes(target: Target, formulation: str | None, *, surrogate: str = "relu") -> list[str]:
    """STYLE #7: what in the target breaks the method's assumptions (empty if nothing)."""
    from datarecon.attacks.surrogate import count_functional_relus

    notes = []
    if surrogate != "relu":
        calls = count_functional_relus(target.model)
        if calls:
            notes.append(f"the model applies ReLU as a function in its forward ({calls} call(s) of torch.relu / "
                         f"F.relu); the {surrogate!r} surrogate replaces nn.ReLU modules only, so those keep "
                         "ReLU's zero second derivative: write them as nn.ReLU modules")
    if formulation is not None and not target.homogeneous:
        notes.append("target is not homogeneous (has biases or non-ReLU layers); the KKT conditions of "
                     "Haim et al. assume a bias-free ReLU network, expect a larger residual")
    if formulation == "binary" and target.loss != "logistic":
        notes.append(f"binary KKT formulation assumes logistic loss, target was trained with {loss_name(target.loss)!r}")
    return notes


class _Prepared:
    """Cached per-target derived objects: θ* in the config dtype, surrogate and exact forwards."""

    def __init__(self, target: Target, *, dtype: torch.dtype, surrogate: str, alpha: float) -> None:
        self.params = {k: v.detach().to(dtype) for k, v in target.params.items()}
        self.model = make_surrogate(surrogate, target.model, alpha=alpha)
        self.theta_sq = float(kkt_math.squared_norm(self.params))
        from torch.func import functional_call

        sur_model, plain = self.model, target.model
        self.forward = lambda x, p: functional_call(sur_model, dict(p), (x,))
        self.exact_forward = lambda x, p: functional_call(plain, dict(p), (x,))


class _XAttack:
    """Shared machinery: config, dtype, prepared-target cache, committing finite updates."""

    name = ""
    config_cls: type[_AttackConfigBase] = _AttackConfigBase
    divergence_hint = "lower lr_x, lr_lambda or the surrogate sharpness alpha (and check box_weight)"
    resume_ignore = ("steps",)

    def __init__(self, config: _AttackConfigBase | None = None) -> None:
        self.config = config if config is not None else self.config_cls()
        if not isinstance(self.config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}")
        self._cache: dict[int, _Prepared] = {}

    @classmethod
    def from_config(cls, config: _AttackConfigBase) -> _XAttack:
        """Build the attack from its config (used by the CLI through the ATTACKS registry)."""
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.config.dtype)

    def prepared(self, target: Target) -> _Prepared:
        key = id(target)
        if key not in self._cache:
            self._cache[key] = _Prepared(target, dtype=self.dtype, surrogate=self.config.surrogate,
                                         alpha=self.config.alpha)
        return self._cache[key]

    def labels(self, prior: AttackerPrior, device: torch.device) -> torch.Tensor:
        y = prior.labels.to(device)
        return y.to(self.dtype) if y.is_floating_point() else y.long()

    def bounds(self, prior: AttackerPrior, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        lo = torch.as_tensor(prior.lower, dtype=self.dtype, device=device)
        hi = torch.as_tensor(prior.upper, dtype=self.dtype, device=device)
        return lo, hi

    def _commit(self, state: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], lrs: dict[str, float],
                metrics: dict[str, float]) -> dict[str, float]:
        if not math.isfinite(metrics["loss"]):
            return metrics
        new = optimizer_step(self.config.optimizer, state, grads, lrs=lrs,
                             settings=self.config.optimizer_settings())
        # (v * 0).sum() is NaN iff v has a NaN/inf (no overflow, unlike v.sum()); 2 passes, not 4
        if not all(bool(torch.isfinite((v * 0).sum())) for v in new.values() if v.is_floating_point()):
            metrics["update"] = float("nan")  # NaNStop trips; the state keeps its last finite value
            return metrics
        for k, gr in grads.items():
            metrics[f"grad_norm_{k}"] = float(gr.norm())
        state.update(new)
        return metrics


def compile_function(fn: Any) -> Any:
    """``torch.compile(fn)`` as one static-shape graph; 1 inductor compile thread on <= 4 CPUs."""
    import torch._inductor.config as inductor_config

    if (os.cpu_count() or 1) <= 4:
        inductor_config.compile_threads = 1
    return torch.compile(fn, fullgraph=True, dynamic=False)


class KKTAttack(_XAttack):
    """The KKT attack of Haim et al. (2022); ``decoreco`` and ``kkt`` differ only in defaults.

    With ``compile=True`` the step's objective and its gradient w.r.t. (x, λ) come from
    :func:`kkt_math.kkt_value_and_grad` compiled with ``torch.compile`` (one graph per target and
    shape), otherwise from :meth:`terms` + autograd; the optimiser update is the same.
    """

    name = "kkt"
    config_cls = KKTConfig
    resume_ignore = ("steps", "compile")

    def __init__(self, config: KKTConfig | None = None) -> None:
        super().__init__(config)
        self._compiled: dict[int, Any] = {}

    def compiled_value_and_grad(self, target: Target) -> Any:
        """The compiled (x, λ, θ*, labels, lower, upper) ↦ ((∂L/∂x, ∂L/∂λ), (L, (R, box, hinge)))."""
        key = id(target)
        if key not in self._compiled:
            from datarecon.attacks.surrogate import functional_surrogate

            c = self.config
            model = functional_surrogate(c.surrogate, target.model, alpha=c.alpha)
            fn = kkt_math.kkt_value_and_grad(model, margin=self.formulation(target), lambda_min=c.lambda_min,
                                             box_weight=c.box_weight, lambda_min_weight=c.lambda_min_weight)
            self._compiled[key] = compile_function(fn)
        return self._compiled[key]

    def _compiled_terms(self, target: Target, prior: AttackerPrior, x: torch.Tensor,
                        lam: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        fn = self.compiled_value_and_grad(target)
        lo, hi = self.bounds(prior, x.device)
        args = (x, lam, self.prepared(target).params, self.labels(prior, x.device), lo, hi)
        try:
            (gx, gl), (loss, (residual, box, hinge)) = fn(*args)
        except Exception as exc:  # e.g. no C++ compiler: one line with the way out
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise DataReconError(f"torch.compile of the {self.name} step failed ({type(exc).__name__}: {first}); "
                                 "run without --compile") from exc
        return {"loss": loss, "residual": residual, "box": box, "lambda_hinge": hinge}, gx, gl

    def formulation(self, target: Target) -> str:
        return resolve_formulation(self.config.formulation, target)

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
        """x = x0 (cast), λ₀ from ``lambda_init`` drawn with ``generator`` (CPU, float64), zero buffers."""
        form = self.formulation(target)
        check_formulation(form, target, prior)
        for note in assumption_notes(target, form, surrogate=self.config.surrogate):
            warnings.warn(f"{self.name}: {note}", UserWarning, stacklevel=2)
        device = next(iter(target.params.values())).device
        m = prior.m
        if self.config.lambda_init == "uniform":
            lam = torch.rand(m, generator=generator, dtype=torch.float64)
        elif self.config.lambda_init == "uniform-signed":
            lam = 2 * torch.rand(m, generator=generator, dtype=torch.float64) - 1
        else:
            lam = torch.ones(m, dtype=torch.float64)
        x = x0.detach().to(device=device, dtype=self.dtype).clone()
        lam = lam.to(device=device, dtype=self.dtype)
        state = {"x": x, "lambda": lam}
        state.update({k: v.to(device) for k, v in init_optimizer_state(self.config.optimizer, state).items()})
        return state

    def terms(self, target: Target, prior: AttackerPrior, x: torch.Tensor, lam: torch.Tensor, *,
              include_box: bool = True) -> dict[str, torch.Tensor]:
        """The objective's terms at (x, λ) (differentiable; see ``kkt_math.kkt_terms``)."""
        prep = self.prepared(target)
        lo, hi = self.bounds(prior, x.device)
        c = self.config
        return kkt_math.kkt_terms(prep.forward, prep.params, x, self.labels(prior, x.device), lam,
                                  margin=self.formulation(target), lower=lo, upper=hi, lambda_min=c.lambda_min,
                                  box_weight=c.box_weight, lambda_min_weight=c.lambda_min_weight,
                                  include_box=include_box)

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        """One optimiser step on (x, λ); metrics: loss, residual, rel_residual, box, lambda_hinge, ..."""
        if self.config.compile:
            terms, gx, gl = self._compiled_terms(target, prior, state["x"].detach(), state["lambda"].detach())
        else:
            # the objective of terms(), differentiated cheaply: g's backward seeded by ∂R/∂g and the
            # box prior in closed form (same values and gradients; tests compare with autograd)
            prep, c, x = self.prepared(target), self.config, state["x"]
            terms, gx, gl = kkt_math.kkt_residual_and_grads(
                prep.forward, prep.params, x, self.labels(prior, x.device), state["lambda"],
                margin=self.formulation(target), lambda_min=c.lambda_min, lambda_min_weight=c.lambda_min_weight)
            lo, hi = self.bounds(prior, x.device)
            box, box_grad = kkt_math.box_value_and_grad(x.detach(), lo, hi)
            terms["box"], terms["loss"] = box, terms["loss"] + c.box_weight * box
            if c.box_weight:
                gx = gx.add_(box_grad, alpha=c.box_weight)
        metrics = {k: float(v.detach()) for k, v in terms.items()}
        return self.apply_gradients(target, state, metrics, gx, gl)

    def apply_gradients(self, target: Target, state: dict[str, torch.Tensor], metrics: dict[str, float],
                        gx: torch.Tensor, gl: torch.Tensor) -> dict[str, float]:
        """Commit one optimiser step from the objective's gradients (shared by :meth:`step` and the
        batched runs of :mod:`datarecon.attacks.batched`).

        Args:
            target: the attacked model (for ‖θ*‖²).
            state: this run's state (updated in place when the update is finite).
            metrics: ``loss``, ``residual``, ``box``, ``lambda_hinge`` of this step (floats).
            gx: ∂L/∂x shaped like ``state["x"]``; gl: ∂L/∂λ (m,).

        Returns:
            The step's metrics (plus ``rel_residual``, ``lambda_mean``, gradient norms); NaN
            ``update`` when the update was not finite and was not applied.
        """
        metrics["rel_residual"] = metrics["residual"] / max(self.prepared(target).theta_sq, 1e-300)
        metrics["lambda_mean"] = float(state["lambda"].mean())
        grads = {"x": gx, "lambda": gl}
        lrs = {"x": self.config.lr_x, "lambda": self.config.lr_lambda}
        return self._commit(state, grads, lrs, metrics)

    def batch_key(self, target: Target) -> tuple[Any, ...] | None:
        """What fixes the objective of a step (not the optimiser): runs with equal keys can share one
        batched gradient computation (:mod:`datarecon.attacks.batched`); None: not batchable (the
        compiled step)."""
        if self.config.compile:
            return None
        c = self.config
        return (self.formulation(target), c.surrogate, c.alpha, c.lambda_min, c.lambda_min_weight, c.box_weight,
                c.dtype)

    def context(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> SelectionContext:
        prep = self.prepared(target)
        form = self.formulation(target)
        signed = kkt_math.MARGINS.get(form).signed_lambda
        return SelectionContext(forward=prep.exact_forward, params=prep.params, x=state["x"],
                                labels=self.labels(prior, state["x"].device), lam=state["lambda"],
                                formulation=form, loss=target.loss, weight_decay=target.weight_decay,
                                lambda_min=None if signed else self.config.lambda_min,
                                dup_threshold=self.config.dup_threshold)

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Per-candidate scores and selection criteria (attacker-side only)."""
        scores, criteria = select(self.context(target, prior, state))
        form = self.formulation(target)
        notes = assumption_notes(target, form, surrogate=self.config.surrogate)
        return scores, {"formulation": form, "notes": notes, "selection": criteria}

    def run(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
            generator: torch.Generator) -> Reconstruction:
        """Convenience: :func:`run_attack` without a run directory or progress bar."""
        from datarecon.attacks.runner import run_attack

        return run_attack(self, target, prior, x0=x0, generator=generator, progress=False)


class DecoRecoAttack(KKTAttack):
    """DecoReco (Buzaglo et al. 2023): multiclass / regression forms, weight decay welcome."""

    name = "decoreco"
    config_cls = DecoRecoConfig


class GradNormAttack(_XAttack):
    """Runkel eq. 3: min_x ‖∇_θ E(x, y; θ*)‖² (+ box), E with the target's loss and weight decay."""

    name = "gradnorm"
    config_cls = GradNormConfig
    divergence_hint = "lower lr_x or the surrogate sharpness alpha"

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
        entry = LOSSES.get(target.loss) if isinstance(target.loss, str) else None
        if entry is not None and entry.label_kind == "multiclass" and prior.labels.is_floating_point():
            raise DataReconError(f"loss {target.loss!r} needs integer class labels")
        device = next(iter(target.params.values())).device
        state = {"x": x0.detach().to(device=device, dtype=self.dtype).clone()}
        state.update({k: v.to(device) for k, v in init_optimizer_state(self.config.optimizer, state).items()})
        return state

    def terms(self, target: Target, prior: AttackerPrior, x: torch.Tensor) -> dict[str, torch.Tensor]:
        prep = self.prepared(target)
        lo, hi = self.bounds(prior, x.device)
        return kkt_math.gradnorm_terms(prep.forward, prep.params, x, self.labels(prior, x.device),
                                       loss=target.loss, weight_decay=target.weight_decay, lower=lo, upper=hi,
                                       box_weight=self.config.box_weight)

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        x = state["x"].detach().requires_grad_(True)
        terms = self.terms(target, prior, x)
        (gx,) = torch.autograd.grad(terms["loss"], [x])
        metrics = {k: float(v.detach()) for k, v in terms.items()}
        metrics["rel_residual"] = metrics["residual"] / max(self.prepared(target).theta_sq, 1e-300)
        return self._commit(state, {"x": gx}, {"x": self.config.lr_x}, metrics)

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        prep = self.prepared(target)
        x = state["x"]
        ctx = SelectionContext(forward=prep.exact_forward, params=prep.params, x=x,
                               labels=self.labels(prior, x.device), lam=torch.ones(x.shape[0], dtype=x.dtype),
                               formulation=None, loss=target.loss, weight_decay=target.weight_decay,
                               lambda_min=None, dup_threshold=self.config.dup_threshold)
        scores, criteria = select(ctx)
        scores.pop("lambda", None)
        scores.pop("contribution", None)
        return scores, {"formulation": "gradnorm", "notes": [], "selection": criteria}

    def run(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
            generator: torch.Generator) -> Reconstruction:
        from datarecon.attacks.runner import run_attack

        return run_attack(self, target, prior, x0=x0, generator=generator, progress=False)


