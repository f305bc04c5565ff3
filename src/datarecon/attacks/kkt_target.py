"""What the attacks on the surrogate network share (the KKT family and the gradient norm): the config of the
ReLU surrogate, the target prepared for their steps (θ* in the attack's dtype, the surrogate and exact forwards,
the matching goal), the formulation resolved against the target and the notes on its assumptions, and the
convergence rule of their relative residual.

References:
    Haim et al. (2022) eq. 5; Buzaglo et al. (2023) (formulations); Loo et al. (2023) (a known initialisation).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

import torch
from pydantic import Field
from torch.func import functional_call

from datarecon.attacks import kkt_math
from datarecon.attacks.base import Attack, AttackConfig, AttackerPrior, Target
from datarecon.attacks.convergence import RESIDUAL_TOL, ConvergenceRule
from datarecon.attacks.surrogate import SURROGATES, count_functional_relus, make_surrogate
from datarecon.errors import DataReconError
from datarecon.kernel.losses import loss_name
from datarecon.registry import registered

__all__ = ["RESIDUAL_CONVERGENCE", "PreparedTarget", "SurrogateAttack", "SurrogateAttackConfig", "assumption_notes",
           "check_formulation", "compile_function", "resolve_formulation"]

#: The KKT family's convergence: the relative stationarity residual ‖θ* − g‖² / ‖θ*‖² (x = 0 gives 1), logged with
#: the surrogate ReLU derivative the attack minimises (the "objective residual") and recorded for the final
#: candidates with the exact ReLU (``selection.relative_residual``, the "relative residual" the command line
#: prints), converged at most :data:`~datarecon.attacks.convergence.RESIDUAL_TOL`.
RESIDUAL_CONVERGENCE = ConvergenceRule(
    metric="rel_residual", label="objective residual (surrogate)", tol=RESIDUAL_TOL, final="relative_residual",
    final_label="relative residual",
    caption="the objective residual ‖θ* − g̃‖²/‖θ*‖², with the surrogate ReLU derivative the attack minimises, per "
            "logged step; the verdict judges the relative residual of the final candidates (exact ReLU)")


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
    convergence: ClassVar[ConvergenceRule] = RESIDUAL_CONVERGENCE
    #: the residual relative to ‖θ*‖² (or to the matched change): scale-free, so one tolerance fits every target
    early_stop_metric: ClassVar[str | None] = RESIDUAL_CONVERGENCE.metric
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

    def reference_settings(self) -> tuple[str, str | float]:
        """Where the gradients are taken (``theta-star`` or ``theta-init``) and the coefficient a of θ* − a·θ_init
        (``auto``, ``fit`` or a number) with a known initialisation. Default: θ*, ``auto``."""
        return "theta-star", "auto"

    def prepared(self, target: Target, prior: AttackerPrior | None = None) -> PreparedTarget:
        """The target prepared for this attack's steps (cached while the target object lives)."""
        known = prior.known_init if prior is not None else None
        key = (id(target), known.sha256 if known is not None else None)
        cached = self._cache.get(key)
        if cached is not None and cached.target is target:
            return cached
        c = self.config
        reference, setting = self.reference_settings()
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
