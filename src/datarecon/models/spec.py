"""Typed architecture specs and the architecture registry.

An :class:`ArchSpec` is saved with the weights, so a model can be rebuilt from
its files alone. Architectures (Runkel et al. 2024 eq. 8 and 9; Haim et al. 2022):

* ``affine``: Φ(x) = x·θ_wᵀ + θ_b (Runkel eq. 8).
* ``one-hidden``: Φ(x) = σ(x·θ_w1ᵀ + θ_b1)·θ_w2ᵀ + θ_b2, σ = ReLU, default width 6144 (eq. 9).
* ``mlp``: D-h1-...-hk-C ReLU MLP, default hidden (1000, 1000), biases optional, the first
  layer's weights drawn N(0, 1)·``init_scale`` when given (Haim: 1e-4; matters for the KKT regime).

All models start with ``nn.Flatten`` so they take images (N, C, H, W) in model input space.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from datarecon.registry import Registry


class ArchSpec(BaseModel):
    """Architecture of a target model.

    Attributes:
        name: registry key (``affine``, ``one-hidden``, ``mlp``).
        input_shape: (C, H, W) of one input.
        num_outputs: 1 for binary/regression, k for k-class models.
        hidden: hidden widths; ``None`` means the architecture's default.
        bias: whether linear layers have biases.
        init_scale: std of the first layer's N(0, 1) weights; ``None``: PyTorch's default init.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "mlp"
    input_shape: tuple[int, ...] = (1, 8, 8)
    num_outputs: int = Field(default=1, ge=1)
    hidden: tuple[int, ...] | None = None
    bias: bool = True
    init_scale: float | None = None

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        ARCHITECTURES.get(v)  # raises DataReconError listing valid names
        return v

    @field_validator("input_shape")
    @classmethod
    def _shape(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(d < 1 for d in v):
            raise ValueError(f"input_shape must be positive sizes like [1, 28, 28], got {list(v)}")
        return v

    @field_validator("hidden")
    @classmethod
    def _widths(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and any(h < 1 for h in v):
            raise ValueError(f"hidden widths must be positive, got {list(v)}")
        return v

    @property
    def input_dim(self) -> int:
        return math.prod(self.input_shape)

    def resolved_hidden(self) -> tuple[int, ...]:
        """Hidden widths with the architecture's default filled in."""
        if self.hidden is not None:
            return tuple(self.hidden)
        return ARCHITECTURES.get(self.name).default_hidden


class ArchEntry:
    """A registered architecture: its default hidden widths and whether widths may change."""

    def __init__(self, *, default_hidden: tuple[int, ...], n_hidden: int | None, doc: str) -> None:
        self.default_hidden = default_hidden
        self.n_hidden = n_hidden  # None: any number of hidden layers
        self.doc = doc


ARCHITECTURES: Registry[ArchEntry] = Registry("architecture")
ARCHITECTURES.register("affine", ArchEntry(default_hidden=(), n_hidden=0, doc="Runkel eq. 8"))
ARCHITECTURES.register("one-hidden", ArchEntry(default_hidden=(6144,), n_hidden=1, doc="Runkel eq. 9"))
ARCHITECTURES.register("mlp", ArchEntry(default_hidden=(1000, 1000), n_hidden=None, doc="Haim D-1000-1000-C"))


def build_model(spec: ArchSpec, *, generator: torch.Generator | None = None,
                dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Build the network of ``spec`` with freshly initialised weights.

    Args:
        spec: the architecture.
        generator: randomness for the initialisation (same seed, same weights).
        dtype: parameter dtype.

    Returns:
        ``nn.Sequential(Flatten, Linear, ReLU, ..., Linear)``; input (N, *input_shape),
        output (N, num_outputs).
    """
    from datarecon.errors import DataReconError

    entry = ARCHITECTURES.get(spec.name)
    hidden = spec.resolved_hidden()
    if entry.n_hidden is not None and len(hidden) != entry.n_hidden:
        raise DataReconError(
            f"architecture {spec.name!r} has {entry.n_hidden} hidden layer(s), got hidden={list(hidden)}; "
            "use --arch mlp for other depths"
        )
    widths = [spec.input_dim, *hidden, spec.num_outputs]
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(len(widths) - 1):
        lin = nn.Linear(widths[i], widths[i + 1], bias=spec.bias, dtype=dtype)
        _init_linear(lin, generator=generator)
        layers.append(lin)
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    if spec.init_scale is not None:
        first: nn.Linear = layers[1]  # type: ignore[assignment]
        with torch.no_grad():
            first.weight.normal_(0.0, 1.0, generator=generator).mul_(spec.init_scale)
    return nn.Sequential(*layers)


def _init_linear(lin: nn.Linear, *, generator: torch.Generator | None) -> None:
    """PyTorch's default Linear init (Kaiming-uniform a=√5), drawn from ``generator``."""
    bound = 1.0 / math.sqrt(lin.in_features)
    with torch.no_grad():
        lin.weight.uniform_(-bound, bound, generator=generator)
        if lin.bias is not None:
            lin.bias.uniform_(-bound, bound, generator=generator)


def parameter_shapes(spec: ArchSpec) -> dict[str, tuple[int, ...]]:
    """The state-dict names and shapes :func:`build_model` gives ``spec``, computed without building it
    (so a spec can be checked against a weights file before any memory is allocated)."""
    widths = [spec.input_dim, *spec.resolved_hidden(), spec.num_outputs]
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layer = 1 + 2 * i  # Sequential(Flatten, Linear, ReLU, Linear, ...)
        shapes[f"{layer}.weight"] = (b, a)
        if spec.bias:
            shapes[f"{layer}.bias"] = (b,)
    return shapes


def count_parameters(spec: ArchSpec) -> int:
    """Number of parameters of ``spec`` without building it."""
    widths = [spec.input_dim, *spec.resolved_hidden(), spec.num_outputs]
    return sum(a * b + (b if spec.bias else 0) for a, b in zip(widths[:-1], widths[1:]))


def is_homogeneous(spec: ArchSpec) -> bool:
    """Bias-free ReLU MLPs are positively homogeneous: Φ(c·x) = c·Φ(x) for c > 0."""
    return not spec.bias


ModelFactory = Callable[[ArchSpec], nn.Module]
