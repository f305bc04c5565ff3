"""KKT (Haim et al. 2022), DecoReco (Buzaglo et al. 2023) and gradient-norm (Runkel eq. 3) attacks.

Thin stateful wrappers around the pure math of :mod:`datarecon.attacks.kkt_math`; each
is an :class:`~datarecon.attacks.base.Attack` and is registered in
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
    rec = run_attack(attack, AttackSetup(target, prior, x0, g), out="runs/kkt")
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator, model_serializer, model_validator

from datarecon.attacks import kkt_math
from datarecon.attacks.base import (
    Attack,
    AttackConfig,
    PRIOR_FIELDS,
    AttackerPrior,
    Target,
    commit_update,
)
from datarecon.attacks.grouped import CROSS_RUN_PRIORS
from datarecon.attacks.kkt_batched import StackedGroup
from datarecon.attacks.optim import init_optimizer_state
from datarecon.attacks.priors import PriorInput, add_priors
from datarecon.attacks.selection import SelectionContext, select
from datarecon.attacks.surrogate import SURROGATES, count_functional_relus, functional_surrogate, make_surrogate
from datarecon.config import drop_defaults
from datarecon.errors import DataReconError
from datarecon.kernel.losses import LOSSES, loss_name
from datarecon.registry import registered

LAMBDA_INITS = ("uniform", "uniform-signed", "ones")


class SurrogateAttackConfig(AttackConfig):
    """Fields of the attacks that differentiate through the ReLU surrogate (KKT family, gradient norm).

    Attributes:
        surrogate: a key of :data:`~datarecon.attacks.surrogate.SURROGATES`.
        alpha: the surrogate's sharpness, > 0.
        dup_threshold: cosine above which two candidates count as near-duplicates (selection).
    """

    surrogate: Annotated[str, registered(SURROGATES)] = Field(default="sigmoid-surrogate", description="key of attacks.surrogate.SURROGATES")
    alpha: float = Field(default=20.0, gt=0, description="surrogate sharpness: ReLU' := sigmoid(alpha z)")
    dup_threshold: float = Field(default=0.99, gt=-1, le=1, description="cosine of near-duplicate candidates")


class KKTConfig(SurrogateAttackConfig):
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

    @model_serializer(mode="wrap")
    def _drop_defaults(self, handler):  # type: ignore[no-untyped-def]
        # fields added after the first release are left out of dumps while at their default, so
        # config hashes (resume keys, reproduction pieces, sweeps) of existing folders stay valid
        data = drop_defaults(self, handler(self), _OPTIONAL_FIELDS)
        if isinstance(data, dict) and self.tv_weight > 0:
            # TV per pixel since 2026-11-28 (it was the sum): the meaning recorded, so a run of the
            # sum's weight is not resumed or pooled under it
            data["tv_reduction"] = "mean"
        return data

    @property
    def extended(self) -> bool:
        """True when the objective goes beyond Haim's (subspace, TV prior, splitting)."""
        return bool(self.subspace) or self.tv_weight > 0 or self.split_every > 0


#: KKTConfig fields dropped from dumps at their default (hash compatibility, see ``_drop_defaults``)
_OPTIONAL_FIELDS = ("compile", "reference", "init_coefficient", "subspace", "tv_weight", "split_every",
                    "split_fraction", "split_scale", "split_iters", *PRIOR_FIELDS)


class DecoRecoConfig(KKTConfig):
    """DecoReco (Buzaglo et al. 2023): formulation from the target, λ learning rate 0.5."""

    formulation: str = "auto"
    lr_lambda: float = Field(default=0.5, ge=0)


class LooConfig(KKTConfig):
    """Loo et al. (2023): match θ* − a·θ_init with gradients at the known initialisation θ_init."""

    reference: Literal["theta-star", "theta-init"] = "theta-init"


class GradNormConfig(SurrogateAttackConfig):
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
    """What in the target breaks the method's assumptions (empty if nothing)."""
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


