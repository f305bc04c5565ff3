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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
    """A registered optimiser: its per-variable buffer names and pure update function."""

    buffers: tuple[str, ...]
    update: UpdateFn
    doc: str


OPTIMIZERS: Registry[OptimizerEntry] = Registry("optimizer")
OPTIMIZERS.register("sgd", OptimizerEntry(("momentum",), sgd_update, "SGD with momentum (reference)"))
OPTIMIZERS.register("adam", OptimizerEntry(("exp_avg", "exp_avg_sq"), adam_update, "Adam"))

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
