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

:func:`functional_surrogate` gives the same surrogate in plain torch ops (no autograd.Function),
for the torch.func + ``torch.compile`` path of the KKT attack: an autograd.Function inside
torch.func transforms under ``torch.compile`` gets wrong second derivatives in torch 2.13
(benchmarks/bench_compile.py measures it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from datarecon.errors import DataReconError
from datarecon.registry import Registry


class _SurrogateReLUFn(torch.autograd.Function):
    """relu(z) forward; grad · sigmoid(α z) backward (itself differentiable in z and grad).

    Written with ``setup_context`` and ``generate_vmap_rule`` so torch.func transforms accept it
    (the batched runs of :mod:`datarecon.attacks.batched` vmap over a run axis); same operations
    as before, so the eager results are unchanged bit for bit.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(z: torch.Tensor, alpha: float) -> torch.Tensor:  # type: ignore[override]
        return z.clamp_min(0)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        z, alpha = inputs
        ctx.save_for_backward(z)
        ctx.alpha = alpha

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


def _replace_relus(module: nn.Module, alpha: float, cls: type[SurrogateReLU] = SurrogateReLU) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.ReLU):
            setattr(module, name, cls(alpha))
        else:
            _replace_relus(child, alpha, cls)


def plain_surrogate_relu(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """:func:`surrogate_relu` in plain ops: relu(z).detach() + s − s.detach(), s' = sigmoid(αz).

    s(z) = softplus(αz)/α, evaluated as z + softplus(−αz)/α for z ≥ 0 (softplus of a non-positive
    argument: no overflow, no threshold), so ds/dz = sigmoid(αz) (0.5 at z = 0) and
    d²s/dz² = α·σ(1 − σ): the same value, derivative and second derivative as the autograd.Function.
    """
    pos = z >= 0
    s = torch.where(pos, z + nn.functional.softplus(-alpha * z) / alpha,
                    nn.functional.softplus(alpha * z) / alpha)
    return torch.relu(z).detach() + (s - s.detach())


class PlainSurrogateReLU(SurrogateReLU):
    """:class:`SurrogateReLU` written in plain ops (torch.func / torch.compile friendly)."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return plain_surrogate_relu(z, self.alpha)


def functional_surrogate(name: str, model: nn.Module, *, alpha: float) -> nn.Module:
    """``make_surrogate(name, ...)`` without autograd.Functions (``relu``, ``sigmoid-surrogate``).

    Raises:
        DataReconError: another surrogate (it has no plain-ops form here).
    """
    SURROGATES.get(name)
    if name == "relu":
        return model
    if name != "sigmoid-surrogate":
        raise DataReconError(f"surrogate {name!r} has no torch.func form; use relu or sigmoid-surrogate, "
                             "or run without compile")
    out = copy.deepcopy(model)
    _replace_relus(out, float(alpha), cls=PlainSurrogateReLU)
    return out


def count_relus(model: nn.Module) -> int:
    """Number of ``nn.ReLU`` submodules (0 means a surrogate changes nothing)."""
    return sum(isinstance(m, nn.ReLU) for m in model.modules())


_FUNCTIONAL_RELUS = {torch.relu, torch.nn.functional.relu, torch.relu_, torch.nn.functional.relu_}


def count_functional_relus(model: nn.Module) -> int | None:
    """ReLUs applied as functions (``torch.relu``, ``F.relu``, ``Tensor.relu``) in ``model``'s forward.

    The surrogate cannot replace these: it swaps ``nn.ReLU`` submodules only. Found by tracing the
    forward symbolically with ``torch.fx`` (nothing is executed on data).

    Returns:
        The number of such calls, or None when the forward cannot be traced (data-dependent control
        flow); then nothing is known.
    """
    import torch.fx

    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - untraceable forwards are allowed; we just cannot tell
        return None
    return sum((n.op == "call_function" and n.target in _FUNCTIONAL_RELUS)
               or (n.op == "call_method" and n.target in ("relu", "relu_")) for n in graph.nodes)


SurrogateFactory = Callable[[nn.Module, float], nn.Module]
SURROGATES: Registry[SurrogateFactory] = Registry("surrogate")
SURROGATES.register("relu", lambda model, alpha: model)
SURROGATES.register("sigmoid-surrogate", with_surrogate)


def make_surrogate(name: str, model: nn.Module, *, alpha: float) -> nn.Module:
    """The model evaluated with activation ``name`` (a key of :data:`SURROGATES`)."""
    return SURROGATES.get(name)(model, alpha)