class PreparedTarget:
    """Cached per-(target, known θ_init) derived objects: θ* in the config dtype, surrogate and exact
    forwards, and with a known initialisation θ_init, the reference point θ_ref of the gradients and
    the scalars of ‖θ* − a·θ_init‖²."""

    def __init__(self, target: Target, *, dtype: torch.dtype, surrogate: str, alpha: float,
                 known_init: Any = None, reference: str = "theta-star", coefficient: float | None = 1.0) -> None:
        self.target = target  # held: the cache key's id stays this object's while the entry lives
        self.params = {k: v.detach().to(dtype) for k, v in target.params.items()}
        self.model = make_surrogate(surrogate, target.model, alpha=alpha)
        self.theta_sq = float(kkt_math.squared_norm(self.params))
        self.init = None if known_init is None else {k: v.detach().to(dtype) for k, v in known_init.params.items()}
        self.coefficient = coefficient  # None: fitted every step
        self.ref = self.init if (reference == "theta-init" and self.init is not None) else self.params
        if self.init is not None:
            self.cross = float(sum((self.params[k].double() * self.init[k].double()).sum() for k in self.params))
            self.init_sq = float(kkt_math.squared_norm(self.init))
        from torch.func import functional_call

        sur_model, plain = self.model, target.model
        self.forward = lambda x, p: functional_call(sur_model, dict(p), (x,))
        self.exact_forward = lambda x, p: functional_call(plain, dict(p), (x,))

    def goal_sq(self, a: float | None) -> float:
        """‖θ* − a·θ_init‖² (‖θ*‖² without a known initialisation): the relative residual's denominator."""
        if self.init is None or a is None:
            return self.theta_sq
        return self.theta_sq - 2.0 * a * self.cross + a * a * self.init_sq

    def matching(self) -> kkt_math.Matching:
        """What the kkt_math objective functions match for this target (θ*, or θ* − a·θ_init)."""
        if self.init is None:
            return kkt_math.Matching()
        return kkt_math.Matching(theta=self.params, init=self.init, coefficient=self.coefficient)


