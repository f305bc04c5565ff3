"""Full-batch optimisers and learning-rate schedules (registries).

Each optimiser keeps *all* of its state in tensors and JSON scalars, so a training
checkpoint can be written as safetensors + JSON (never pickle) and restored
bit-identically (:meth:`FullBatchOptimizer.state_tensors` / :meth:`load_state`).

Optimisers (:data:`OPTIMIZERS`):

* ``gd``: full-batch gradient descent with heavy-ball momentum
  (b ← μ·b + ∇E(θ); θ ← θ − η_t·b; b₀ = 0, identical to ``torch.optim.SGD``).
* ``lbfgs``: ``torch.optim.LBFGS`` with a strong-Wolfe line search, one L-BFGS
  iteration per epoch; for the convex/affine targets (Runkel et al. 2024 §4).

Schedules (:data:`SCHEDULES`), functions ``(lr, epoch, loss) -> η_t``:

* ``constant``: η_t = lr.
* ``loss-normalised``: η_t = lr / L(θ_t) (data loss before the step), capped at
  ``lr · max_lr_factor``. For logistic loss on homogeneous networks this speeds up
  the convergence of the normalised margin (Nacson et al. 2019, "Convergence of
  gradient descent on separable data"; Lyu & Li 2020, "Gradient descent maximizes
  the margin of homogeneous neural networks", §4 loss-based learning rate).
* ``increasing``: η_t = lr · √(1 + t / 1000), a mild deterministic increase.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from datarecon.errors import DataReconError
from datarecon.kernel.step import update
from datarecon.registry import Registry

Closure = Callable[[], torch.Tensor]
ScheduleFn = Callable[..., float]


class FullBatchOptimizer(Protocol):
    """A full-batch optimiser whose state is tensors + JSON scalars."""

    def step(self, grads_ready: bool, lr: float, closure: Closure) -> None:
        """One update; ``closure`` re-evaluates the energy with gradients (line searches)."""
        ...

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]: ...

    def load_state(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None: ...


class GradientDescent:
    """Full-batch GD with heavy-ball momentum (state: one momentum buffer per parameter).

    The gradient must already be in ``p.grad`` (of the full energy, weight decay included).
    """

    def __init__(self, params: list[torch.nn.Parameter], *, momentum: float = 0.0) -> None:
        self.params = params
        self.momentum = float(momentum)
        self.buffers = [torch.zeros_like(p) for p in params] if momentum else []

    def step(self, grads_ready: bool, lr: float, closure: Closure) -> None:
        """θ ← θ − η·b with b ← μ·b + g by the training's one pure update (:func:`datarecon.kernel.step.update`)."""
        names = [str(i) for i in range(len(self.params))]
        with torch.no_grad():
            new_params, new_buffers = update(dict(zip(names, self.params)),
                                             {n: p.grad for n, p in zip(names, self.params)},
                                             dict(zip(names, self.buffers)), lr=lr, momentum=self.momentum)
            for n, p in zip(names, self.params):
                p.copy_(new_params[n])
            for n, b in zip(names, self.buffers):
                b.copy_(new_buffers[n])

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {f"momentum.{i}": b for i, b in enumerate(self.buffers)}, {}

    def load_state(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        for i, b in enumerate(self.buffers):
            key = f"momentum.{i}"
            if key not in tensors:
                raise DataReconError(f"training checkpoint lacks {key}; delete the checkpoint folder and retrain")
            b.copy_(tensors[key])


class LBFGS:
    """``torch.optim.LBFGS`` (strong-Wolfe line search), one iteration per ``step``.

    Its internal state (curvature pairs, direction, step, ...) is converted to tensors + scalars
    for checkpoints: lists of tensors become ``key.i`` entries.
    """

    def __init__(self, params: list[torch.nn.Parameter], *, lr: float = 1.0, history_size: int = 20,
                 max_line_search: int = 25) -> None:
        self.params = params
        # max_eval bounds the line search too (max_ls = max_eval − 1 here): leave it 25 trials
        self.opt = torch.optim.LBFGS(params, lr=lr, max_iter=1, max_eval=1 + max_line_search,
                                     history_size=history_size,
                                     tolerance_grad=0.0, tolerance_change=0.0,
                                     line_search_fn="strong_wolfe")

    def step(self, grads_ready: bool, lr: float, closure: Closure) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

        def _closure() -> torch.Tensor:
            self.opt.zero_grad(set_to_none=True)
            e = closure()
            e.backward()
            return e

        self.opt.step(_closure)

    def _state(self) -> dict[str, Any]:
        return self.opt.state[self.opt._params[0]]

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors: dict[str, torch.Tensor] = {}
        scalars: dict[str, Any] = {}
        for key, value in self._state().items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, list):
                scalars[f"{key}.len"] = len(value)
                for i, v in enumerate(value):
                    if isinstance(v, torch.Tensor):
                        tensors[f"{key}.{i}"] = v
            elif isinstance(value, (int, float)) or value is None:
                scalars[key] = value
            else:  # pragma: no cover - defensive
                raise TypeError(f"cannot checkpoint L-BFGS state {key!r} of type {type(value).__name__}")
        return tensors, scalars

    def load_state(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        state = self._state()
        state.clear()
        for key, value in scalars.items():
            if key.endswith(".len"):
                name = key[:-4]
                state[name] = [tensors.get(f"{name}.{i}") for i in range(int(value))]
            else:
                state[key] = value
        for key, value in tensors.items():
            head, _, tail = key.rpartition(".")
            if head and tail.isdigit() and f"{head}.len" in scalars:
                continue
            state[key] = value.clone()


OptimizerFactory = Callable[..., FullBatchOptimizer]
OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer")


@OPTIMIZERS.register("gd")
def _make_gd(params: list[torch.nn.Parameter], *, lr: float, momentum: float) -> FullBatchOptimizer:
    return GradientDescent(params, momentum=momentum)


@OPTIMIZERS.register("lbfgs")
def _make_lbfgs(params: list[torch.nn.Parameter], *, lr: float, momentum: float) -> FullBatchOptimizer:
    if momentum:
        raise DataReconError("momentum applies to --optimizer gd only; set momentum to 0 for lbfgs")
    return LBFGS(params, lr=lr)


#: Optimisers that take the gradient computed by the training loop (one forward/backward per epoch).
USES_PRECOMPUTED_GRAD = {"gd"}

SCHEDULES: Registry[ScheduleFn] = Registry("schedule")


@SCHEDULES.register("constant")
def constant_lr(lr: float, epoch: int, loss: float, *, max_lr_factor: float = 1e6) -> float:
    """η_t = lr."""
    return lr


@SCHEDULES.register("loss-normalised")
def loss_normalised_lr(lr: float, epoch: int, loss: float, *, max_lr_factor: float = 1e6) -> float:
    """η_t = lr / L(θ_t), capped at lr·max_lr_factor (Nacson et al. 2019; Lyu & Li 2020)."""
    if not math.isfinite(loss):
        return lr
    if loss <= 0.0:
        return lr * max_lr_factor
    return min(lr / loss, lr * max_lr_factor)


@SCHEDULES.register("increasing")
def increasing_lr(lr: float, epoch: int, loss: float, *, max_lr_factor: float = 1e6) -> float:
    """η_t = lr·√(1 + t/1000), capped at lr·max_lr_factor."""
    return min(lr * math.sqrt(1.0 + epoch / 1000.0), lr * max_lr_factor)
