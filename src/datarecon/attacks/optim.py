"""Optimisers as pure tensor functions whose buffers live in the attack's state dict.

Keeping the buffers (momentum, Adam moments, step count) in the flat state dict the runner
checkpoints makes resume bit-identical. Each variable (``x``, ``lambda``, ...) has its own
learning rate. Registered in :data:`OPTIMIZERS`:

* ``sgd``  (reference): b ← μ b + g;  p ← p − lr·b   (PyTorch's SGD convention; μ = 0: plain GD;
  ``nesterov``: p ← p − lr·(g + μ b))
* ``adam``: m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²; p ← p − lr·m̂/(√v̂ + ε), m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ)
  (Kingma & Ba 2015). Note (METHODS §7): Adam normalises even tiny gradients, so a
  ground-truth initialisation drifts; plain gradient steps keep it in place.

State keys: ``opt.<var>.<buffer>`` per variable and ``opt.step`` (int64 scalar, steps taken).

K runs held as one stacked state (every entry with a leading run axis, ``opt.step`` (K,); see
:mod:`datarecon.attacks.batched`) take their step with :func:`stacked_optimizer_step`: the same
update rule (:func:`optimizer_step`) on the runs' rows, committed in place where finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.registry import Registry


class OptimizerSettings(BaseModel):
    """Hyper-parameters shared by the optimisers (each uses the fields it needs)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    nesterov: bool = False
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)


Buffers = dict[str, torch.Tensor]
UpdateFn = Callable[..., tuple[torch.Tensor, Buffers]]


def sgd_update(param: torch.Tensor, grad: torch.Tensor, buffers: Mapping[str, torch.Tensor], *, lr: float,
               step: int, settings: OptimizerSettings) -> tuple[torch.Tensor, Buffers]:
    """SGD with (optionally Nesterov) momentum; returns (new param, new buffers), inputs untouched."""
    buf = settings.momentum * buffers["momentum"] + grad
    direction = grad + settings.momentum * buf if settings.nesterov else buf
    return param - lr * direction, {"momentum": buf}


def adam_update(param: torch.Tensor, grad: torch.Tensor, buffers: Mapping[str, torch.Tensor], *, lr: float,
                step: int, settings: OptimizerSettings) -> tuple[torch.Tensor, Buffers]:
    """Adam with bias correction; ``step`` is 1-based. Returns (new param, new buffers)."""
    b1, b2 = settings.beta1, settings.beta2
    m = b1 * buffers["exp_avg"] + (1 - b1) * grad
    v = b2 * buffers["exp_avg_sq"] + (1 - b2) * grad * grad
    m_hat = m / (1 - b1**step)
    v_hat = v / (1 - b2**step)
    return param - lr * m_hat / (v_hat.sqrt() + settings.eps), {"exp_avg": m, "exp_avg_sq": v}


@dataclass(frozen=True)
class OptimizerEntry:
    """A registered optimiser: its per-variable buffer names, pure update function, doc line and the
    :class:`OptimizerSettings` fields it reads (a config refuses the others away from their default)."""

    buffers: tuple[str, ...]
    update: UpdateFn
    doc: str
    settings: tuple[str, ...] = ()


OPTIMIZERS: Registry[OptimizerEntry] = Registry("optimizer")
OPTIMIZERS.register("sgd", OptimizerEntry(("momentum",), sgd_update, "SGD with momentum (reference)",
                                          ("momentum", "nesterov")))
OPTIMIZERS.register("adam", OptimizerEntry(("exp_avg", "exp_avg_sq"), adam_update, "Adam", ("beta1", "beta2", "eps")))

STEP_KEY = "opt.step"