class SurrogateAttack(Attack):
    """What the attacks on the surrogate network share: the prepared target (surrogate forward, θ*,
    the matching goal), cached per target and known initialisation."""

    config_cls: ClassVar[type[Any]] = SurrogateAttackConfig
    divergence_hint: ClassVar[str] = "lower lr_x, lr_lambda or the surrogate sharpness alpha (and check box_weight)"
    #: the residual relative to ‖θ*‖² (or to the matched change): scale-free, so one tolerance fits every target
    early_stop_metric: ClassVar[str | None] = "rel_residual"
    early_stop_reason: ClassVar[str] = "stopped early: residual plateau"
    progress_keys: ClassVar[tuple[str, ...]] = ("loss", "rel_residual", "residual", "box", "lambda_hinge")
    #: the history's ``rel_residual`` is computed with the surrogate derivative during the run, the
    #: "relative residual" printed at the end with the exact ReLU (``selection.relative_residual``)
    progress_labels: ClassVar[Mapping[str, str]] = MappingProxyType({"rel_residual": "surrogate_rel_residual"})

    def __init__(self, config: SurrogateAttackConfig | None = None) -> None:
        super().__init__(config)
        self._cache: dict[tuple[int, str | None], PreparedTarget] = {}

    def multipliers(self, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The multipliers λ (m,) where the attack learns them (KKT, DecoReco, Loo); ones otherwise."""
        lam = state.get("lambda")
        return lam if lam is not None else super().multipliers(prior, state)

    def prepared(self, target: Target, prior: AttackerPrior | None = None) -> PreparedTarget:
        """The target prepared for this attack's steps (cached while the target object lives)."""
        known = prior.known_init if prior is not None else None
        key = (id(target), known.sha256 if known is not None else None)
        cached = self._cache.get(key)
        if cached is not None and cached.target is target:
            return cached
        c = self.config
        reference, setting = (c.reference, c.init_coefficient) if isinstance(c, KKTConfig) else ("theta-star", "auto")
        if setting == "auto":
            coefficient: float | None = None if target.weight_decay > 0 else 1.0
        else:
            coefficient = None if setting == "fit" else float(setting)
        self._cache[key] = PreparedTarget(target, dtype=self.dtype, surrogate=c.surrogate, alpha=c.alpha,
                                          known_init=known, reference=reference, coefficient=coefficient)
        return self._cache[key]


def compile_function(fn: Any) -> Any:
    """``torch.compile(fn)`` as one static-shape graph; 1 inductor compile thread on <= 4 CPUs."""
    import torch._inductor.config as inductor_config

    if (os.cpu_count() or 1) <= 4:
        inductor_config.compile_threads = 1
    return torch.compile(fn, fullgraph=True, dynamic=False)


class KKTAttack(SurrogateAttack):
    """The KKT attack of Haim et al. (2022); ``decoreco`` and ``kkt`` differ only in defaults.

    With ``compile=True`` the step's objective and its gradient w.r.t. (x, λ) come from
    :func:`kkt_math.kkt_value_and_grad` compiled with ``torch.compile`` (one graph per target and
    shape), otherwise from :meth:`terms` + autograd; the optimiser update is the same.

    Beyond Haim's objective (each off by default; measured in docs/RESULTS.md):

    * a **known initialisation** (``prior.known_init``): g must match θ* − a·θ_init, with the
      gradients at θ* (``reference: theta-star``) or at θ_init (``theta-init``, the ``loo`` attack);
    * **subspace candidates** (``subspace``): x = V z with V (d × k) the training subspace of the first
      dense layer (``prior.subspace``); the step is the projected gradient V Vᵀ ∂L/∂x, the same
      update as gradient descent on z (SGD), and x is re-projected after each update;
    * a **total-variation prior** (``tv_weight``, per pixel: :func:`~datarecon.attacks.priors.tv_mean_value_and_grad`);
    * **sample splitting** (``split_every``; Shen et al. 2026): every N steps the candidates whose
      splitting matrix S_i = ∇²_x⟨r, ∇_θ out_i(x_i)⟩ (r = goal − g) has the largest positive
      eigenvalue (times λ_i) are split into x_i ± δ·v_i with λ_i/2 each; the copy replaces the
      candidate of the same label with the smallest λ. To second order the residual falls by
      (λ_i/m)·μ_i·‖δ‖², μ_i the eigenvalue, found by power iteration on finite-difference
      Hessian-vector products of the surrogate network.
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

    def check_knowledge(self, target: Target, prior: AttackerPrior) -> None:
        """Refuse settings that need knowledge the prior does not hold, or that do not combine.

        Raises:
            DataReconError: ``reference: theta-init`` (or the ``loo`` attack) without a known
                initialisation; ``subspace`` without a subspace analysis on the model input;
                ``compile`` with a known initialisation or an extended objective.
        """
        c = self.config
        known = prior.known_init
        if (c.reference == "theta-init" or "known_init" in self.requires) and known is None:
            raise DataReconError(f"{self.name} with gradients at θ_init needs the initialisation: pass --known-init "
                                 "seed:N (model directories) or --known-init FILE.safetensors")
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

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
        """x = x0 (cast; projected onto the subspace when ``subspace``), λ₀ from ``lambda_init`` drawn
        with ``generator`` (CPU, float64), zero buffers."""
        form = self.formulation(target)
        check_formulation(form, target, prior)
        self.check_knowledge(target, prior)
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
        if self.uses_subspace(prior):
            x = self.project(prior, x)
        lam = lam.to(device=device, dtype=self.dtype)
        state = {"x": x, "lambda": lam}
        state.update({k: v.to(device) for k, v in init_optimizer_state(self.config.optimizer, state).items()})
        return state

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

    def terms(self, target: Target, prior: AttackerPrior, x: torch.Tensor, lam: torch.Tensor, *,
              include_box: bool = True) -> dict[str, torch.Tensor]:
        """The objective's terms at (x, λ) (differentiable; see ``kkt_math.kkt_terms``; without the
        TV prior)."""
        prep = self.prepared(target, prior)
        lo, hi = self.bounds(prior, x.device)
        return kkt_math.kkt_terms(prep.forward, prep.ref, x, self.labels(prior, x.device), lam,
                                  objective=self.kkt_objective(target), box=(lo, hi) if include_box else None,
                                  matching=prep.matching())

    def objective_and_grads(self, target: Target, prior: AttackerPrior, x: torch.Tensor,
                            lam: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """All terms of the step's objective and its gradients w.r.t. (x, λ) (before any projection)."""
        prep = self.prepared(target, prior)
        # the objective of terms(), differentiated cheaply: g's backward seeded by ∂R/∂g and the
        # box prior in closed form (same values and gradients; tests compare with autograd)
        terms, gx, gl = kkt_math.kkt_residual_and_grads(
            prep.forward, prep.ref, x, self.labels(prior, x.device), lam, objective=self.kkt_objective(target),
            matching=prep.matching())
        given = PriorInput(x.detach(), *self.bounds(prior, x.device), target=target, labels=self.labels(prior, x.device))
        terms, gx = add_priors(self.config, given, terms, gx, skip=CROSS_RUN_PRIORS)
        return terms, gx, gl

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        """One optimiser step on (x, λ); metrics: loss, residual, rel_residual, box, lambda_hinge, ..."""
        c = self.config
        if c.split_every and index > 0 and index % c.split_every == 0:
            self.split(target, prior, state, index)
        if c.compile:
            terms, gx, gl = self._compiled_terms(target, prior, state["x"].detach(), state["lambda"].detach())
        else:
            terms, gx, gl = self.objective_and_grads(target, prior, state["x"], state["lambda"])
        subspace = self.uses_subspace(prior)
        if subspace:
            gx = self.project(prior, gx)
        metrics = {k: float(v.detach()) for k, v in terms.items()}
        metrics = self.apply_gradients(target, state, metrics, gx, gl, prior=prior)
        if subspace and "x" in state:  # non-linear optimisers (adam) leave the span: map back
            state["x"] = self.project(prior, state["x"])
        return metrics

    def apply_gradients(self, target: Target, state: dict[str, torch.Tensor], metrics: dict[str, float],
                        gx: torch.Tensor, gl: torch.Tensor, *, prior: AttackerPrior | None = None) -> dict[str, float]:
        """Commit one optimiser step from the objective's gradients (:meth:`step`; the batched runs of
        :mod:`datarecon.attacks.batched` commit the same rule on their stacked state).

        Args:
            target: the attacked model (for ‖θ*‖², or ‖θ* − a·θ_init‖² with ``prior.known_init``).
            state: this run's state (updated when the update is finite).
            metrics: ``loss``, ``residual``, ``box``, ``lambda_hinge`` of this step (floats; with a
                known initialisation also ``init_coefficient``).
            gx: ∂L/∂x shaped like ``state["x"]``; gl: ∂L/∂λ (m,).
            prior: the run's prior (its known initialisation sets the residual's denominator).

        Returns:
            The step's metrics (plus ``rel_residual``, ``lambda_mean``, gradient norms); NaN
            ``update`` when the update was not finite and was not applied.
        """
        metrics = self.step_metrics(target, state, metrics, prior=prior)
        return commit_update(self.config, state, {"x": gx, "lambda": gl}, self.learning_rates(), metrics)

    def step_metrics(self, target: Target, state: dict[str, torch.Tensor], metrics: dict[str, float], *,
                     prior: AttackerPrior | None = None, lambda_mean: float | None = None) -> dict[str, float]:
        """``metrics`` plus what a step reports before its update: ``rel_residual`` (the residual over
        ‖θ*‖², or ‖θ* − a·θ_init‖² with a known initialisation) and ``lambda_mean`` (the mean of
        ``state["lambda"]`` unless given, e.g. by a batch that computed every run's at once)."""
        prep = self.prepared(target, prior)
        metrics["rel_residual"] = metrics["residual"] / max(prep.goal_sq(metrics.get("init_coefficient")), 1e-300)
        metrics["lambda_mean"] = float(state["lambda"].mean()) if lambda_mean is None else lambda_mean
        return metrics

    def learning_rates(self) -> dict[str, float]:
        """Each variable's learning rate (``x``: lr_x, ``lambda``: lr_lambda)."""
        return {"x": self.config.lr_x, "lambda": self.config.lr_lambda}

    # -- sample splitting ------------------------------------------------------------------------

    def _splitting_gradient(self, target: Target, prior: AttackerPrior, x: torch.Tensor, lam: torch.Tensor,
                            r: dict[str, torch.Tensor]) -> torch.Tensor:
        """∇_x Σ_i ⟨r, ∇_θ out_i(x_i)⟩ (r fixed): row i is ∇h_i(x_i) (the surrogate network)."""
        prep = self.prepared(target, prior)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            g = kkt_math.combination_gradient(prep.forward, prep.ref, xg, self.labels(prior, x.device), lam.detach(),
                                              margin=self.formulation(target), create_graph=True)
            inner = sum((g[k] * r[k]).sum() for k in r if g[k].requires_grad) * x.shape[0]
            (gx,) = torch.autograd.grad(inner, xg)
        return gx.detach()

    def splitting_directions(self, target: Target, prior: AttackerPrior, x: torch.Tensor, lam: torch.Tensor,
                             *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per candidate, the unit direction v_i and eigenvalue μ_i of S_i = ∇²_x h_i with the largest
        μ_i (power iteration on central finite-difference Hessian-vector products, shifted to the
        positive end when the largest magnitude is negative).

        Returns:
            (v (m, C, H, W) with ‖v_i‖ = 1, μ (m,)).
        """
        prep = self.prepared(target, prior)
        with torch.enable_grad():
            g = kkt_math.combination_gradient(prep.forward, prep.ref, x.detach(), self.labels(prior, x.device),
                                              lam.detach(), margin=self.formulation(target), create_graph=False)
        g = {k: v.detach() for k, v in g.items()}
        goal, _ = kkt_math.matching_goal(prep.params, g, init=prep.init, coefficient=prep.coefficient)
        r = {k: (goal[k] - g[k]).detach() for k in goal}
        m = x.shape[0]
        eps = (1e-3 * x.reshape(m, -1).norm(dim=1).clamp_min(1e-3)).reshape(m, *([1] * (x.dim() - 1)))

        def unit(v: torch.Tensor) -> torch.Tensor:
            return v / v.reshape(m, -1).norm(dim=1).clamp_min(1e-30).reshape(eps.shape)

        def hvp(v: torch.Tensor) -> torch.Tensor:
            plus = self._splitting_gradient(target, prior, x + eps * v, lam, r)
            minus = self._splitting_gradient(target, prior, x - eps * v, lam, r)
            return (plus - minus) / (2 * eps)

        gen = torch.Generator().manual_seed(seed)
        start = unit(torch.randn(x.shape, generator=gen, dtype=torch.float64).to(device=x.device, dtype=x.dtype))
        subspace = self.uses_subspace(prior)
        if subspace:
            start = unit(self.project(prior, start))

        def power(shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            v = start
            mu = torch.zeros(m, dtype=x.dtype, device=x.device)
            for _ in range(self.config.split_iters):
                hv = hvp(v)
                if subspace:
                    hv = self.project(prior, hv)
                mu = (hv * v).reshape(m, -1).sum(1)
                v = unit(hv - shift.reshape(eps.shape) * v)
            return v, mu

        v, mu = power(torch.zeros(m, dtype=x.dtype, device=x.device))
        neg = mu < 0  # the dominant eigenvalue is negative: shift it away to reach the positive end
        if bool(neg.any()):
            v2, mu2 = power(torch.where(neg, mu, torch.zeros_like(mu)))
            v = torch.where(neg.reshape(eps.shape), v2, v)
            mu = torch.where(neg, mu2, mu)
        return v, mu

    def split(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], index: int) -> int:
        """Split the candidates with the largest λ_i·μ_i > 0 (see the class docstring); returns how many."""
        c = self.config
        x, lam = state["x"], state["lambda"]
        m = x.shape[0]
        v, mu = self.splitting_directions(target, prior, x, lam, seed=index)
        gain = lam.abs() * mu
        labels = prior.labels.to(x.device)
        count = max(1, int(c.split_fraction * m))
        order = torch.argsort(gain, descending=True).tolist()
        taken: set[int] = set()
        done = 0
        for i in order:
            if done >= count or float(gain[i]) <= 0:
                break
            if i in taken:
                continue
            same = [j for j in torch.argsort(lam.abs()).tolist()
                    if j != i and j not in taken and bool(labels[j] == labels[i])]
            if not same:
                continue
            j = same[0]
            delta = c.split_scale * float(x[i].norm()) * v[i]
            with torch.no_grad():
                x[j] = x[i] - delta
                x[i] = x[i] + delta
                lam[i] = lam[i] / 2
                lam[j] = lam[i]
                for key, buf in state.items():
                    if key.startswith("opt.") and buf.shape[:1] == (m,):
                        buf[i] = 0
                        buf[j] = 0
            taken.update((i, j))
            done += 1
        return done

    # -- batching, selection, results --------------------------------------------------------------

    def batch_key(self, target: Target, prior: AttackerPrior) -> tuple[Any, ...] | None:
        """What fixes a step's objective and optimiser: runs with equal keys share one vmapped step
        (:class:`~datarecon.attacks.kkt_batched.StackedGroup`); None: stepped alone (the compiled
        step, a known initialisation, subspace candidates, the TV prior, splitting)."""
        c = self.config
        if c.compile or c.extended or c.reference != "theta-star" or prior.known_init is not None:
            return None
        return (self.formulation(target), c.surrogate, c.alpha, c.lambda_min, c.lambda_min_weight, c.box_weight,
                c.dtype, c.optimizer, c.optimizer_settings())

    def stacked_group(self, runs: Mapping[int, Any]) -> StackedGroup:
        """The runs' states stacked on a run axis, stepped by one vmapped residual and gradient."""
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


class GradNormAttack(SurrogateAttack):
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
                                       objective=kkt_math.GradNormObjective(loss=target.loss,
                                                                            weight_decay=target.weight_decay,
                                                                            box_weight=self.config.box_weight),
                                       box=(lo, hi))

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        x = state["x"].detach().requires_grad_(True)
        terms = self.terms(target, prior, x)
        (gx,) = torch.autograd.grad(terms["loss"], [x])
        metrics = {k: float(v.detach()) for k, v in terms.items()}
        metrics["rel_residual"] = metrics["residual"] / max(self.prepared(target).theta_sq, 1e-300)
        return commit_update(self.config, state, {"x": gx}, {"x": self.config.lr_x}, metrics)

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



