"""The attack interface: what an attack declares and the hooks of its step, and what a run returns.

An attack receives a :class:`~datarecon.attacks.target.Target` (architecture + θ*, loss, weight decay)
and an :class:`~datarecon.attacks.target.AttackerPrior` (candidate count m, labels, input shape and
value range); it never receives training images (:mod:`datarecon.attacks.target`). Every attack, built
in or a plug-in, subclasses :class:`Attack`, has a config of :class:`~datarecon.attacks.config.
AttackConfig`'s family and takes its steps through :meth:`Attack.step`: the hooks it overrides are
listed there, in the order the step calls them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, get_args

import torch
from pydantic import BaseModel

from datarecon.attacks.config import AttackConfig, config_dict
from datarecon.attacks.convergence import ConvergenceRule
from datarecon.attacks.grouped import CROSS_RUN_PRIORS, CoupledGroup
from datarecon.attacks.optim import apply_if_finite, committed_metrics, init_optimizer_state
from datarecon.attacks.priors import PriorInput, add_priors, weighted_priors
from datarecon.attacks.target import AttackerPrior, Target, check_weight_scale
from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions
from datarecon.kernel.status import Status
from datarecon.registry import Registry
from datarecon.utils.dtypes import torch_dtype

__all__ = ["ATTACKS", "ATTACK_LOOP", "Attack", "AttackConfig", "AttackSetup", "AttackerPrior", "DEFAULT_DIVERGENCE_HINT",
           "Gradients", "Reconstruction", "Target", "apply_if_finite", "check_attack", "check_weight_scale",
           "commit_update", "committed_metrics", "config_dict", "convergence_of"]

#: An attack run's loop settings by default: a history row every 10 steps, a checkpoint every 100
#: (and at the end), a progress display.
ATTACK_LOOP = LoopOptions(log_every=10, progress=True, checkpoint_every=100)

@dataclass(frozen=True)
class Reconstruction:
    """Result of an attack (fixed fields, whatever the options).

    Attributes:
        x: (m, C, H, W) candidates in model input space.
        labels: (m,) the labels used.
        multipliers: (m,) λ (ones/zeros where a method has none).
        history: list of per-logged-step metric dicts.
        scores: per-candidate attacker-side scores, name -> (m,) (higher = more trusted).
        summary: final loss terms and selection criteria (scalars).
        status: a :class:`~datarecon.kernel.status.Status` value ("complete", "diverged", "stopped-early",
            "running").
        steps_done: optimisation steps completed.
    """

    x: torch.Tensor
    labels: torch.Tensor
    multipliers: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    status: str = Status.COMPLETE
    steps_done: int = 0


@dataclass(frozen=True)
class AttackSetup:
    """What one attack run starts from: the attacker's view of the target, its prior, x₀ and its randomness.

    Attributes:
        target: the attacked model (θ*, architecture, loss, weight decay).
        prior: labels (m,), input shape and pixel box (model input space).
        x0: (m, C, H, W) initial candidates in model input space (:func:`datarecon.attacks.init.make_init`).
        generator: the run's seeded generator (the attack's own initial state, e.g. λ₀); its state
            is checkpointed with the run.
        record: what run.json records about the set-up besides the attack (e.g. the seed, the init
            name and parameters, m, the device).
    """

    target: Target
    prior: AttackerPrior
    x0: torch.Tensor
    generator: torch.Generator
    record: Mapping[str, Any] = field(default_factory=dict)



ATTACKS: Registry[type[Attack]] = Registry("attack method", check=lambda name, obj: check_attack(name, obj))

#: what a run's failure message tells the user to lower when an attack does not say (the default
#: step's one step size)
DEFAULT_DIVERGENCE_HINT = "lower the step size lr_x"


@dataclass
class Gradients:
    """A step's objective and its gradients, before the update: what :meth:`Attack.gradients` returns and
    :meth:`Attack.update` receives.

    Attributes:
        terms: the objective's scalar terms by name, the minimised total under ``loss`` (tensors or floats;
            after :meth:`Attack.step_gradients`: floats, the priors' values added).
        grads: ∂loss/∂v for each optimised variable v of the state (``x`` at least), shaped like it.
        context: what the attack's :meth:`Attack.update` needs from the gradient's computation beyond the
            gradients (bilevel: the inner solution and the linear solve); None for most attacks.
    """

    terms: dict[str, Any]
    grads: dict[str, torch.Tensor]
    context: Any = None


def commit_update(config: Any, state: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                  lrs: Mapping[str, float], metrics: dict[str, float]) -> dict[str, float]:
    """:func:`~datarecon.attacks.optim.apply_if_finite` with the optimiser of ``config`` (``optimizer``,
    ``optimizer_settings()``)."""
    return apply_if_finite(config.optimizer, config.optimizer_settings(), state, grads, lrs, metrics)


class Attack:
    """The attack interface: everything generic code (the runner, batching, the run record, the threat
    model, reports) needs from an attack is declared here, typed, with its default.

    A new attack subclasses it, sets ``name`` and ``config_cls`` (a subclass of :class:`AttackConfig`) and
    writes :meth:`objective`; registering it in :data:`ATTACKS` makes it a method of ``datarecon
    reconstruct``, run files, ``--runs K``, ``--resume`` and ``evaluate``.

    The step (:meth:`step`, the same for every attack) calls these hooks, in this order; an attack
    overrides the ones it needs and nothing else:

    1. :meth:`before_step` (state, index): a change of the state at the start of a step (the KKT
       attack's sample splitting; runs coupled by a cross-run prior take none). Default: none.
    2. :meth:`gradients` (target, prior, state) → :class:`Gradients`: the objective's terms and its
       gradient in every optimised variable. Default: autograd of :meth:`objective` (the candidates x and
       the attack's other variables, e.g. λ). An attack with a cheaper closed form (KKT), an unrolled
       simulation (dynamics) or an implicit gradient (bilevel) overrides it.
    3. the priors of :data:`~datarecon.attacks.priors.PRIORS` the config weighs, added to the terms and
       to the gradient in x by :func:`~datarecon.attacks.priors.add_priors` (all but :meth:`own_priors`
       and the cross-run ones, which a :class:`~datarecon.attacks.grouped.CoupledGroup` adds).
    4. :meth:`update` (state, gradients, index) → metrics: the optimiser of ``config.optimizer`` with
       :meth:`learning_rates` under the finiteness rule (:func:`~datarecon.attacks.optim.apply_if_finite`).
       Overridden where the update is another strategy (bilevel's line search, dynamics' signed gradient,
       KKT's projection onto the training subspace).

    The run's first state is :meth:`init_state`: :meth:`initial_variables` (x₀ and what the attack adds,
    its refusals first) and the optimiser's buffers of every variable :meth:`learning_rates` names.

    State: every mutable tensor of a run lives in one flat ``dict[str, Tensor]`` (at least ``"x"``
    (m, C, H, W), the optimiser's ``opt.*`` buffers and what the attack adds, e.g. its per-candidate
    weights, read through :meth:`multipliers`), so the runner checkpoints and restores it bit for bit.
    A step updates it in place and never applies a non-finite update.

    Class attributes:
        name: the registry key.
        config_cls: the frozen pydantic config, a subclass of :class:`AttackConfig` (saved in run.json and
            hashed for resume).
        uses: what the attack uses of the attacker's knowledge (items of
            :data:`datarecon.attacks.knowledge.KNOWLEDGE_ITEMS`; recorded in the threat model).
        requires: the knowledge a run must give (refused without it).
        divergence_hint: which settings the message of a diverged run tells the user to lower.
        resume_ignore: config fields that may differ when a run is resumed (``steps``: extend a run).
        subspace_candidates: the attack can keep its candidates in the training subspace
            (:meth:`uses_subspace`; run.json then records what it did).
        step_size_fields: the config's step sizes (float fields), scaled together by the step-size probe
            and a retry of a diverged run (:mod:`datarecon.attacks.probe`); empty: the attack is not probed.
        convergence: how its history says whether it converged (:class:`~datarecon.attacks.convergence.
            ConvergenceRule`: the metric, its label, an absolute tolerance or the relative rule, the
            run-record values that refine it); read by ``evaluate``, the report and the progress line.
        early_stop_metric: the step metric an early stop watches for a plateau (it must decrease as the
            attack progresses; None: the attack has none, and an early stop is refused). Usually the
            convergence metric.
        early_stop_reason: the stop reason a run stopped by that plateau records (run.json ``stop_reason``).
        progress_keys: the step metrics the progress line shows, in order (a key a step does not log is
            left out).
        progress_labels: how the progress line names a metric, where not by its key.
        one_candidate_per_image: the attack needs exactly one candidate per training image (dynamics
            matching replays the training on them), so its default m is n, not 2n.

    The declarations are checked when the attack is registered (:func:`check_attack`).
    """

    name: ClassVar[str] = ""
    config_cls: ClassVar[type[Any]] = AttackConfig
    uses: ClassVar[tuple[str, ...]] = ("weights",)
    requires: ClassVar[tuple[str, ...]] = ()
    divergence_hint: ClassVar[str] = DEFAULT_DIVERGENCE_HINT
    resume_ignore: ClassVar[tuple[str, ...]] = ("steps",)
    subspace_candidates: ClassVar[bool] = False
    step_size_fields: ClassVar[tuple[str, ...]] = ("lr_x",)
    convergence: ClassVar[ConvergenceRule] = ConvergenceRule()
    early_stop_metric: ClassVar[str | None] = "loss"
    early_stop_reason: ClassVar[str] = "stopped early: loss plateau"
    progress_keys: ClassVar[tuple[str, ...]] = ("loss", "box")
    progress_labels: ClassVar[Mapping[str, str]] = MappingProxyType({})
    one_candidate_per_image: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.config_cls()
        if not isinstance(self.config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}, "
                            f"got {type(self.config).__name__}")

    @classmethod
    def from_config(cls, config: Any) -> Attack:
        """Build the attack from its validated config (the ATTACKS registry's constructor)."""
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        """The attack's precision (``config.dtype``)."""
        return torch_dtype(self.config.dtype)

    @classmethod
    def described(cls) -> str:
        """How messages name the attack: its registry name and its class."""
        return f"attack {cls.name!r} ({cls.__module__}.{cls.__qualname__})"

    # -- what generic code asks ------------------------------------------------------------------

    def hashed_config(self, target: Target | None = None) -> dict[str, Any]:
        """The config fields that identify a run for resume: all but ``resume_ignore``. An attack whose
        fields resolve against the target (``formulation: auto``) hashes what they resolve to."""
        ignore = set(self.resume_ignore)
        return {k: v for k, v in config_dict(self.config).items() if k not in ignore}

    def uses_subspace(self, prior: AttackerPrior) -> bool:
        """Whether this run keeps its candidates in the prior's training subspace."""
        return False

    def batch_key(self, target: Target, prior: AttackerPrior) -> tuple[Any, ...] | None:
        """Runs with equal keys share one stacked step (:meth:`stacked_group`); None: stepped alone.
        By default runs are stepped alone unless a prior couples them (``group_weight`` > 0): then runs
        of one config form one :class:`~datarecon.attacks.grouped.CoupledGroup`."""
        if not self.coupled():
            return None
        return ("coupled", json.dumps(config_dict(self.config), sort_keys=True))

    def coupled(self) -> bool:
        """Whether the config weighs a prior that reads every run of a group (``group_weight`` > 0)."""
        return any(name in CROSS_RUN_PRIORS for name in weighted_priors(self.config))

    def stacked_group(self, runs: Mapping[int, Any]) -> Any:
        """The stacked step of runs with one :meth:`batch_key` (run index → opened run): an object with
        ``rows``, ``gradients(target)`` and ``commit(target, requests, ...)``
        (:mod:`datarecon.attacks.batched`). Only called when :meth:`batch_key` is not None; the default
        couples the runs' own steps (:meth:`step_gradients`, :meth:`update`) by the cross-run priors."""
        return CoupledGroup.of(runs)

    def labels(self, prior: AttackerPrior, device: torch.device) -> torch.Tensor:
        """The prior's labels (m,) on ``device``: floats in the attack's dtype, or int64 classes."""
        y = prior.labels.to(device)
        return y.to(self.dtype) if y.is_floating_point() else y.long()

    def bounds(self, prior: AttackerPrior, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The prior's pixel box (lower, upper) in the attack's dtype on ``device``."""
        return (torch.as_tensor(prior.lower, dtype=self.dtype, device=device),
                torch.as_tensor(prior.upper, dtype=self.dtype, device=device))

    # -- the run: the template (generic code calls these; an attack overrides the hooks below) --------

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The run's first state: :meth:`initial_variables` of x₀ (on the weights' device, in the attack's
        dtype) and the optimiser's zero buffers of every variable :meth:`learning_rates` names."""
        device = next(iter(target.params.values())).device
        x = x0.detach().to(device=device, dtype=self.dtype).clone()
        state = dict(self.initial_variables(target, prior, x=x, generator=generator))
        optimised = {k: state[k] for k in self.optimised(state)}
        if optimised:
            state.update({k: v.to(device) for k, v in init_optimizer_state(self.config.optimizer, optimised).items()})
        return state

    def optimised(self, state: Mapping[str, torch.Tensor]) -> list[str]:
        """The state's variables the optimiser steps (those :meth:`learning_rates` names that the state holds)."""
        return [k for k in self.learning_rates(0) if k in state]

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        """Step ``index`` (0-based) of a run: :meth:`before_step`, :meth:`step_gradients`, then :meth:`update`;
        the state changes in place, by finite updates only.

        Returns:
            The step's scalar metrics: the objective's terms, each prior's value, ``loss`` (the total) and
            what the update adds (gradient norms).
        """
        self.before_step(target, prior, state, index)
        return self.update(target, prior, state, self.step_gradients(target, prior, state), index)

    def step_gradients(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> Gradients:
        """The gradient half of :meth:`step`: :meth:`gradients` and the run's own priors
        (:func:`~datarecon.attacks.priors.add_priors`; all but :meth:`own_priors` and the cross-run ones,
        which a :class:`~datarecon.attacks.grouped.CoupledGroup` adds before each run's :meth:`update`); the
        terms become the step's float metrics. The state is not changed."""
        g = self.gradients(target, prior, state)
        x = state["x"].detach()
        given = PriorInput(x, *self.bounds(prior, x.device), target=target, labels=self.labels(prior, x.device),
                           public=prior.public)
        terms, g.grads["x"] = add_priors(self.config, given, dict(g.terms), g.grads["x"],
                                         skip=CROSS_RUN_PRIORS + self.own_priors(target, prior))
        g.terms = self.metrics_of(terms)
        return g

    def metrics_of(self, terms: Mapping[str, Any]) -> dict[str, float]:
        """The terms as float metrics.

        Raises:
            DataReconError: a term that is not one number (named with the attack).
        """
        metrics = {}
        for k, v in terms.items():
            try:
                metrics[k] = float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
            except (TypeError, ValueError, RuntimeError):
                shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                raise DataReconError(f"{self.described()}: its objective's term {k!r} is not one number "
                                     f"({shape}); return scalars") from None
        return metrics

    # -- hooks ---------------------------------------------------------------------------------------

    def initial_variables(self, target: Target, prior: AttackerPrior, *, x: torch.Tensor,
                          generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The run's variables at its start: ``x`` (x₀ cast to the attack's dtype and device) and what the
        attack adds (λ₀, a learned lr, an inner θ, ...; drawn with ``generator``). Refuses what cannot run
        first. Default: ``{"x": x}``."""
        return {"x": x}

    def learning_rates(self, index: int) -> dict[str, float]:
        """Each optimised variable's step size at step ``index`` (the variables the optimiser steps; an
        update strategy of its own may name none). Default: ``{"x": lr_x}``."""
        return {"x": self.config.lr_x}

    def before_step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], index: int) -> None:
        """A change of the state at the start of step ``index``, before its gradient. Default: none."""

    def objective(self, target: Target, prior: AttackerPrior, x: torch.Tensor,
                  **variables: torch.Tensor) -> Mapping[str, torch.Tensor]:
        """The attack's objective at the candidates x (m, C, H, W), differentiable in x and in the attack's
        other optimised ``variables`` (by state name, e.g. ``lambda``): a mapping of scalar terms with the
        minimised total under ``"loss"`` (the priors are added by the step)."""
        raise NotImplementedError(f"{self.described()} must define objective() or gradients()")

    def gradients(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> Gradients:
        """The objective's terms and its gradient in every optimised variable (the state is not changed).
        Default: autograd of :meth:`objective`.

        Raises:
            DataReconError: an objective without a scalar ``loss``, or one that does not depend on the
                variables (a constant), named with the attack.
        """
        names = ["x", *(k for k in self.optimised(state) if k != "x")]
        leaves = {k: state[k].detach().requires_grad_(True) for k in names}
        terms = self.objective(target, prior, leaves["x"], **{k: leaves[k] for k in names[1:]})
        loss = self._loss_of(terms)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        missing = [k for k, g in zip(names, grads) if g is None]
        if missing:
            raise DataReconError(f"{self.described()}: its objective's 'loss' does not depend on {', '.join(missing)}; "
                                 "compute it from the candidates (and every variable the attack steps)")
        # an expanded gradient (the loss a plain sum of x) shares memory between elements: the priors add in place
        return Gradients(dict(terms), {k: g.contiguous() for k, g in zip(names, grads)})

    def _loss_of(self, terms: Any) -> torch.Tensor:
        """The ``loss`` of an objective's terms, checked: a scalar tensor that requires a gradient."""
        if not isinstance(terms, Mapping) or "loss" not in terms:
            got = f"the keys {sorted(map(str, terms))}" if isinstance(terms, Mapping) else f"a {type(terms).__name__}"
            raise DataReconError(f"{self.described()}: objective() must return a mapping with the minimised total "
                                 f"under 'loss'; it returned {got}")
        loss = terms["loss"]
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise DataReconError(f"{self.described()}: its objective's 'loss' must be a scalar tensor, got {what}")
        if not loss.is_floating_point():  # a complex or integer loss has no minimum to step towards
            raise DataReconError(f"{self.described()}: its objective's 'loss' must be a real floating-point tensor, "
                                 f"got {str(loss.dtype).removeprefix('torch.')}")
        if not loss.requires_grad:
            raise DataReconError(f"{self.described()}: its objective's 'loss' does not depend on the candidates x "
                                 "(a constant has no gradient); compute it from x")
        return loss.reshape(())

    def own_priors(self, target: Target, prior: AttackerPrior) -> tuple[str, ...]:
        """Priors of :data:`~datarecon.attacks.priors.PRIORS` that the attack's objective already holds in
        another form (the step does not add them again). Default: none."""
        return ()

    def update(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], g: Gradients,
               index: int) -> dict[str, float]:
        """The update of step ``index`` from its gradients (``g.terms`` are its float metrics): the optimiser
        of ``config.optimizer`` with :meth:`learning_rates`, applied only when finite; returns the step's
        metrics (gradient norms added, or ``update`` NaN when refused)."""
        return commit_update(self.config, state, g.grads, self.learning_rates(index), g.terms)

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(per-candidate attacker-side scores name → (m,), summary): the summary may hold
        ``selection`` (criterion → {"value": ...}) and ``extra`` (method-specific). Default: none."""
        return {}, {}

    def multipliers(self, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """(m,) the candidates' weights in the reconstruction (``Reconstruction.multipliers``). Default:
        ones; an attack that learns a weight per candidate (the KKT family's λ) returns it."""
        return torch.ones(prior.m, dtype=state["x"].dtype, device=state["x"].device)


def _float_field(config_cls: type[BaseModel], name: str) -> bool:
    """Whether the config field ``name`` holds a float (not an integer or a flag) with a number as default."""
    info = config_cls.model_fields[name]
    kinds = get_args(info.annotation) or (info.annotation,)
    return float in kinds and int not in kinds and bool not in kinds and isinstance(info.default, float)


def check_attack(name: str, obj: object) -> str:
    """Why ``obj`` cannot be the attack ``name`` ("" when it can): the :data:`ATTACKS` registry's check of
    every attack it takes, built in or a plug-in (its class and config, its step sizes, its declarations)."""
    if not (isinstance(obj, type) and issubclass(obj, Attack)):
        return f"{obj!r} is not a subclass of datarecon.attacks.base.Attack"
    if obj.name != name:
        return f"its class declares name = {obj.name!r}; register it as {obj.name!r}"
    config = obj.config_cls
    if not (isinstance(config, type) and issubclass(config, AttackConfig)):
        return (f"its config_cls {getattr(config, '__name__', config)!r} is not a subclass of "
                "datarecon.attacks.base.AttackConfig (the fields every attack has); derive it from AttackConfig")
    for f in obj.step_size_fields:
        if f not in config.model_fields:
            return (f"step_size_fields names {f!r}, which its config {config.__name__} does not have; name float "
                    f"fields of it (e.g. lr_x)")
        if not _float_field(config, f):
            return (f"step_size_fields names {f!r}, which is not a float field of {config.__name__} (the probe and a "
                    "retry multiply step sizes by 0.1); name float step sizes only")
    if not isinstance(obj.convergence, ConvergenceRule):
        return "its convergence is not a datarecon.attacks.convergence.ConvergenceRule"
    metric = obj.early_stop_metric
    if metric is not None and not (isinstance(metric, str) and metric):
        return f"early_stop_metric must be a metric name or None, got {metric!r}"
    return ""


def convergence_of(method: Any) -> ConvergenceRule:
    """The convergence rule of the attack ``method`` (a run.json's ``method``); the default rule (a loss)
    for a method this installation does not know (an uninstalled plug-in, a pool of runs)."""
    return ATTACKS.get(method).convergence if isinstance(method, str) and method in ATTACKS else ConvergenceRule()
