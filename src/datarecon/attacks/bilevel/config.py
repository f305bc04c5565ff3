"""The bilevel attack's config and its treatment of targets with kinks (Runkel et al. 2024).

:class:`BilevelConfig` is an :class:`~datarecon.attacks.config.AttackConfig` (the fields every attack has)
with bilevel's defaults (200 steps, the problem-derived step, float64) and the settings of its inner
solve, linear solve and line search; :class:`KinkTreatment` the resolved settings for a target with or
without kinks (:data:`SMOOTH`, :data:`NONSMOOTH`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from datarecon.attacks.bilevel.hypergrad import HypergradientSettings
from datarecon.attacks.bilevel.lbfgs import LINE_SEARCHES, LBFGSSettings
from datarecon.attacks.bilevel.linear_solve import LINEAR_SOLVERS, SolveOptions
from datarecon.attacks.bilevel.problem import CURVATURES, INNER_ACTIVATIONS, THETA0, UPPER_LOSSES
from datarecon.attacks.config import OPTIMIZER_FIELDS, AttackConfig
from datarecon.config import MAX_STEPS
from datarecon.errors import DataReconError
from datarecon.registry import registered

__all__ = ["NONSMOOTH", "SMOOTH", "BilevelConfig", "KinkTreatment"]


@dataclass(frozen=True)
class KinkTreatment:
    """How the attack treats a target whose energy has kinks (ReLU): the resolved settings.

    Attributes:
        curvature: ``CURVATURES`` name of the matrix the linear solve inverts.
        damping: μ of (matrix + μI).
        inner_activation: ``INNER_ACTIVATIONS`` name of the inner energy's activation.
        max_step: cap on one problem-derived step on x, ‖Δx‖ ≤ max_step·‖x‖ (inf: no cap).
    """

    curvature: str
    damping: float
    inner_activation: str
    max_step: float = math.inf


#: Settings for targets without kinks (affine, tanh, ...): the implicit function theorem as written;
#: no cap on the outer step (the Armijo test alone keeps it where the hypergradient describes l; a
#: 1 % cap made the README's affine partition run end at 4e-7 instead of 2e-9 after 50 steps).
SMOOTH = KinkTreatment(curvature="hessian", damping=0.0, inner_activation="target")
#: Settings for targets with kinks, chosen by the descent-rate measurement of docs/PERFORMANCE.md
#: §5 (``benchmarks/bench_bilevel_relu.py``): the rate at which a small step along the negative
#: hypergradient lowers the true ‖θ* − θ(x)‖² with the inner problem re-solved. On the small
#: runkel2024 one-hidden target (width 256) damped CG with μ = 0.1 had the best median rate
#: (0.98–1.00 of the best treatment's, median over points); μ = 0.01 and 1, Gauss–Newton and a
#: softplus₅ inner energy with Gauss–Newton came within 1–13 %, the paper's qn within 13–21 %; the
#: undamped Hessian (negative curvature) reached −0.08–0.09, a random direction ≈ 0. The same
#: measurement found the rate at a move of 1 % of ‖x‖ still 55–77 % of the rate at 0.1 %, so one
#: outer step moves x by at most 1 % of ‖x‖ (docs/PERFORMANCE.md §5.5 measures what larger Polyak
#: trials cost: line-search rejections, each an inner re-solve).
NONSMOOTH = KinkTreatment(curvature="hessian", damping=0.1, inner_activation="target", max_step=0.01)


class BilevelConfig(AttackConfig):
    """Hyper-parameters of the bilevel attack (frozen; one-to-one with a config file): the fields of every attack
    (:class:`~datarecon.attacks.config.AttackConfig`, with bilevel's defaults) and its own.

    Attributes:
        steps: outer steps.
        lr_x: step size η on x. None (default): chosen from the problem at every step — the
            Polyak step η = l(x)/‖∇_x l‖² (the upper loss l = ‖θ* − θ(x)‖² has the known lower
            bound 0), at most ``ls_grow`` × the last accepted step and at most a move of
            ``max_step`` × ‖x‖, then halved until the Armijo condition
            l(x − η∇l) ≤ l(x) − ``ls_c1``·η‖∇l‖² holds with the inner problem re-solved at the
            trial point (at most ``ls_max_trials`` trials; after a failed first trial the reference
            l is re-solved at x with the same budget; none accepted: x stays). An
            attacker-side rule: it uses θ*, never the training data. A number: that fixed step
            with ``optimizer``.
        optimizer: ``datarecon.attacks.optim.OPTIMIZERS`` name ("sgd", "adam"), used with a fixed
            ``lr_x``. METHODS §7: Adam moves even a ground-truth initialisation; plain gradient
            steps keep it in place.
        momentum: SGD momentum (0: plain gradient descent), with a fixed ``lr_x``.
        ls_c1: Armijo constant of the problem-derived step (``lr_x`` None): 0.25 accepts a step
            only if l falls by at least a quarter of what the first-order model predicts (a
            trust-region ratio test), so steps stay where the hypergradient describes l.
        ls_grow: the problem-derived step is at most this many times the last accepted one (``lr_x`` None).
        ls_max_trials: halvings of the problem-derived step tried before x stays put (``lr_x`` None).
        max_step: cap on one problem-derived step, ‖Δx‖ ≤ max_step·‖x‖ (Frobenius norm over
            all candidates). None (default): no cap for smooth targets, ``NONSMOOTH.max_step``
            (1 %) for targets with kinks: larger moves leave the region the hypergradient describes
            (the descent-rate measurement, docs/PERFORMANCE.md §5.4).
        hessian: inverse-Hessian strategy (``LINEAR_SOLVERS``: "cg", "pcg", "neumann", "qn").
            Default "cg", warm-started: fewest Hessian-vector products and least time to a relative
            residual of 1e-6 (``benchmarks/bench_bilevel_solvers.py``, docs/PERFORMANCE.md §5);
            "qn" is the paper's two-loop recursion (no solve, a rough hypergradient).
        solve_tol: relative-residual tolerance of the linear solve (every strategy reports its
            residual against it).
        solve_max_iter: cg / pcg iteration cap.
        neumann_max_terms: cap on the Neumann terms.
        neumann_alpha: fixed Neumann step α; None (default): 1/λ̂_max from a power iteration
            warm-started from the previous outer step's vector.
        power_iters: power-iteration products per λ_max estimate (neumann).
        curvature: matrix the linear solve inverts (``CURVATURES``: "hessian", "gauss-newton"), or
            "auto" (default): "hessian" for smooth targets, ``NONSMOOTH.curvature`` for targets
            with kinks (ReLU).
        damping: μ, solve (matrix + μI) p = ∇l (cg, pcg, neumann); biases the hypergradient when
            > 0. None (default): 0 for smooth targets, ``NONSMOOTH.damping`` for targets with kinks.
        inner_activation: activation of the inner energy (``INNER_ACTIVATIONS``: "target",
            "softplus") or "auto" (default): "target" for smooth targets,
            ``NONSMOOTH.inner_activation`` for targets with kinks.
        softplus_beta: β of the softplus surrogate (inner_activation "softplus").
        warm_start_p: start the linear solve from the previous p.
        inner_tol: inner L-BFGS stops at ‖∇_θE‖₂ ≤ inner_tol (with ``inner_tol_schedule``
            "distance": the floor of the schedule).
        inner_tol_schedule: "fixed" (``inner_tol`` at every step) or "distance": tie the inner
            tolerance to outer progress, tol_k = clip(inner_tol_factor · wd · ‖θ* − θ_{k−1}‖,
            inner_tol, inner_tol_max). E is wd-strongly convex for affine targets, so the inner error
            ‖θ̂ − θ(x)‖ ≤ tol/wd stays below inner_tol_factor × the current distance: no accuracy is
            spent on θ(x) while x is still far from a solution. Not for targets with kinks with the
            problem-derived step (warned): the inner residual stalls near the loose tolerance, trial
            points are then not re-solved and the line search is blind (docs/PERFORMANCE.md §5.6).
        inner_tol_factor, inner_tol_max: of the "distance" schedule.
        inner_max_iter: inner iteration cap per inner solve (per outer step, and per line-search
            trial).
        inner_max_iter_first: cap for the first inner solve (from θ⁰).
        lbfgs_history: curvature pairs kept (inner model, "qn" strategy, "pcg" preconditioner).
        line_search: inner ``LINE_SEARCHES`` name ("strong-wolfe", "armijo").
        theta0: first inner iterate (``THETA0``: "uniform" U(0,1) as in the paper, "target", "default").
        upper_loss: ``UPPER_LOSSES`` name ("sq" = ‖θ* − θ‖², "normalised").
        weight_decay_override: weight decay of the lower-level energy instead of the target's
            (required for logistic / cross-entropy targets trained without weight decay).
        box_weight: weight of the pixel-box prior Σ relu(x − upper)² + relu(lower − x)² (default 0: off); the
            other priors of every attack (``feature_stats_weight``; ``group_weight`` with a fixed ``lr_x``) are
            added to the upper loss and its gradient, and the line search weighs them at every trial point.
        dtype: float32 | float64 of the attack (θ*, θ, x and all solves).
    """

    #: the fields of AttackConfig bilevel did not have: left out of dumps at their default (config hashes kept)
    added_fields: ClassVar[tuple[str, ...]] = ("nesterov", "adam_beta1", "adam_beta2", "adam_eps")

    steps: int = Field(default=200, ge=0, le=MAX_STEPS)
    lr_x: float | None = Field(default=None, gt=0)
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0)
    ls_c1: float = Field(default=0.25, gt=0, lt=1)
    ls_grow: float = Field(default=4.0, ge=1)
    max_step: float | None = Field(default=None, gt=0)
    ls_max_trials: int = Field(default=8, ge=1)
    hessian: Annotated[str, registered(LINEAR_SOLVERS)] = "cg"
    solve_tol: float = Field(default=1e-6, gt=0)
    solve_max_iter: int = Field(default=100, ge=1)
    neumann_max_terms: int = Field(default=5000, ge=1)
    neumann_alpha: float | None = Field(default=None, gt=0)
    power_iters: int = Field(default=10, ge=1)
    curvature: str = "auto"
    damping: float | None = Field(default=None, ge=0)
    inner_activation: str = "auto"
    softplus_beta: float = Field(default=20.0, gt=0)
    warm_start_p: bool = True
    inner_tol: float = Field(default=1e-6, gt=0)
    inner_tol_schedule: Literal["fixed", "distance"] = "fixed"
    inner_tol_factor: float = Field(default=0.1, gt=0)
    inner_tol_max: float = Field(default=1e-2, gt=0)
    inner_max_iter: int = Field(default=50, ge=0)
    inner_max_iter_first: int = Field(default=1000, ge=0)
    lbfgs_history: int = Field(default=10, ge=0)
    line_search: Annotated[str, registered(LINE_SEARCHES)] = "strong-wolfe"
    theta0: Annotated[str, registered(THETA0)] = "uniform"
    upper_loss: Annotated[str, registered(UPPER_LOSSES)] = "sq"
    weight_decay_override: float | None = Field(default=None, ge=0)
    box_weight: float = Field(default=0.0, ge=0)
    dtype: Literal["float32", "float64"] = "float64"

    @field_validator("curvature")
    @classmethod
    def _curvature(cls, v: str) -> str:
        if v != "auto":
            CURVATURES.get(v)  # raises, listing the valid names
        return v

    @field_validator("inner_activation")
    @classmethod
    def _activation(cls, v: str) -> str:
        if v != "auto":
            INNER_ACTIVATIONS.get(v)
        return v

    @model_validator(mode="after")
    def _fixed_step_options(self) -> BilevelConfig:
        fields = type(self).model_fields
        changed = [f for f in ("optimizer", *OPTIMIZER_FIELDS) if getattr(self, f) != fields[f].default]
        if self.lr_x is None and changed:
            raise DataReconError(
                f"{changed[0]} {getattr(self, changed[0])} sets the optimiser of a fixed step, so it needs a fixed step "
                f"on x; pass lr_x (--lr-x), or drop {changed[0]} to keep the problem-derived step (a line search)")
        if self.lr_x is None and self.group_weight > 0:
            raise DataReconError(
                "group consistency (group_weight) pulls the runs together step by step, and bilevel's problem-derived "
                "step (a line search) searches one run's own objective, which does not hold it: pass a fixed step "
                "(--lr-x), or drop --group-weight")
        return self

    def solve_options(self, damping: float) -> SolveOptions:
        """The linear solve's options with the resolved damping μ."""
        return SolveOptions(tol=self.solve_tol, max_iter=self.solve_max_iter, damping=damping,
                            neumann_max_terms=self.neumann_max_terms, neumann_alpha=self.neumann_alpha,
                            power_iters=self.power_iters, warm_start=self.warm_start_p)

    def hypergradient_settings(self, treatment: KinkTreatment) -> HypergradientSettings:
        """The hypergradient's upper loss, strategy, solve options and curvature for a resolved treatment."""
        return HypergradientSettings(upper=self.upper_loss, strategy=self.hessian,
                                     options=self.solve_options(treatment.damping), curvature=treatment.curvature)

    def lbfgs_settings(self) -> LBFGSSettings:
        """The inner L-BFGS's line search (its constants at their defaults)."""
        return LBFGSSettings(line_search=self.line_search)

    def treatment(self, *, kinks: bool) -> KinkTreatment:
        """The curvature, damping, inner activation and step cap for a target with or without kinks."""
        base = NONSMOOTH if kinks else SMOOTH
        return KinkTreatment(
            curvature=base.curvature if self.curvature == "auto" else self.curvature,
            damping=base.damping if self.damping is None else float(self.damping),
            inner_activation=base.inner_activation if self.inner_activation == "auto" else self.inner_activation,
            max_step=base.max_step if self.max_step is None else float(self.max_step))
