"""The KKT attack (Haim et al. 2022), DecoReco (Buzaglo et al. 2023) and Loo et al. (2023).

Thin stateful wrappers around the pure math of :mod:`datarecon.attacks.kkt_math`; each is an
:class:`~datarecon.attacks.base.Attack` whose step is the interface's (:meth:`~datarecon.attacks.base.Attack.step`):
its hooks here are the variables (x and the multipliers λ with their learning rates), the gradient (the
closed-form backward of :func:`kkt_math.kkt_residual_and_grads`, or the compiled one), sample splitting at
the start of a step and the projected update of subspace candidates. The priors (the pixel box, TV, the
feature statistics, group consistency) are the interface's (:func:`~datarecon.attacks.priors.add_priors`).

* ``kkt``: minimise R(x, λ) + w_box·box(x) + w_λ·hinge(λ) (see kkt_math), reference settings:
  SGD momentum 0.9, λ₀ ~ U(0,1), lr_λ 1e-4, float64, sigmoid surrogate.
* ``decoreco``: the same objective with formulation chosen from the target (``auto``:
  multiclass for k > 1 outputs, regression for mse/huber losses, else binary) and a larger λ
  learning rate (0.5). With weight decay, θ* is a stationary point of the regularised loss and λ
  absorbs the scale, so the residual is the same.
* ``loo``: the gradients taken at the known initialisation θ_init (``knowledge.known_init``).

The gradient-norm attack (:mod:`datarecon.attacks.gradnorm`) shares the surrogate network
(:mod:`datarecon.attacks.kkt_target`).

State (flat dict, checkpointed by the runner): ``x`` (m, C, H, W), ``lambda`` (m,) and optimiser
buffers ``opt.*``.

Example::

    attack = KKTAttack(KKTConfig(steps=1000, lr_x=0.1, alpha=20))
    rec = run_attack(attack, AttackSetup(target, prior, x0, g), out="runs/kkt")
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator, model_validator

from datarecon.attacks import kkt_math, kkt_split
from datarecon.attacks.base import AttackerPrior, Gradients, Target
from datarecon.attacks.gradnorm import GradNormAttack, GradNormConfig
from datarecon.attacks.kkt_batched import StackedGroup
from datarecon.attacks.kkt_target import (
    SurrogateAttack,
    SurrogateAttackConfig,
    assumption_notes,
    check_formulation,
    compile_function,
    resolve_formulation,
)
from datarecon.attacks.optim import apply_if_finite
from datarecon.attacks.priors import weighted_priors
from datarecon.attacks.grouped import CROSS_RUN_PRIORS
from datarecon.attacks.selection import SelectionContext, select
from datarecon.attacks.surrogate import functional_surrogate
from datarecon.errors import DataReconError

__all__ = ["DecoRecoAttack", "DecoRecoConfig", "GradNormAttack", "GradNormConfig", "KKTAttack", "KKTConfig",
           "LAMBDA_INITS", "LooAttack", "LooConfig", "SurrogateAttackConfig", "resolve_formulation"]

LAMBDA_INITS = ("uniform", "uniform-signed", "ones")
#: the settings of sample splitting, which act only with ``split_every`` (refused without it)
SPLIT_SETTINGS = ("split_fraction", "split_scale", "split_iters")


class KKTConfig(SurrogateAttackConfig):
    """KKT attack (Haim et al. 2022); defaults near the reference's best shipped runs.

    ``formulation``: ``auto`` (default: from the target: k > 1 → multiclass; mse/huber →
    regression; else binary, Haim's setting) or one of ``binary`` | ``multiclass`` |
    ``regression`` (kkt_math.MARGINS) to force it.
    """

    #: fields added after the first release: left out of dumps at their default (config hashes of earlier folders)
    added_fields: ClassVar[tuple[str, ...]] = ("compile", "reference", "init_coefficient", "subspace", "tv_weight",
                                               "split_every", "split_fraction", "split_scale", "split_iters")

    lr_lambda: float = Field(default=1e-4, ge=0, description="learning rate of the multipliers")
    lambda_init: Literal["uniform", "uniform-signed", "ones"] = Field(
        default="uniform", description="U(0,1), U(-1,1) or all ones")
    lambda_min: float = Field(default=0.45, ge=0, description="floor of lambda (hinge)")
    lambda_min_weight: float = Field(default=5.0, ge=0, description="weight of relu(lambda_min - lambda)^2")
    formulation: str = Field(default="auto", description="auto (from the target) or a kkt_math.MARGINS key: "
                             "binary, multiclass, regression")
    compile: bool = Field(default=False, description="torch.compile the step's objective and gradient "
                          "(same maths; pays a one-off compile, see benchmarks/bench_compile.py)")
    reference: Literal["theta-star", "theta-init"] = Field(
        default="theta-star", description="where ∇_θΦ is taken: θ* (Haim) or θ_init (Loo et al.; needs "
        "knowledge.known_init)")
    init_coefficient: Literal["auto", "fit"] | float = Field(
        default="auto", description="a in θ* − a·θ_init with a known initialisation: auto (1 without weight "
        "decay, fitted with it), fit, or a number")
    subspace: bool | None = Field(
        default=None, description="keep the candidates in the first dense layer's training subspace: x = V z with "
        "V from W1 (or W1 − a·W1_init), k from attacks.subspace.analyse; null (default): on when the attacker "
        "knows θ_init and the first dense layer reads the input (the best measured combination), else off")
    tv_weight: float = Field(default=0.0, ge=0, description="weight of a total-variation prior on the candidates "
                             "(per pixel)")
    split_every: int = Field(default=0, ge=0, description="sample splitting (Shen et al. 2026) every N steps; 0: off")
    split_fraction: float = Field(default=0.1, gt=0, le=0.5, description="fraction of candidates split each time")
    split_scale: float = Field(default=0.05, gt=0, description="split offset ‖δ‖ relative to ‖x_i‖")
    split_iters: int = Field(default=10, ge=1, description="power iterations for the splitting direction")

    @model_validator(mode="before")
    @classmethod
    def _tv_meaning(cls, data: Any) -> Any:
        # a recorded config names the meaning of tv_weight it ran with (the dump adds it): read it back
        if isinstance(data, dict) and "tv_reduction" in data:
            data = dict(data)
            if data.pop("tv_reduction") != "mean":
                raise ValueError("tv_reduction: this run weighed TV as a sum over pixels; tv_weight is now per pixel "
                                 "(divide the sum's weight by m·C·H·W) and the run cannot be resumed")
        return data

    @field_validator("formulation")
    @classmethod
    def _form(cls, v: str) -> str:
        if v != "auto":
            kkt_math.MARGINS.get(v)
        return v

    @model_validator(mode="after")
    def _splitting_settings_need_splitting(self) -> KKTConfig:
        fields = type(self).model_fields
        idle = [f for f in SPLIT_SETTINGS if getattr(self, f) != fields[f].default]
        if idle and not self.split_every:
            flag = "--" + idle[0].replace("_", "-")
            raise DataReconError(f"{idle[0]} {getattr(self, idle[0])} ({flag}) does nothing without sample splitting: "
                                 f"pass --split-every N (N >= 1), or drop {flag}")
        return self

    def recorded(self, data: Any) -> Any:
        data = super().recorded(data)
        if isinstance(data, dict) and self.tv_weight > 0:
            # TV per pixel since 2026-11-28 (it was the sum): the meaning recorded, so a run of the
            # sum's weight is not resumed or pooled under it
            data["tv_reduction"] = "mean"
        return data

    @property
    def extended(self) -> bool:
        """True when the objective goes beyond Haim's (subspace, TV prior, splitting)."""
        return bool(self.subspace) or self.tv_weight > 0 or self.split_every > 0



class DecoRecoConfig(KKTConfig):
    """DecoReco (Buzaglo et al. 2023): formulation from the target, λ learning rate 0.5."""

    formulation: str = "auto"
    lr_lambda: float = Field(default=0.5, ge=0)


class LooConfig(KKTConfig):
    """Loo et al. (2023): match θ* − a·θ_init with gradients at the known initialisation θ_init."""

    reference: Literal["theta-star", "theta-init"] = "theta-init"


class KKTAttack(SurrogateAttack):
    """The KKT attack of Haim et al. (2022); ``decoreco`` and ``kkt`` differ only in defaults.

    With ``compile=True`` the step's objective and its gradient w.r.t. (x, λ) come from
    :func:`kkt_math.kkt_value_and_grad` compiled with ``torch.compile`` (one graph per target and
    shape), otherwise from the closed-form backward of :func:`kkt_math.kkt_residual_and_grads` (the same
    numbers as autograd of :meth:`objective`); the optimiser update is the same.

    Beyond Haim's objective (each off by default; measured in docs/RESULTS.md):

    * a **known initialisation** (``prior.known_init``): g must match θ* − a·θ_init, with the
      gradients at θ* (``reference: theta-star``) or at θ_init (``theta-init``, the ``loo`` attack);
    * **subspace candidates** (``subspace``): x = V z with V (d × k) the training subspace of the first
      dense layer (``prior.subspace``); the step is the projected gradient V Vᵀ ∂L/∂x, the same
      update as gradient descent on z (SGD), and x is re-projected after each update;
    * a **total-variation prior** (``tv_weight``, per pixel: :func:`~datarecon.attacks.priors.tv_mean_value_and_grad`);
    * **sample splitting** (``split_every``; Shen et al. 2026, :mod:`datarecon.attacks.kkt_split`): every N
      steps, at the start of the step, the candidates with the largest second-order gain are split in two.
    """

    name: ClassVar[str] = "kkt"
    config_cls: ClassVar[type[Any]] = KKTConfig
    resume_ignore: ClassVar[tuple[str, ...]] = ("steps", "compile")
    uses: ClassVar[tuple[str, ...]] = ("weights", "known_init", "n")
    subspace_candidates: ClassVar[bool] = True
    step_size_fields: ClassVar[tuple[str, ...]] = ("lr_x", "lr_lambda")

    def __init__(self, config: KKTConfig | None = None) -> None:
        super().__init__(config)
        self._compiled: dict[int, tuple[Target, Any]] = {}
        self._objectives: dict[int, tuple[Target, kkt_math.KKTObjective]] = {}

    def compiled_value_and_grad(self, target: Target) -> Any:
        """The compiled (x, λ, θ*, labels, lower, upper) ↦ ((∂L/∂x, ∂L/∂λ), (L, (R, box, hinge))).

        Cached per target (the entry keeps its target, so a new target that reuses a collected
        one's ``id`` is compiled afresh, as :meth:`prepared` does)."""
        key = id(target)
        cached = self._compiled.get(key)
        if cached is None or cached[0] is not target:
            c = self.config
            model = functional_surrogate(c.surrogate, target.model, alpha=c.alpha)
            fn = kkt_math.kkt_value_and_grad(model, objective=self.kkt_objective(target))
            self._compiled[key] = (target, compile_function(fn))
        return self._compiled[key][1]

    def _compiled_gradients(self, target: Target, prior: AttackerPrior, x: torch.Tensor,
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
        """The margin this run uses on ``target`` (``auto`` resolved)."""
        return resolve_formulation(self.config.formulation, target)

    def hashed_config(self, target: Target | None = None) -> dict[str, Any]:
        """As :meth:`Attack.hashed_config`, with ``formulation: auto`` hashed as what it resolves to on
        ``target``, so a run started with an explicit ``binary`` resumes under the default."""
        fields = super().hashed_config(target)
        if target is not None and "formulation" in fields:
            fields["formulation"] = self.formulation(target)
        return fields

    def kkt_objective(self, target: Target) -> kkt_math.KKTObjective:
        """The settings of this attack's KKT / DecoReco objective on ``target`` (the one definition the
        single-run, batched and autograd-reference paths use), built once per target."""
        cached = self._objectives.get(id(target))
        if cached is None or cached[0] is not target:
            c = self.config
            objective = kkt_math.KKTObjective(margin=self.formulation(target), lambda_min=c.lambda_min,
                                              lambda_min_weight=c.lambda_min_weight, box_weight=c.box_weight)
            self._objectives[id(target)] = cached = (target, objective)
        return cached[1]

    def reference_settings(self) -> tuple[str, str | float]:
        """``reference`` and ``init_coefficient`` of the config."""
        return self.config.reference, self.config.init_coefficient

    def check_knowledge(self, target: Target, prior: AttackerPrior) -> None:
        """Refuse settings that need knowledge the prior does not hold, or that do not combine.

        Raises:
            DataReconError: ``reference: theta-init`` (or the ``loo`` attack) without a known
                initialisation; ``subspace`` without a subspace analysis on the model input;
                ``compile`` with a known initialisation or an extended objective; sample splitting in runs
                coupled by group consistency; ``init_coefficient`` without a known initialisation.
        """
        c = self.config
        known = prior.known_init
        if (c.reference == "theta-init" or "known_init" in self.requires) and known is None:
            raise DataReconError(f"{self.name} with gradients at θ_init needs the initialisation: pass --known-init "
                                 "seed:N (model directories) or --known-init FILE.safetensors")
        if known is None and c.init_coefficient != type(c).model_fields["init_coefficient"].default:
            raise DataReconError(f"init_coefficient {c.init_coefficient} is the a of θ* − a·θ_init and does nothing "
                                 "without a known initialisation: pass --known-init, or drop --init-coefficient")
        if c.subspace:  # asked for explicitly (auto turns on only where it applies)
            sub = prior.subspace
            if sub is None:
                raise DataReconError("subspace candidates need the subspace analysis of the first dense layer; "
                                     "run through datarecon reconstruct / execute (which computes it)")
            if not sub.layer.on_input:
                raise DataReconError("subspace candidates need a first dense layer that acts on the input (an MLP); "
                                     "this model has convolutions first: turn subspace off")
        if c.compile and (known is not None or c.extended):
            raise DataReconError("--compile supports the plain KKT objective only; drop --compile to use a known "
                                 "initialisation, subspace candidates, the TV prior or sample splitting")
        if c.split_every and any(n in CROSS_RUN_PRIORS for n in weighted_priors(c)):
            raise DataReconError("sample splitting (split_every) changes a run's candidates between its steps, which "
                                 "runs coupled by group consistency do not take: drop split_every or group_weight")

    def initial_variables(self, target: Target, prior: AttackerPrior, *, x: torch.Tensor,
                          generator: torch.Generator) -> dict[str, torch.Tensor]:
        """x = x₀ (projected onto the subspace when ``subspace``), λ₀ from ``lambda_init`` drawn with ``generator``
        (CPU, float64, then the attack's dtype); the formulation and the knowledge checked first."""
        form = self.formulation(target)
        check_formulation(form, target, prior)
        self.check_knowledge(target, prior)
        for note in assumption_notes(target, form, surrogate=self.config.surrogate):
            warnings.warn(f"{self.name}: {note}", UserWarning, stacklevel=3)
        m = prior.m
        if self.config.lambda_init == "uniform":
            lam = torch.rand(m, generator=generator, dtype=torch.float64)
        elif self.config.lambda_init == "uniform-signed":
            lam = 2 * torch.rand(m, generator=generator, dtype=torch.float64) - 1
        else:
            lam = torch.ones(m, dtype=torch.float64)
        if self.uses_subspace(prior):
            x = self.project(prior, x)
        return {"x": x, "lambda": lam.to(device=x.device, dtype=self.dtype)}

    def learning_rates(self, index: int) -> dict[str, float]:
        """``x``: lr_x, ``lambda``: lr_lambda."""
        return {"x": self.config.lr_x, "lambda": self.config.lr_lambda}

    def uses_subspace(self, prior: AttackerPrior) -> bool:
        """Whether the candidates are kept in the training subspace: ``subspace`` when set; by default
        (None) when the prior holds θ_init and a subspace analysis of a first dense layer that reads the
        input (with θ_init known this raised the count on the medium targets: docs/RESULTS.md)."""
        if self.config.subspace is not None:
            return bool(self.config.subspace)
        sub = prior.subspace
        return prior.known_init is not None and sub is not None and bool(sub.layer.on_input)

    def basis(self, prior: AttackerPrior, x: torch.Tensor) -> torch.Tensor:
        """(d, k) subspace basis in x's dtype and device."""
        return prior.subspace.basis.to(device=x.device, dtype=x.dtype)

    def project(self, prior: AttackerPrior, v: torch.Tensor) -> torch.Tensor:
        """V Vᵀ v per candidate (v (m, C, H, W)): the subspace part of a point or a gradient."""
        basis = self.basis(prior, v)
        flat = v.reshape(v.shape[0], -1)
        return ((flat @ basis) @ basis.T).reshape(v.shape)

    def before_step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], index: int) -> None:
        """Sample splitting (:func:`kkt_split.split`) at every ``split_every``-th step after the first."""
        c = self.config
        if c.split_every and index > 0 and index % c.split_every == 0:
            kkt_split.split(self, target, prior, state, index)

    def objective(self, target: Target, prior: AttackerPrior, x: torch.Tensor,
                  **variables: torch.Tensor) -> dict[str, torch.Tensor]:
        """R(x, λ) + w_λ·hinge(λ) at (x, λ = ``variables["lambda"]``), differentiable in both
        (:func:`kkt_math.kkt_terms` without the box, a prior the step adds): the autograd form of :meth:`gradients`."""
        prep = self.prepared(target, prior)
        return kkt_math.kkt_terms(prep.forward, prep.ref, x, self.labels(prior, x.device), variables["lambda"],
                                  objective=self.kkt_objective(target), box=None, matching=prep.matching())

    def gradients(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> Gradients:
        """The objective's terms and its gradients in (x, λ): compiled (``compile``), else the closed-form
        backward of :func:`kkt_math.kkt_residual_and_grads` (the numbers of autograd on :meth:`objective`)."""
        if self.config.compile:
            terms, gx, gl = self._compiled_gradients(target, prior, state["x"].detach(), state["lambda"].detach())
        else:
            prep = self.prepared(target, prior)
            terms, gx, gl = kkt_math.kkt_residual_and_grads(
                prep.forward, prep.ref, state["x"], self.labels(prior, state["x"].device), state["lambda"],
                objective=self.kkt_objective(target), matching=prep.matching())
        return Gradients(terms, {"x": gx, "lambda": gl})

    def own_priors(self, target: Target, prior: AttackerPrior) -> tuple[str, ...]:
        """The box prior with ``compile`` (the compiled objective holds it)."""
        return ("box",) if self.config.compile else ()

    def update(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], g: Gradients,
               index: int) -> dict[str, float]:
        """The residual's metrics (:meth:`residual_metrics`), then the optimiser on (x, λ) under the finiteness
        rule; with subspace candidates the projected gradient V Vᵀ ∂L/∂x, and x re-projected after the update
        (non-linear optimisers leave the span)."""
        metrics = self.residual_metrics(target, prior, g.terms, state)
        subspace = self.uses_subspace(prior)
        gx = self.project(prior, g.grads["x"]) if subspace else g.grads["x"]
        metrics = apply_if_finite(self.config.optimizer, self.config.optimizer_settings(), state,
                                  {"x": gx, "lambda": g.grads["lambda"]}, self.learning_rates(index), metrics)
        if subspace:
            state["x"] = self.project(prior, state["x"])
        return metrics

    def residual_metrics(self, target: Target, prior: AttackerPrior, metrics: dict[str, float],
                         state: Mapping[str, torch.Tensor], *, lambda_mean: float | None = None) -> dict[str, float]:
        """``metrics`` plus what a step reports before its update: ``rel_residual`` (the residual over ‖θ*‖², or
        ‖θ* − a·θ_init‖² with a known initialisation) and ``lambda_mean`` (the mean of ``state["lambda"]`` unless
        given, e.g. by a batch that computed every run's at once)."""
        prep = self.prepared(target, prior)
        metrics["rel_residual"] = metrics["residual"] / max(prep.goal_sq(metrics.get("init_coefficient")), 1e-300)
        metrics["lambda_mean"] = float(state["lambda"].mean()) if lambda_mean is None else lambda_mean
        return metrics

    # -- batching, selection, results --------------------------------------------------------------

    def stackable(self, target: Target, prior: AttackerPrior) -> bool:
        """Whether runs of this config can share one vmapped step (not: the compiled step, a known
        initialisation, subspace candidates, the TV prior, splitting)."""
        c = self.config
        return not (c.compile or c.extended or c.reference != "theta-star" or prior.known_init is not None)

    def batch_key(self, target: Target, prior: AttackerPrior) -> tuple[Any, ...] | None:
        """What fixes a step's objective and optimiser: runs with equal keys share one vmapped step
        (:class:`~datarecon.attacks.kkt_batched.StackedGroup`); runs that cannot (:meth:`stackable`) are stepped
        alone, unless group consistency couples them (the interface's key)."""
        if not self.stackable(target, prior):
            return super().batch_key(target, prior)
        c = self.config
        return (self.formulation(target), c.surrogate, c.alpha, c.lambda_min, c.lambda_min_weight, c.box_weight,
                c.dtype, c.optimizer, c.optimizer_settings())

    def stacked_group(self, runs: Mapping[int, Any]) -> Any:
        """The runs' states stacked on a run axis, stepped by one vmapped residual and gradient (runs coupled but
        not :meth:`stackable`: the interface's :class:`~datarecon.attacks.grouped.CoupledGroup`)."""
        first = runs[min(runs)]
        if not self.stackable(first.setup.target, first.setup.prior):
            return super().stacked_group(runs)
        return StackedGroup.stack(runs)

    def context(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> SelectionContext:
        prep = self.prepared(target, prior)
        form = self.formulation(target)
        signed = kkt_math.MARGINS.get(form).signed_lambda
        return SelectionContext(forward=prep.exact_forward, params=prep.params, x=state["x"],
                                labels=self.labels(prior, state["x"].device), lam=state["lambda"],
                                formulation=form, loss=target.loss, weight_decay=target.weight_decay,
                                lambda_min=None if signed else self.config.lambda_min,
                                dup_threshold=self.config.dup_threshold, reference=prep.ref, init=prep.init,
                                coefficient=prep.coefficient)

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Per-candidate scores and selection criteria (attacker-side only)."""
        scores, criteria = select(self.context(target, prior, state))
        form = self.formulation(target)
        notes = assumption_notes(target, form, surrogate=self.config.surrogate)
        return scores, {"formulation": form, "notes": notes, "selection": criteria}



class DecoRecoAttack(KKTAttack):
    """DecoReco (Buzaglo et al. 2023): multiclass / regression forms, weight decay welcome."""

    name = "decoreco"
    config_cls = DecoRecoConfig


class LooAttack(KKTAttack):
    """Loo et al. (2023): R = ‖θ* − a·θ_init − Σ_i λ_i y_i ∇_θΦ(θ_init; x_i)/m‖², the network
    linearised at its known initialisation (the KKT machinery with θ_ref = θ_init); needs
    ``knowledge.known_init``."""

    name = "loo"
    config_cls = LooConfig
    requires = ("known_init",)