def init_optimizer_state(name: str, variables: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zero buffers ``opt.<var>.<buffer>`` for each variable plus ``opt.step`` = 0."""
    entry = OPTIMIZERS.get(name)
    state = {f"opt.{var}.{b}": torch.zeros_like(t) for var, t in variables.items() for b in entry.buffers}
    state[STEP_KEY] = torch.zeros((), dtype=torch.int64)
    return state


def optimizer_step(name: str, state: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], *,
                   lrs: Mapping[str, float], settings: OptimizerSettings) -> dict[str, torch.Tensor]:
    """One update of the variables named in ``grads`` (state keys), computed but NOT committed.

    Args:
        name: a key of :data:`OPTIMIZERS`.
        state: holds each variable under its name and the buffers from :func:`init_optimizer_state`.
        grads: variable name → gradient (same shape).
        lrs: variable name → learning rate.
        settings: hyper-parameters.

    Returns:
        The new entries (variables, buffers, ``opt.step``) for the caller to commit with
        ``state.update(new)`` once it has checked they are finite.
    """
    entry = OPTIMIZERS.get(name)
    step = int(state[STEP_KEY]) + 1
    new: dict[str, torch.Tensor] = {STEP_KEY: torch.tensor(step, dtype=torch.int64)}
    for var, grad in grads.items():
        bufs = {b: state[f"opt.{var}.{b}"] for b in entry.buffers}
        with torch.no_grad():
            p, nb = entry.update(state[var].detach(), grad.detach(), bufs, lr=float(lrs[var]), step=step,
                                 settings=settings)
        new[var] = p
        new.update({f"opt.{var}.{b}": t for b, t in nb.items()})
    return new


def finite_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """(K,) bool: row k is True iff every floating tensor's row k is finite (tensors (K, ...))."""
    ok: torch.Tensor | None = None
    for t in tensors:
        if t.is_floating_point():
            # (v * 0).sum() is NaN iff v has a NaN/inf (no overflow, unlike v.sum()); 2 passes, not 4
            row = torch.isfinite((t * 0).reshape(t.shape[0], -1).sum(dim=1))
            ok = row if ok is None else ok & row
    if ok is None:
        raise ValueError("finite_rows needs at least one floating tensor")
    return ok


def stacked_optimizer_step(name: str, state: dict[str, torch.Tensor], grads: Mapping[str, torch.Tensor], *,
                           lrs: Sequence[Mapping[str, float]], rows: Sequence[int],
                           settings: OptimizerSettings) -> list[int]:
    """One optimiser step of the runs at ``rows`` of a stacked state, committed in place where finite.

    The runs at ``rows`` that share their learning rates and step count are updated together by
    :func:`optimizer_step` on their rows (the whole stack in one call when every run steps alike),
    so each run's update is, element for element, the update of that run alone (the rule is
    elementwise and its scalars are the run's own). A run whose update is not finite, and every run
    not in ``rows``, keeps its state.

    Args:
        name: a key of :data:`OPTIMIZERS`.
        state: K runs' states stacked on a leading run axis: each variable and its buffers (K, ...)
            and ``opt.step`` (K,) int64; updated in place (views of its rows see the update).
        grads: variable name → (K, ...) gradients (rows not in ``rows`` are not read).
        lrs: per run (K entries), variable name → learning rate.
        rows: the runs that take a step now (ascending, no repeats).
        settings: hyper-parameters (shared by the runs).

    Returns:
        The rows whose update was finite and committed (ascending).
    """
    entry = OPTIMIZERS.get(name)
    k_runs = state[STEP_KEY].shape[0]
    steps = state[STEP_KEY].tolist()
    parts: dict[tuple[Any, ...], list[int]] = {}
    for k in rows:
        parts.setdefault((tuple(sorted((v, float(lrs[k][v])) for v in grads)), steps[k]), []).append(k)
    keys = [key for var in grads for key in (var, *(f"opt.{var}.{b}" for b in entry.buffers))]
    committed: list[int] = []
    for (lr_items, step), part in parts.items():
        whole = len(part) == k_runs
        index = torch.tensor(part)

        def pick(t: torch.Tensor, whole: bool = whole, index: torch.Tensor = index) -> torch.Tensor:
            return t if whole else t.index_select(0, index.to(t.device))

        sub = {key: pick(state[key]) for key in keys}
        sub[STEP_KEY] = torch.tensor(step, dtype=torch.int64)
        new = optimizer_step(name, sub, {v: pick(g) for v, g in grads.items()}, lrs=dict(lr_items), settings=settings)
        new.pop(STEP_KEY)
        ok = finite_rows(list(new.values())).cpu()
        good = [k for k, fine in zip(part, ok.tolist(), strict=True) if fine]
        if not good:
            continue
        if len(good) == k_runs:
            for key, t in new.items():
                state[key].copy_(t)
            state[STEP_KEY].add_(1)
        else:
            at, local = torch.tensor(good), ok.nonzero().flatten()
            for key, t in new.items():
                state[key].index_copy_(0, at.to(t.device), t.index_select(0, local.to(t.device)))
            state[STEP_KEY].index_fill_(0, at.to(state[STEP_KEY].device), step + 1)
        committed.extend(good)
    return sorted(committed)


def apply_if_finite(optimizer: str, settings: OptimizerSettings, state: dict[str, torch.Tensor],
                    grads: dict[str, torch.Tensor], lrs: Mapping[str, float], metrics: dict[str, float], *,
                    norms: Mapping[str, float] | None = None) -> dict[str, float]:
    """The one finiteness rule of a step: apply the ``optimizer`` update of ``grads`` to ``state``
    only when the step's loss and the whole update are finite.

    Args:
        optimizer: a key of :data:`OPTIMIZERS`; settings: its constants.
        state: the run's state (updated in place when the update is finite).
        grads: variable name → gradient, shaped like ``state[name]``.
        lrs: variable name → step size.
        metrics: the step's metrics (``loss`` read; returned with ``grad_norm_<var>`` added, or with
            ``update`` NaN when the update was refused, so the NaN stop trips with the last finite state).
        norms: the gradient norms to report (default: the norm of each of ``grads``).
    """
    if not math.isfinite(metrics["loss"]):
        return metrics
    new = optimizer_step(optimizer, state, grads, lrs=lrs, settings=settings)
    if not bool(finite_rows([v.unsqueeze(0) for v in new.values()])):
        return committed_metrics(metrics, None)
    state.update(new)
    return committed_metrics(metrics, norms if norms is not None else {k: float(g.norm()) for k, g in grads.items()})


def committed_metrics(metrics: dict[str, float], grad_norms: Mapping[str, float] | None) -> dict[str, float]:
    """A step's metrics once its update was applied (``grad_norm_<var>``: the norms of the gradients
    it applied) or, ``grad_norms`` None, refused as not finite (``update`` NaN: NaNStop trips and the
    state keeps its last finite value)."""
    if grad_norms is None:
        metrics["update"] = float("nan")
        return metrics
    metrics.update({f"grad_norm_{k}": v for k, v in grad_norms.items()})
    return metrics
