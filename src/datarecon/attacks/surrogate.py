"""Surrogate ReLU: forward ReLU, backward sigmoid(α·z), twice differentiable.

The KKT residual differentiates ∇_θΦ with respect to x, i.e. it needs second derivatives of
the network; ReLU's second derivative is zero almost everywhere, so the attack (Haim et al.
2022, following their code) replaces ReLU's derivative by sigmoid(α·z) while keeping the forward
value exact:

    forward:   σ(z) = relu(z)
    backward:  dσ/dz := sigmoid(α z),   d²σ/dz² := α · sigmoid(α z) · (1 − sigmoid(α z))

Implemented as a :class:`torch.autograd.Function` whose ``backward`` uses differentiable torch
ops on the saved input, so ``create_graph=True`` / double backward works. As α → ∞ the surrogate
derivative tends to ReLU's step function.

Registered in :data:`SURROGATES` (``relu``: the model unchanged; ``sigmoid-surrogate``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from datarecon.registry import Registry


class _SurrogateReLUFn(torch.autograd.Function):
    """relu(z) forward; grad · sigmoid(α z) backward (itself differentiable in z and grad)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, alpha: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(z)
        ctx.alpha = alpha
        return z.clamp_min(0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (z,) = ctx.saved_tensors
        return grad * torch.sigmoid(ctx.alpha * z), None


def surrogate_relu(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """relu(z) with surrogate derivative sigmoid(α z). Any shape; α > 0."""
    return _SurrogateReLUFn.apply(z, float(alpha))


class SurrogateReLU(nn.Module):
    """Drop-in for ``nn.ReLU`` with the sigmoid(α·z) surrogate derivative."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return surrogate_relu(z, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


def with_surrogate(model: nn.Module, alpha: float) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.ReLU`` submodule replaced by :class:`SurrogateReLU`.

    Works for any module tree (``nn.Sequential`` or nested custom modules); ReLUs applied through
    ``torch.relu`` / ``F.relu`` inside a custom ``forward`` are not visible and are left as they are.
    The input model is not modified. Parameters are copied; attacks call the copy functionally
    with θ* anyway (``torch.func.functional_call``).
    """
    out = copy.deepcopy(model)
    _replace_relus(out, float(alpha))
    return out


def _replace_relus(module: nn.Module, alpha: float) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.ReLU):
            setattr(module, name, SurrogateReLU(alpha))
        else:
            _replace_relus(child, alpha)


def count_relus(model: nn.Module) -> int:
    """Number of ``nn.ReLU`` submodules (0 means a surrogate changes nothing)."""
    return sum(isinstance(m, nn.ReLU) for m in model.modules())


SurrogateFactory = Callable[[nn.Module, float], nn.Module]
SURROGATES: Registry[SurrogateFactory] = Registry("surrogate")
SURROGATES.register("relu", lambda model, alpha: model)
SURROGATES.register("sigmoid-surrogate", with_surrogate)


def make_surrogate(name: str, model: nn.Module, *, alpha: float) -> nn.Module:
    """The model evaluated with activation ``name`` (a key of :data:`SURROGATES`)."""
    return SURROGATES.get(name)(model, alpha)
