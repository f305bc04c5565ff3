"""Dynamics matching (SimuDy, Tian et al., ICLR 2025): reconstruct the training set by replaying its training.

Dummy data x (m = n candidates with the prior's labels) are trained from the known θ_init with the
known recipe, by the very step that trained the target (:func:`datarecon.kernel.step.train_step`,
differentiable with ``create_graph=True``), and optimised so that the simulated parameter change
points where the real one does:

    L(x, η) = 1 − cos(θ_T(x, η) − θ_init, θ* − θ_init) + w_TV·TV(x)/|x| + w_box·box(x),

or, with ``objective: distance``, ‖θ_T(x, η) − θ*‖² / ‖θ* − θ_init‖² in place of 1 − cos: the relative
squared distance, which also matches the size of the change (the cosine is scale-free). Where the
learning rate is known the size is information the attacker has: candidates whose simulated change
points the right way but is 1.5 times too long (less confident predictions) are wrong.

θ_T(x, η) = T steps of gradient descent (mini-batch SGD in the recipe's batch order) from θ_init on
(x, y). The learning rate η is the recorded one, or, when the attacker does not know it
(``knowledge.recipe.unknown: [lr]``), learned: log η is part of the state and stepped with x. The
batch order is the recorded one (it is drawn from the training seed,
:func:`datarecon.kernel.step.batch_order`) or, unknown, the attack's own seeded order.

Memory: backpropagating through T unrolled steps keeps T double-backward graphs. With
``segment`` k > 0 only the states at every k-th step are kept and the backward pass recomputes
the segments one at a time, last first, passing the adjoint back through each (a reverse sweep,
:class:`_RecomputedUnroll`): one segment's graph is alive at a time. The two give the same
gradient (tested). The memory of a run is estimated before any work and refused when it would
not fit (:func:`memory_estimate`).

References:
    Tian et al. (2025), "Simulating Training Dynamics to Reconstruct Training Data from Deep Neural
    Networks", ICLR (eq. 3: cosine on the parameter change + TV; learnable learning rate).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from datarecon.attacks.base import Attack, AttackConfig, AttackerPrior, Gradients, Target
from datarecon.attacks.knowledge import KnownRecipe
from datarecon.attacks.optim import OPTIMIZERS, apply_if_finite
from datarecon.config import MAX_STEPS
from datarecon.errors import DataReconError
from datarecon.registry import registered
from datarecon.kernel.losses import loss_name
from datarecon.kernel.step import (
    TrainingRecipe,
    batch_norm_modules,
    batch_order,
    normalisation_stats,
    replay_step,
)
from datarecon.utils.memory import device_memory_bytes, refuse_if_too_large

__all__ = ["DynamicsAttack", "DynamicsConfig", "Schedule", "memory_estimate", "simulate", "simulate_state",
           "statistics_distance"]


class DynamicsConfig(AttackConfig):
    """Dynamics matching: the fields of every attack (:class:`~datarecon.attacks.config.AttackConfig`; Adam by
    default) and its own.

    Attributes:
        steps: outer optimisation steps (each one simulated training and its backward).
        lr_x: step of the candidates (Adam's by default); lr_lr: step of log η when η is learned.
        optimizer: ``adam`` (default; SimuDy's) or another of :data:`~datarecon.attacks.optim.OPTIMIZERS`, for x
            and log η.
        lr_init: the starting η when the attacker does not know it.
        epochs: epochs simulated (None: the recorded epochs, the whole training; fewer: a
            truncated simulation, cheaper, matched by direction only).
        segment: simulated steps per recomputed segment (0: keep the whole unrolled graph; None:
            0 when the estimate of the whole unroll fits in half the machine's memory, else ⌈√T⌉).
        objective: ``cosine`` (SimuDy's 1 − cos of the parameter changes) or ``distance`` (the relative squared
            distance ‖θ_T − θ*‖² / ‖θ* − θ_init‖², which matches the change's size as well).
        lr_schedule: step of x: ``constant``; ``step`` (× 0.1 at 3/8, 5/8 and 7/8 of ``steps``, the
            schedule of Geiping et al. 2020's gradient inversion); or ``cosine`` (SimuDy's: torch's
            ``CosineAnnealingLR`` stepped every outer step, lr_x · (1 + cos(π·i / cosine_t_max)) / 2 at step i,
            periodic with period 2·cosine_t_max, down to 0 at odd multiples of cosine_t_max).
        cosine_t_max: T_max of the cosine schedule in outer steps (SimuDy's reference: 100), >= 1; set only
            with ``lr_schedule: cosine``.
        signed: the optimiser on the sign of x's gradient (Geiping et al. 2020's "signed" gradient inversion;
            robust to the gradient's scale, which spans orders of magnitude between runs and layers).
        tv_weight: weight of the total variation per pixel (a natural-image prior, :data:`~datarecon.attacks.
            priors.PRIORS` ``tv``).
        adam_beta1, adam_beta2, adam_eps: Adam's constants (SimuDy's reference uses β = (0.8, 0.9)).
        dtype: float32 | float64 (the recipe replays bit for bit in the dtype the target trained in).
    """

    #: added after runs were recorded (the optimiser fields with the move to AttackConfig): left out at their default
    added_fields: ClassVar[tuple[str, ...]] = ("objective", "lr_schedule", "signed", "optimizer", "momentum",
                                               "nesterov", "cosine_t_max")

    steps: int = Field(default=500, ge=0, le=MAX_STEPS, description="optimisation steps")
    lr_x: float = Field(default=0.01, gt=0, description="step of the candidates x (Adam's by default)")
    optimizer: Annotated[str, registered(OPTIMIZERS)] = Field(default="adam", description="key of "
                                                              "attacks.optim.OPTIMIZERS (x and log lr)")
    lr_lr: float = Field(default=0.01, gt=0, description="step of log lr when the lr is learned")
    lr_init: float = Field(default=0.01, gt=0, description="starting lr when the recipe's lr is unknown")
    epochs: int | None = Field(default=None, ge=1, description="epochs simulated (default: the recorded ones)")
    segment: int | None = Field(default=None, ge=0, description="simulated steps per recomputed segment (0: no "
                                "recompute; default: none when the whole unroll fits in half the memory, else √T)")
    tv_weight: float = Field(default=0.0, ge=0, description="weight of the mean total variation")
    objective: Literal["cosine", "distance"] = Field(default="cosine", description="cosine (SimuDy: 1 - cos of the "
                                                     "parameter changes) or distance (relative squared distance to θ*)")
    lr_schedule: Literal["constant", "step", "cosine"] = Field(default="constant", description="constant; step: lr_x "
                                                               "× 0.1 at 3/8, 5/8 and 7/8 of the steps; cosine: "
                                                               "annealed with period 2·cosine_t_max (SimuDy)")
    cosine_t_max: int = Field(default=100, ge=1, le=MAX_STEPS, description="T_max of the cosine schedule (outer "
                              "steps; period 2·T_max)")
    signed: bool = Field(default=False, description="the optimiser on the sign of the candidates' gradient")

    @model_validator(mode="after")
    def _t_max_needs_the_cosine(self) -> DynamicsConfig:
        """Refuse ``cosine_t_max`` away from its default under another schedule (it would change nothing)."""
        if self.lr_schedule != "cosine" and self.cosine_t_max != type(self).model_fields["cosine_t_max"].default:
            raise DataReconError(f"cosine_t_max {self.cosine_t_max} is the period of the cosine schedule and this run's "
                                 f"lr_schedule is {self.lr_schedule!r}: pass --lr-schedule cosine, or drop cosine_t_max")
        return self

    def lr_x_at(self, index: int) -> float:
        """The Adam step of x at outer step ``index`` (0-based) under :attr:`lr_schedule`."""
        if self.lr_schedule == "constant":
            return self.lr_x
        if self.lr_schedule == "cosine":  # torch's CosineAnnealingLR (eta_min 0) in closed form
            return self.lr_x * (1.0 + math.cos(math.pi * index / self.cosine_t_max)) / 2.0
        passed = sum(index >= self.steps * k / 8 for k in (3, 5, 7))
        return self.lr_x * 0.1 ** passed


def statistics_distance(stats: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Σ over batch-norm layers of ‖μ − μ_ref‖₂ + ‖σ² − σ²_ref‖₂ (the running means and variances by buffer
    name; the feature-statistics prior's form, here between the statistics a replay produces and the
    model's)."""
    names = sorted(k for k in stats if k.endswith(("running_mean", "running_var")))
    total = next(iter(stats.values())).new_zeros(())
    for name in names:
        total = total + (stats[name] - reference[name]).norm()
    return total


def _flat(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in params.values()])


@dataclass(frozen=True)
class Schedule:
    """The simulated training: the step's recipe, the learning rate and the batches of every step.

    Attributes:
        recipe: loss, weight decay, momentum of :func:`datarecon.kernel.step.train_step`.
        lr: η (a tensor keeps θ_T differentiable in it).
        batches: the index tensors of every step, in order (:func:`datarecon.kernel.step.batch_order`).
        stats: batch norm's running statistics by name, constants of every step (eval mode; None: the
            model's own buffers; a network without batch norm has none).
    """

    recipe: TrainingRecipe
    lr: float | torch.Tensor
    batches: list[torch.Tensor]
    stats: Mapping[str, torch.Tensor] | None = None

    @classmethod
    def replay(cls, recipe: TrainingRecipe, lr: float | torch.Tensor, *, n: int, batch_size: int, epochs: int,
               order_seed: int, stats: Mapping[str, torch.Tensor] | None = None) -> Schedule:
        """``epochs`` epochs of ⌈n/b⌉ steps in the order the seed draws (as ``datarecon train`` does)."""
        return cls(recipe, lr, [idx for e in range(epochs)
                                for idx in batch_order(n, batch_size, seed=order_seed, epoch=e)], stats)


def _stat_names(schedule: Schedule) -> list[str]:
    """The running statistics a replay carries in its state: all of them in train mode (they move with every
    step), none in eval mode (constants of the schedule)."""
    return sorted(schedule.stats or {}) if schedule.recipe.norm_mode == "train" else []


def _segment(model: nn.Module, names: list[str], part: Schedule, x: torch.Tensor, y: torch.Tensor,
             differentiable: bool, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The steps of ``part`` from the state ``flat`` (parameters, then the momentum buffers with momentum,
    then the running statistics in train mode, :func:`_stat_names`); returns the new state (with the
    graph of every step when ``differentiable``, else detached leaves)."""
    k, momentum, stat_names = len(names), bool(part.recipe.momentum), _stat_names(part)
    params = dict(zip(names, flat[:k]))
    buffers = dict(zip(names, flat[k:2 * k])) if momentum else None
    stats = dict(zip(stat_names, flat[len(flat) - len(stat_names):])) if stat_names else part.stats
    for idx in part.batches:
        out = replay_step(model, params, (x[idx], y[idx]), part.recipe, lr=part.lr, buffers=buffers,
                          create_graph=differentiable, stats=stats)
        params, buffers = out.params, out.buffers if momentum else None
        stats = out.stats if stat_names else stats
        if not differentiable:
            params = {n: v.detach().requires_grad_(True) for n, v in params.items()}
            buffers = {n: v.detach() for n, v in buffers.items()} if buffers is not None else None
            stats = {n: v.detach() for n, v in stats.items()} if stat_names else stats
    return (tuple(params[n] for n in names) + (tuple(buffers[n] for n in names) if momentum else ())
            + tuple(stats[n] for n in stat_names))


class _RecomputedUnroll(torch.autograd.Function):
    """θ_T keeping only the states at segment boundaries; the backward pass recomputes one segment at a
    time, last first, and backpropagates the adjoint through it (a reverse sweep), so at most one
    segment's double-backward graph is alive at any moment.

    Inputs: (replay = (model, names, schedule, y, segment), x, lr or None, *state₀); outputs: the
    state at T (parameters, then momentum buffers). Differentiable once, in x, the lr tensor and state₀.
    """

    @staticmethod
    def forward(ctx, replay, x, lr, *state):  # type: ignore[override]
        model, names, schedule, y, segment = replay
        k = len(names)
        step_lr = schedule.lr if lr is None else lr.detach()
        steps = schedule.batches
        bounds = []
        current = tuple(v.detach() for v in state)
        with torch.enable_grad():
            for start in range(0, len(steps), segment):
                bounds.append((start, current))
                part = dataclasses.replace(schedule, batches=steps[start:start + segment], lr=step_lr)
                leaves = tuple(v.requires_grad_(True) if i < k else v for i, v in enumerate(current))
                current = tuple(v.detach() for v in _segment(model, names, part, x.detach(), y, False, *leaves))
        ctx.model, ctx.names, ctx.schedule, ctx.y, ctx.segment, ctx.bounds = model, names, schedule, y, segment, bounds
        ctx.x, ctx.lr = x.detach(), None if lr is None else lr.detach()
        return current

    @staticmethod
    def backward(ctx, *adjoint):  # type: ignore[override]
        gx = torch.zeros_like(ctx.x)
        glr = None if ctx.lr is None else torch.zeros_like(ctx.lr)
        steps = ctx.schedule.batches
        for start, state in reversed(ctx.bounds):
            with torch.enable_grad():
                leaves = tuple(v.detach().requires_grad_(True) for v in state)
                xs = ctx.x.detach().requires_grad_(True)
                lr = ctx.schedule.lr if ctx.lr is None else ctx.lr.detach().requires_grad_(True)
                part = dataclasses.replace(ctx.schedule, batches=steps[start:start + ctx.segment], lr=lr)
                out = _segment(ctx.model, ctx.names, part, xs, ctx.y, True, *leaves)
                inputs = [*leaves, xs] + ([lr] if ctx.lr is not None else [])
                grads = torch.autograd.grad(out, inputs, grad_outputs=adjoint, allow_unused=True)
            adjoint = tuple(torch.zeros_like(v) if g is None else g for g, v in zip(grads[:len(leaves)], leaves))
            if grads[len(leaves)] is not None:
                gx += grads[len(leaves)]
            if glr is not None and grads[-1] is not None:
                glr += grads[-1]
        return (None, gx, glr, *adjoint)


def simulate(model: nn.Module, theta_init: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             schedule: Schedule, *, segment: int = 0, differentiable: bool = True) -> dict[str, torch.Tensor]:
    """θ_T: the parameters of :func:`simulate_state`."""
    return simulate_state(model, theta_init, x, y, schedule, segment=segment, differentiable=differentiable)[0]


def simulate_state(model: nn.Module, theta_init: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                   schedule: Schedule, *, segment: int = 0, differentiable: bool = True
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """θ_T and the running statistics at T: the training of ``model`` from ``theta_init`` on (x, y), step by
    step as ``datarecon train`` does (batch norm in the recipe's ``norm_mode``; in train mode the
    statistics start at ``schedule.stats`` and move with every step, :func:`~datarecon.kernel.step.replay_step`).

    Args:
        model: the architecture (its own parameters are not read).
        theta_init: name → θ_init.
        x: (n, *input_shape) inputs (model input space); y: (n,) labels.
        schedule: the recipe, learning rate and batches (:meth:`Schedule.replay`).
        segment: with ``differentiable``, keep only every ``segment``-th state and recompute the
            segments one at a time in the backward pass (:class:`_RecomputedUnroll`); 0: keep the
            whole unrolled graph.
        differentiable: keep the graph (θ_T differentiable in x and a tensor lr); False: values only.

    Returns:
        (name → θ_T, name → running statistics at T: the given ones in eval mode, {} without batch norm).
    """
    names = list(theta_init)
    k = len(names)
    stat_names = _stat_names(schedule)
    state = tuple(v.detach() for v in theta_init.values())
    if schedule.recipe.momentum:
        state = state + tuple(torch.zeros_like(v) for v in theta_init.values())
    state = state + tuple(schedule.stats[n].detach() for n in stat_names)  # type: ignore[index]
    if segment and differentiable:
        lr = schedule.lr if isinstance(schedule.lr, torch.Tensor) else None
        flat = _RecomputedUnroll.apply((model, names, schedule, y, segment), x, lr, *state)
    else:
        with torch.enable_grad():  # the inner gradients need autograd even when θ_T's graph is not kept
            flat = tuple(v.requires_grad_(True) if i < k else v for i, v in enumerate(state))
            flat = _segment(model, names, schedule, x, y, differentiable, *flat)
        if not differentiable:
            flat = tuple(v.detach() for v in flat)
    stats = dict(zip(stat_names, flat[len(flat) - len(stat_names):])) if stat_names else dict(schedule.stats or {})
    return dict(zip(names, flat[:k])), stats


#: parameter-sized tensors one kept simulated step holds (the new parameters and what its
#: double-backward graph saves): 1.35 measured on D-1000-1000-10 (~21 MiB per step at 4.07 M
#: float32 parameters, docs/PERFORMANCE.md §6.4), rounded up
PARAM_COPIES_PER_STEP = 1.5
#: activation-sized tensors one kept step holds per layer output of a batch (forward and backward)
ACTIVATION_COPIES_PER_STEP = 4
#: the whole unroll is kept (no recomputation) while its estimate stays within this share of the memory
KEEP_FRACTION = 0.5
#: exclusive upper end of the attack's own batch-order seed, drawn when the order is unknown
ORDER_SEED_RANGE = 2**31 - 1


def memory_estimate(target: Target, *, m: int, batch_size: int, steps: int, segment: int, dtype: torch.dtype,
                    momentum: bool = False) -> float:
    """An estimate of the bytes one outer step holds beyond the model itself.

    Per kept simulated step :data:`PARAM_COPIES_PER_STEP` copies of the P parameters and
    :data:`ACTIVATION_COPIES_PER_STEP` per layer output of a batch; kept are all T steps without
    recomputation, else the ⌈T/k⌉ boundary states (P, 2P with momentum buffers) and one segment of
    k steps being recomputed. Plus the candidates and their gradient.
    """
    size = torch.finfo(dtype).bits // 8
    p = sum(v.numel() for v in target.params.values())
    with torch.no_grad():
        first = next(iter(target.params.values()))
        probe = torch.zeros((1, *target.input_shape), dtype=first.dtype, device=first.device)
        acts = sum(int(o.numel()) for o in _layer_outputs(target, probe))
    per_step = PARAM_COPIES_PER_STEP * p + ACTIVATION_COPIES_PER_STEP * batch_size * acts
    if segment:
        elements = -(-steps // segment) * (2 if momentum else 1) * p + min(segment, steps) * per_step
    else:
        elements = steps * per_step
    return float(size * (elements + 2 * m * math.prod(target.input_shape)))


def _device(target: Target) -> torch.device:
    return next(iter(target.params.values())).device


def _layer_outputs(target: Target, x: torch.Tensor) -> list[torch.Tensor]:
    outs: list[torch.Tensor] = []
    hooks = [mod.register_forward_hook(lambda _m, _i, o: outs.append(o)) for mod in target.model.modules()
             if not list(mod.children())]
    try:
        target.forward(x)
    finally:
        for h in hooks:
            h.remove()
    return [o for o in outs if isinstance(o, torch.Tensor)]


class DynamicsAttack(Attack):
    """Dynamics matching; needs the initialisation and the training recipe (``knowledge.known_init``,
    ``knowledge.recipe``)."""

    name: ClassVar[str] = "dynamics"
    config_cls: ClassVar[type[Any]] = DynamicsConfig
    uses: ClassVar[tuple[str, ...]] = ("weights", "known_init", "recipe")
    requires: ClassVar[tuple[str, ...]] = ("known_init", "recipe")
    divergence_hint: ClassVar[str] = "lower lr_x (and lr_lr when the lr is learned)"
    #: not probed: Adam's step is bounded by lr_x whatever the gradient's scale
    step_size_fields: ClassVar[tuple[str, ...]] = ()
    one_candidate_per_image: ClassVar[bool] = True
    progress_keys: ClassVar[tuple[str, ...]] = ("loss", "cosine", "box")

    def __init__(self, config: DynamicsConfig | None = None) -> None:
        super().__init__(config)
        self._segments: dict[tuple[Any, ...], int] = {}

    # -- what the attack replays -----------------------------------------------------------------

    def _recipe(self, prior: AttackerPrior) -> KnownRecipe:
        recipe = prior.recipe
        if recipe is None or prior.known_init is None:
            raise DataReconError("dynamics matching replays the training: it needs --known-init and --known-recipe")
        return recipe

    def check(self, target: Target, prior: AttackerPrior) -> None:
        """Refuse, before any work, what cannot be replayed or would not fit in memory."""
        recipe = self._recipe(prior)
        if not isinstance(target.loss, str):
            raise DataReconError("dynamics matching replays a named training loss; a callable loss cannot be recorded")
        if prior.m != recipe.n:
            raise DataReconError(f"the simulated training trains on the n = {recipe.n} training images it replays; "
                                 f"pass --candidates {recipe.n} (got {prior.m})")
        if self.config.epochs is not None and self.config.epochs > recipe.epochs:
            raise DataReconError(f"the model trained {recipe.epochs} epochs; simulate at most that many "
                                 f"(--set epochs={recipe.epochs}, or leave epochs unset)")
        if self.replays_statistics(target, prior) and not prior.known_init.stats:
            raise DataReconError("the recorded training ran batch norm in train mode: its replay starts from the "
                                 "running statistics of the start, which a file of parameters does not hold; pass "
                                 "--known-init seed, seed:N or pretrained")
        steps = self.epochs(recipe) * recipe.steps_per_epoch
        need = memory_estimate(target, m=prior.m, batch_size=recipe.batch_size, steps=steps,
                               segment=self.segment(target, prior), dtype=self.dtype, momentum=bool(recipe.momentum))
        refuse_if_too_large(need, what=f"{steps} simulated steps of batch {recipe.batch_size}",
                            fix="lower the simulated epochs (epochs) or set segment to recompute the unroll",
                            total=device_memory_bytes(_device(target)))

    def epochs(self, recipe: KnownRecipe) -> int:
        return self.config.epochs or recipe.epochs

    def segment(self, target: Target, prior: AttackerPrior) -> int:
        """The recomputed segment length: the config's, or (unset) 0 when the whole unroll's estimate
        fits in half the machine's memory, else ⌈√T⌉ (memory ~√T parameter copies, ~2 forward passes)."""
        if self.config.segment is not None:
            return self.config.segment
        recipe = self._recipe(prior)
        steps = self.epochs(recipe) * recipe.steps_per_epoch
        # what the choice depends on (the estimate runs a forward: once per problem, not per outer step)
        key = (type(target.model).__name__, tuple(target.input_shape), target.num_parameters, steps,
               recipe.batch_size, prior.m, str(_device(target)), bool(recipe.momentum))
        if key not in self._segments:
            whole = memory_estimate(target, m=prior.m, batch_size=recipe.batch_size, steps=steps, segment=0,
                                    dtype=self.dtype, momentum=bool(recipe.momentum))
            total = device_memory_bytes(_device(target))
            self._segments[key] = 0 if total is None or whole <= total * KEEP_FRACTION else math.isqrt(steps - 1) + 1
        return self._segments[key]

    def initial_variables(self, target: Target, prior: AttackerPrior, *, x: torch.Tensor,
                          generator: torch.Generator) -> dict[str, torch.Tensor]:
        """x₀, log η₀ = log ``lr_init`` when the recipe's η is unknown, and the batch order's seed (the recorded
        one, or drawn once from ``generator``); refused first what cannot be replayed (:meth:`check`)."""
        self.check(target, prior)
        recipe = self._recipe(prior)
        state = {"x": x}
        if recipe.lr is None:
            state["log_lr"] = torch.tensor(math.log(self.config.lr_init), dtype=self.dtype, device=x.device)
        order = recipe.order_seed
        if order is None:  # unknown order: the attack's own, drawn once from its generator
            order = int(torch.randint(0, ORDER_SEED_RANGE, (1,), generator=generator))
        state["order_seed"] = torch.tensor(order, dtype=torch.int64)
        return state

    def learning_rates(self, index: int) -> dict[str, float]:
        """``x``: ``lr_x`` under ``lr_schedule``; ``log_lr`` (when η is learned): ``lr_lr``."""
        return {"x": self.config.lr_x_at(index), "log_lr": self.config.lr_lr}

    def matching_terms(self, target: Target, prior: AttackerPrior, x: torch.Tensor, lr: float | torch.Tensor,
                  order_seed: int, *, differentiable: bool = True) -> dict[str, torch.Tensor]:
        """The matching loss (1 − cos(θ_T − θ_init, θ* − θ_init), or the relative squared distance
        ‖θ_T − θ*‖² / ‖θ* − θ_init‖²) and its parts, differentiable in x (and a tensor lr)."""
        recipe = self._recipe(prior)
        init = {k: v.to(self.dtype) for k, v in prior.known_init.params.items()}
        theta = {k: v.to(self.dtype) for k, v in target.params.items()}
        final = {k: v.to(self.dtype) for k, v in normalisation_stats(target.model).items()}
        train_mode = self.replays_statistics(target, prior)
        # train mode: the statistics start at the start's and move with every step; eval: the model's, fixed
        stats = {k: v.to(self.dtype) for k, v in prior.known_init.stats.items()} if train_mode else final
        schedule = Schedule.replay(TrainingRecipe(loss=loss_name(target.loss), weight_decay=float(target.weight_decay),
                                                  momentum=recipe.momentum, norm_mode=recipe.norm_mode),
                                   lr, n=x.shape[0], batch_size=recipe.batch_size, epochs=self.epochs(recipe),
                                   order_seed=order_seed, stats=stats or None)
        sim, sim_stats = simulate_state(target.model, init, x, self.labels(prior, x.device), schedule,
                                        segment=self.segment(target, prior), differentiable=differentiable)
        moved = _flat(sim) - _flat(init)
        goal = _flat(theta) - _flat(init)
        cosine = torch.dot(moved, goal) / (moved.norm() * goal.norm()).clamp_min(1e-300)
        distance = (moved - goal).pow(2).sum() / goal.pow(2).sum().clamp_min(1e-300)
        terms = {"loss": 1.0 - cosine if self.config.objective == "cosine" else distance, "cosine": cosine,
                 "relative_distance": distance, "update_norm_ratio": moved.norm() / goal.norm()}
        if train_mode:  # the statistics the replay produces against the model's: the feature-statistics prior
            terms["feature_stats"] = statistics_distance(sim_stats, final)
            if self.config.feature_stats_weight > 0:
                terms["loss"] = terms["loss"] + self.config.feature_stats_weight * terms["feature_stats"]
        return terms

    def replays_statistics(self, target: Target, prior: AttackerPrior) -> bool:
        """Whether the replay moves batch norm's statistics (a training in train mode of a network with batch
        norm): then the feature-statistics prior compares the statistics the replay produces with the
        model's, inside the matching terms, instead of the candidates' with the model's."""
        recipe = self._recipe(prior)
        return recipe.norm_mode == "train" and bool(batch_norm_modules(target.model))

    def gradients(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> Gradients:
        """The matching loss and its parts, with their gradients in x (and log η when learned) through the
        simulated training; ``lr``: the η the simulation used."""
        recipe = self._recipe(prior)
        x = state["x"].detach().requires_grad_(True)
        learned = "log_lr" in state
        log_lr = state["log_lr"].detach().requires_grad_(True) if learned else None
        lr = log_lr.exp() if learned else float(recipe.lr)
        terms = dict(self.matching_terms(target, prior, x, lr, int(state["order_seed"])))
        grads = torch.autograd.grad(terms["loss"], [x] + ([log_lr] if learned else []))
        terms["lr"] = float(lr.detach()) if learned else float(lr)
        return Gradients(terms, {"x": grads[0], **({"log_lr": grads[1]} if learned else {})})

    def own_priors(self, target: Target, prior: AttackerPrior) -> tuple[str, ...]:
        """The feature statistics for a replay of batch norm in train mode (the matching terms compare the
        statistics the replay produces, :func:`statistics_distance`)."""
        return ("feature_stats",) if self.replays_statistics(target, prior) else ()

    def update(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], g: Gradients,
               index: int) -> dict[str, float]:
        """The optimiser on x (on its gradient's sign with ``signed``) and log η, under the finiteness rule; the
        reported ``grad_norm_x`` is the norm of the gradient itself."""
        gx = g.grads["x"]
        grad_norm = float(gx.norm())
        grads = {**g.grads, "x": gx.sign() if self.config.signed else gx}
        return apply_if_finite(self.config.optimizer, self.config.optimizer_settings(), state, grads,
                               self.learning_rates(index), g.terms, norms={"x": grad_norm})

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """No per-candidate score (the objective is a property of the whole set); the run's final
        cosine and learning rate as its selection criteria."""
        recipe = self._recipe(prior)
        lr = float(state["log_lr"].exp()) if "log_lr" in state else float(recipe.lr)
        terms = self.matching_terms(target, prior, state["x"].detach(), lr, int(state["order_seed"]), differentiable=False)
        return {}, {"formulation": "dynamics", "notes": [],
                    "selection": {"cosine": {"value": float(terms["cosine"])},
                                  "relative_distance": {"value": float(terms["relative_distance"])}},
                    "extra": {"lr": lr, "simulated_epochs": self.epochs(recipe), "segment": self.segment(target, prior),
                              "simulated_steps": self.epochs(recipe) * recipe.steps_per_epoch,
                              "order": "recorded" if recipe.order_seed is not None else "own"}}
