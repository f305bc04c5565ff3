"""One pure, differentiable training step: ``(params, batch, recipe) -> params``.

``datarecon train`` updates its network with these functions (:class:`datarecon.training.optim.
GradientDescent` writes :func:`update`'s result into the parameters in place), so an attack that
replays the training (dynamics matching) runs the very arithmetic that trained the target: the
same forward (:func:`energy` through :func:`torch.func.functional_call`), the same gradient and the
same update, and, from the same θ_init with the true data, the same θ* bit for bit (tested in
``tests/kernel/test_step.py``). With ``create_graph=True`` the step is differentiable in the
parameters and in the batch's inputs (second-order autograd), which is what unrolling needs.

Batch norm (the ResNets' ``batch_norm``) enters the step as ``stats``: its running mean and
variance. A fine-tuning runs it in eval mode by default (SimuDy's setting: the statistics stay the
pretrained ones, the affine weights are trained), so the step is a pure function of (parameters,
statistics, batch), and a replay from the same start with the true data reproduces θ* bit for bit
(``tests/kernel/test_step.py``). A training in train mode (``norm_mode: train``: from scratch, or a
fine-tuning that asks for it) normalises with each batch's own statistics and moves the running
ones toward them: :func:`replay_step` runs that step as a function too, statistics in and out,
the new ones r ← (1 − m)·r + m·s computed from the batch's per-channel mean and unbiased variance s
(differentiable in the batch, as an attack replaying it needs); :func:`train_step` is the eval-mode
step alone.

The update is gradient descent with heavy-ball momentum, written as ``torch.optim.SGD`` does it:
b ← μ·b + g, θ ← θ − η·b (b₀ = 0; μ = 0: θ ← θ − η·g), g = ∇_θ E(θ; x, y) with
E = L(Φ(x; θ), y) + (wd/2)·‖θ‖². The learning rate η of a step is a number the caller computes
(the training schedule of :mod:`datarecon.training.optim`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call

from datarecon.errors import DataReconError
from datarecon.kernel.losses import energy_terms

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class MarginAscent:
    """The margin-ascent stage that may end a training (:func:`datarecon.training.fit.ascend_margin`).

    Attributes:
        steps: number of steps (each one forward + backward), ≥ 0; with ``rtol`` the budget: at most
            this many.
        step_size: initial angle η₀ of a step on the sphere (radians), 0 < η₀ ≤ ``max_step``.
        growth: η ← growth·η after an accepted step (η ← η/2 after a rejected one), ≥ 1.
        max_step: upper bound of η.
        min_step: stop once η < min_step (no step of that size lowers log L any more), > 0.
        rtol: stop to convergence: once the normalised margin rose by less than this fraction of its
            value over the last ``window`` steps (checked every ``window`` steps); None: run ``steps``.
        window: steps between the convergence checks and the points of the margin curve, ≥ 1.
    """

    steps: int
    step_size: float = 0.01
    growth: float = 1.1
    max_step: float = 0.1
    min_step: float = 1e-6
    rtol: float | None = None
    window: int = 500


@dataclass(frozen=True)
class TrainingRecipe:
    """How a model is, or was, trained: the one description ``datarecon train`` runs from, a model
    directory records and an attacker replays.

    One step (:func:`train_step`) reads ``loss``, ``weight_decay`` and ``momentum``; training
    (:func:`datarecon.training.fit.fit`, :func:`datarecon.training.dp.fit_dp`) reads all of it; the
    attacker's knowledge (:class:`datarecon.attacks.knowledge.KnownRecipe`) holds the recipe a model
    directory records, with what the attacker does not know as None.

    Attributes:
        loss: a name in :data:`datarecon.kernel.losses.LOSSES` (mean over the batch).
        weight_decay: wd ≥ 0 of the energy term (wd/2)‖θ‖² (over the parameters that are trained).
        optimizer: a name in :data:`datarecon.training.optim.OPTIMIZERS` (``gd``, ``lbfgs``).
        lr: base learning rate η > 0 (initial step for ``lbfgs``); None: unknown (an attacker's recipe).
        momentum: heavy-ball momentum μ ∈ [0, 1) (``gd`` only).
        epochs: the number of epochs: at most this many (training), or the ones trained (a recorded
            recipe); for DP-SGD epochs of round(1/q) steps; ≥ 0.
        schedule: a name in :data:`datarecon.training.optim.SCHEDULES`.
        max_lr_factor: cap of the learning rate relative to ``lr`` for growing schedules (None: no cap).
            ``loss-normalised`` on an exp-tailed loss without weight decay steps lr·min(1, cap·L)·∇log L,
            computed in the log domain: (lr/L)·∇L without underflow, however small L gets.
        batch_size: mini-batch SGD with batches of this size, 1 ≤ b ≤ n (``gd`` with a constant
            schedule; an epoch is ⌈n/b⌉ steps over :func:`batch_order`); None: full batch.
        seed: the training seed: of the mini-batch order, and of DP-SGD's Poisson batches and noise;
            None: unknown (an attacker's recipe).
        norm_mode: how batch norm layers run in the training steps: ``train`` (each batch's statistics,
            the running ones updated) or ``eval`` (the running statistics fixed, the affine weights
            trained: fine-tuning, SimuDy's setting). Metrics are always computed in eval mode.
        margin_ascent: the margin-ascent stage after the epochs (:class:`MarginAscent`), or None.
    """

    loss: str
    weight_decay: float = 0.0
    optimizer: str = "gd"
    lr: float | None = 0.01
    momentum: float = 0.0
    epochs: int = 1000
    schedule: str = "constant"
    max_lr_factor: float | None = 1e6
    batch_size: int | None = None
    seed: int | None = 0
    norm_mode: Literal["train", "eval"] = "train"
    margin_ascent: MarginAscent | None = None


def energy(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, *,
           loss: str, weight_decay: float = 0.0,
           stats: Mapping[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training energy at ``params`` on the batch ``(x, y)``.

    Args:
        model: the architecture; its own parameters are replaced by ``params`` for this call.
        params: name → tensor of the trained parameters (others are taken from ``model``).
        x: (b, *input_shape) inputs; y: (b,) labels in the loss's convention.
        loss: a LOSSES name; weight_decay: wd ≥ 0.
        stats: name → tensor of buffers the forward reads (batch norm's running statistics in eval
            mode); None: the module's own. Not part of the weight decay.

    Returns:
        (outputs (b, k), data loss (scalar), energy = data loss + (wd/2)·Σ‖θ_p‖² (scalar)).
    """
    out = functional_call(model, {**(stats or {}), **params}, (x,))
    dl, e = energy_terms(out, y, params, loss=loss, weight_decay=weight_decay)
    return out, dl, e


def gradient(model: nn.Module, params: Mapping[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
             recipe: TrainingRecipe, *, create_graph: bool = False,
             stats: Mapping[str, torch.Tensor] | None = None) -> tuple[Params, torch.Tensor]:
    """∇_θ E at ``params`` on ``batch`` (``stats`` as in :func:`energy`); returns (gradients by name, energy)."""
    names = list(params)
    x, y = batch
    _, _, e = energy(model, params, x, y, loss=recipe.loss, weight_decay=recipe.weight_decay, stats=stats)
    grads = torch.autograd.grad(e, [params[n] for n in names], create_graph=create_graph)
    return dict(zip(names, grads)), e


def update(params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
           buffers: Mapping[str, torch.Tensor] | None, *, lr: float | torch.Tensor,
           momentum: float = 0.0) -> tuple[Params, Params]:
    """One heavy-ball step: b ← μ·b + g, θ ← θ − η·b (``torch.optim.SGD``'s order of operations).

    Args:
        params, grads: name → tensor, the same names and shapes.
        buffers: name → momentum buffer (None or missing names: b = 0); unused when μ = 0.
        lr: η > 0; a tensor keeps the step differentiable in η (a learnt learning rate).
        momentum: μ.

    Returns:
        (new parameters, new buffers); no input is modified.
    """
    new_params: Params = {}
    new_buffers: Params = {}
    for name, p in params.items():
        d = grads[name]
        if momentum:
            b = (buffers or {}).get(name)
            d = d if b is None else torch.add(b * momentum, d)
            new_buffers[name] = d
        if isinstance(lr, torch.Tensor):
            new_params[name] = p - lr * d
        else:
            new_params[name] = torch.add(p, d, alpha=-lr)
    return new_params, new_buffers


def train_step(model: nn.Module, params: Mapping[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
               recipe: TrainingRecipe, *, lr: float | torch.Tensor, buffers: Mapping[str, torch.Tensor] | None = None,
               create_graph: bool = False, stats: Mapping[str, torch.Tensor] | None = None) -> tuple[Params, Params]:
    """``(params, stats, batch, recipe) -> params``: one gradient-descent step of the training.

    Args:
        model: the architecture (its parameters are not read for the names in ``params``).
        params: θ_t by name. batch: (x (b, ...), y (b,)). recipe: loss, weight decay, momentum.
        lr: η_t of this step. buffers: the momentum buffers before the step.
        create_graph: keep the graph, so the new parameters are differentiable in ``params``, the
            batch's inputs and a tensor ``lr``.
        stats: batch norm's running statistics by name (constants of the step; None: the module's).

    Returns:
        (θ_{t+1}, buffers after the step).

    Raises:
        DataReconError: ``model`` has a batch norm in train mode (its output would depend on the batch's
            statistics and the step would write the running ones: not a pure step).
    """
    check_pure(model)
    grads, _ = gradient(model, params, batch, recipe, create_graph=create_graph, stats=stats)
    return update(params, grads, buffers, lr=lr, momentum=recipe.momentum)


@dataclass(frozen=True)
class StepOutput:
    """What one replayed step returns.

    Attributes:
        params: θ_{t+1} by name.
        buffers: the momentum buffers after the step (empty without momentum).
        stats: batch norm's running statistics after the step: in train mode moved toward the batch's
            (differentiable in the batch), in eval mode the ones given; empty for a network without
            batch norm.
    """

    params: Params
    buffers: Params
    stats: Params


def batch_norm_modules(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """The batch-norm layers of ``model`` by module name, in registration order."""
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]


@contextmanager
def _batch_norm_in_train_mode(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Batch-norm layers in train mode for the block; yields the inputs each receives (name → (b, C, ...)),
    filled by the forward. The layers' modes are restored after."""
    layers = batch_norm_modules(model)
    modes = [mod.training for _, mod in layers]
    inputs: dict[str, torch.Tensor] = {}
    hooks = [mod.register_forward_hook(lambda _m, inp, _o, name=name: inputs.__setitem__(name, inp[0]))
             for name, mod in layers]
    try:
        for _, mod in layers:
            mod.train(True)
        yield inputs
    finally:
        for h in hooks:
            h.remove()
        for (_, mod), mode in zip(layers, modes, strict=True):
            mod.train(mode)


def running_update(model: nn.Module, stats: Mapping[str, torch.Tensor],
                   inputs: Mapping[str, torch.Tensor]) -> Params:
    """Batch norm's running statistics after one train-mode forward: r ← (1 − m)·r + m·s per layer, with s the
    per-channel mean and unbiased variance of the layer's input over the batch and its pixels and m the
    layer's momentum (as ``torch.nn.functional.batch_norm`` updates them; differentiable in the inputs).

    Raises:
        DataReconError: a layer with a cumulative average (momentum None), which depends on a step count.
    """
    new = dict(stats)
    for name, mod in batch_norm_modules(model):
        if mod.momentum is None:
            raise DataReconError(f"batch norm layer {name} keeps a cumulative average (momentum None), which a "
                                 "replay does not follow; give it a momentum")
        h = inputs[name]
        dims = [0] + list(range(2, h.dim()))
        m = float(mod.momentum)
        mean, var = h.mean(dim=dims), h.var(dim=dims, unbiased=True)
        new[f"{name}.running_mean"] = stats[f"{name}.running_mean"] * (1 - m) + mean * m
        new[f"{name}.running_var"] = stats[f"{name}.running_var"] * (1 - m) + var * m
    return new


def replay_step(model: nn.Module, params: Mapping[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
                recipe: TrainingRecipe, *, lr: float | torch.Tensor, buffers: Mapping[str, torch.Tensor] | None = None,
                stats: Mapping[str, torch.Tensor] | None = None, create_graph: bool = False) -> StepOutput:
    """One training step as a function, in the batch-norm mode of ``recipe.norm_mode``.

    Eval mode (or no batch norm): :func:`train_step`, the statistics passed through. Train mode: the
    forward normalises with the batch's own statistics (the arithmetic ``datarecon train`` runs, so
    θ_{t+1} is the training's bit for bit) and the running statistics move toward them
    (:func:`running_update`; the module's own buffers are never written).

    Args:
        as :func:`train_step`; ``stats``: the running statistics before the step (None: the module's).

    Returns:
        :class:`StepOutput`.
    """
    if recipe.norm_mode != "train" or not batch_norm_modules(model):
        new_params, new_buffers = train_step(model, params, batch, recipe, lr=lr, buffers=buffers,
                                             create_graph=create_graph, stats=stats)
        return StepOutput(new_params, new_buffers, dict(stats or {}))
    given = dict(stats) if stats is not None else normalisation_stats(model)
    # every buffer the forward may write (the running statistics, the step counters) is a copy
    scratch = {k: v.detach().clone() for k, v in model.named_buffers()}
    scratch.update({k: v.detach().clone() for k, v in given.items()})
    with _batch_norm_in_train_mode(model) as inputs:
        grads, _ = gradient(model, params, batch, recipe, create_graph=create_graph, stats=scratch)
    new_params, new_buffers = update(params, grads, buffers, lr=lr, momentum=recipe.momentum)
    return StepOutput(new_params, new_buffers, running_update(model, given, inputs))


def check_pure(model: nn.Module) -> None:
    """Refuse a network whose forward is not a pure function of its tensors and the batch: a batch norm in
    train mode (call ``model.eval()``: the replayed trainings run batch norm in eval mode).

    Raises:
        DataReconError: names the first such layer.
    """
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training:
            raise DataReconError(f"batch norm layer {name} is in train mode: the pure training step runs batch norm "
                                 "in eval mode (running statistics fixed); call model.eval()")


def normalisation_stats(model: nn.Module) -> Params:
    """The floating buffers of ``model`` by name (batch norm's running mean and variance): the ``stats`` of
    :func:`train_step`; empty for a network without normalisation layers."""
    return {k: v.detach() for k, v in model.named_buffers() if v.is_floating_point()}


def batch_order(n: int, batch_size: int, *, seed: int, epoch: int) -> list[torch.Tensor]:
    """The mini-batches of one epoch: a permutation of range(n) cut into batches of ``batch_size``
    (the last one smaller when ``batch_size`` does not divide n).

    The permutation is drawn from a generator seeded by SHA-256 of ``(seed, epoch)``, so any epoch's
    order is recomputed from the training seed alone: a resumed training, and an attacker who knows
    the recorded seed, get the very batches the training used.

    Args:
        n: training-set size ≥ 1; batch_size: 1 ≤ b ≤ n; seed: the training seed; epoch: 0-based.

    Returns:
        ⌈n/b⌉ int64 index tensors.
    """
    digest = hashlib.sha256(f"datarecon-batches:{int(seed)}:{int(epoch)}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    perm = torch.randperm(n, generator=g)
    return list(perm.split(batch_size))


__all__ = ["MarginAscent", "Params", "StepOutput", "TrainingRecipe", "batch_norm_modules", "batch_order", "check_pure",
           "energy", "gradient", "normalisation_stats", "replay_step", "running_update", "train_step", "update"]
