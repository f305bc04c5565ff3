"""Typed architecture specs and the architecture registry.

An :class:`ArchSpec` is saved with the weights, so a model can be rebuilt from
its files alone. Architectures (Runkel et al. 2024 eq. 8 and 9; Haim et al. 2022):

* ``affine``: Φ(x) = x·θ_wᵀ + θ_b (Runkel eq. 8).
* ``one-hidden``: Φ(x) = σ(x·θ_w1ᵀ + θ_b1)·θ_w2ᵀ + θ_b2, σ = ReLU, default width 6144 (eq. 9).
* ``mlp``: D-h1-...-hk-C ReLU MLP, default hidden (1000, 1000), biases optional, the first
  layer's weights drawn N(0, 1)·``init_scale`` when given (Haim: 1e-4; matters for the KKT regime).
* ``cnn``: ReLU convolutional network, ``hidden`` = channels per convolution (default (32, 64)),
  square kernel ``kernel`` (default 3), stride 2 and padding ⌊kernel/2⌋ (each layer halves the
  spatial size, rounding up), then one linear read-out. Without biases it is positively
  homogeneous of degree L = #conv + 1 (Φ(x; c·θ) = c^L Φ(x; θ)), the setting of the KKT attack
  (Buzaglo et al. 2023 reconstruct from such CNNs).
* ``resnet8`` / ``resnet18``: residual networks for CIFAR-sized images (He et al. 2016): a 3×3
  stem convolution, stages of basic blocks relu(conv(relu(conv(h))) + shortcut(h)) whose widths are
  ``hidden`` (defaults (16, 32, 64), one block per stage, 8 weight layers; and (64, 128, 256, 512),
  two blocks per stage, 18 weight layers, the CIFAR ResNet-18 of SimuDy's reference code), the first
  block of every later stage striding 2 with a 1×1 projection shortcut, then global average pooling
  and a linear read-out. By default **no normalisation layer**, so a model has parameters and no
  buffers. ``batch_norm=True`` puts a batch norm after every convolution (the stem's, both of a
  block's and the projection shortcut's; He et al.'s conv-BN-ReLU order), as SimuDy's ResNet-18
  has: its running mean and variance are buffers, saved with the weights. Trained from scratch it
  runs in train mode (batch statistics); fine-tuned from a pretrained model it runs in eval mode,
  SimuDy's setting, where it is a fixed per-channel affine map whose scale and shift (the affine
  weights) are trained and whose statistics stay the pretrained ones
  (:func:`datarecon.kernel.step.train_step` reads them as constants). Residual sums of branches of
  different degree make a ResNet not homogeneous, with or without biases.

All models take images (N, C, H, W) in model input space; the MLPs start with ``nn.Flatten``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
from pydantic import ConfigDict, Field, field_validator
from torch import nn

from datarecon.config import RecordedConfig
from datarecon.errors import DataReconError
from datarecon.registry import Registry


class ArchSpec(RecordedConfig):
    """Architecture of a target model.

    Attributes:
        name: registry key (``affine``, ``one-hidden``, ``mlp``).
        input_shape: (C, H, W) of one input.
        num_outputs: 1 for binary/regression, k for k-class models.
        hidden: hidden widths; ``None`` means the architecture's default.
        bias: whether linear layers have biases.
        init_scale: std of the first layer's N(0, 1) weights; ``None``: PyTorch's default init.
        kernel: side of the square convolution kernel (``cnn`` only; ``None``: 3; the ResNets use 3).
        batch_norm: a batch norm after every convolution (the ResNets only).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    added_fields: ClassVar[tuple[str, ...]] = ("batch_norm",)  # off: model.json and hashes as before

    name: str = "mlp"
    input_shape: tuple[int, ...] = (1, 8, 8)
    num_outputs: int = Field(default=1, ge=1)
    hidden: tuple[int, ...] | None = None
    bias: bool = True
    init_scale: float | None = None
    kernel: int | None = Field(default=None, ge=1)
    batch_norm: bool = False


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

    def resolved_kernel(self) -> int:
        """Convolution kernel side (``cnn``), default :data:`DEFAULT_KERNEL`."""
        return self.kernel if self.kernel is not None else DEFAULT_KERNEL


#: default kernel side of the ``cnn`` architecture
DEFAULT_KERNEL = 3
#: stride of every convolution of the ``cnn`` architecture
CNN_STRIDE = 2


class ArchEntry:
    """A registered architecture: its default hidden widths and whether widths may change.

    ``convolutional``: ``hidden`` lists channels (of stride-2 convolutions, or of residual stages);
    ``blocks``: residual basic blocks per stage (``None``: not a ResNet).
    """

    def __init__(self, *, default_hidden: tuple[int, ...], n_hidden: int | None, doc: str,
                 convolutional: bool = False, blocks: int | None = None) -> None:
        self.default_hidden = default_hidden
        self.n_hidden = n_hidden  # None: any number of hidden layers
        self.doc = doc
        self.convolutional = convolutional or blocks is not None
        self.blocks = blocks


ARCHITECTURES: Registry[ArchEntry] = Registry("architecture")
ARCHITECTURES.register("affine", ArchEntry(default_hidden=(), n_hidden=0, doc="Runkel eq. 8"))
ARCHITECTURES.register("one-hidden", ArchEntry(default_hidden=(6144,), n_hidden=1, doc="Runkel eq. 9"))
ARCHITECTURES.register("mlp", ArchEntry(default_hidden=(1000, 1000), n_hidden=None, doc="Haim D-1000-1000-C"))
ARCHITECTURES.register("cnn", ArchEntry(default_hidden=(32, 64), n_hidden=None, convolutional=True,
                                        doc="ReLU CNN, stride-2 convolutions then a linear read-out"))
ARCHITECTURES.register("resnet8", ArchEntry(default_hidden=(16, 32, 64), n_hidden=None, blocks=1,
                                            doc="ResNet-8-like: 3 stages of 1 basic block"))
ARCHITECTURES.register("resnet18", ArchEntry(default_hidden=(64, 128, 256, 512), n_hidden=None, blocks=2,
                                             doc="CIFAR ResNet-18: 4 stages of 2 basic blocks"))

#: the kernel side of every ResNet convolution but the 1×1 projection shortcuts
RESNET_KERNEL = 3


class _BasicBlock(nn.Module):
    """relu(conv2(relu(conv1(h))) + shortcut(h)); conv1 strides ``stride``, the shortcut is the identity or,
    when the stride or the width changes, a 1×1 convolution with that stride. With ``batch_norm`` each
    convolution is followed by a batch norm (``bn1``, ``bn2``; the projection shortcut is
    ``Sequential(conv, bn)``)."""

    def __init__(self, cin: int, cout: int, stride: int, *, bias: bool, dtype: torch.dtype,
                 device: torch.device | str | None, batch_norm: bool = False) -> None:
        super().__init__()
        k = RESNET_KERNEL
        self.conv1 = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=bias, dtype=dtype, device=device)
        self.conv2 = nn.Conv2d(cout, cout, k, stride=1, padding=k // 2, bias=bias, dtype=dtype, device=device)
        self.bn1 = _batch_norm(cout, batch_norm, dtype=dtype, device=device)
        self.bn2 = _batch_norm(cout, batch_norm, dtype=dtype, device=device)
        if stride != 1 or cin != cout:
            proj = nn.Conv2d(cin, cout, 1, stride=stride, bias=bias, dtype=dtype, device=device)
            self.shortcut = nn.Sequential(proj, nn.BatchNorm2d(cout, dtype=dtype, device=device)) if batch_norm else proj
        else:
            self.shortcut = nn.Identity()
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()  # modules, so the KKT surrogate can replace them

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.conv1(h)
        a = self.relu1(a if self.bn1 is None else self.bn1(a))
        b = self.conv2(a)
        return self.relu2((b if self.bn2 is None else self.bn2(b)) + self.shortcut(h))


def _batch_norm(channels: int, on: bool, *, dtype: torch.dtype, device: torch.device | str | None) -> nn.Module | None:
    """A ``BatchNorm2d`` (weight 1, bias 0, running mean 0, variance 1) when ``on``, else None (no module,
    so a ResNet without batch norm has exactly the modules and state-dict names it always had)."""
    return nn.BatchNorm2d(channels, dtype=dtype, device=device) if on else None


class ResNet(nn.Module):
    """A ResNet of ``resnet8`` / ``resnet18`` (see the module docstring); input (N, C, H, W), output (N, k).

    Modules: ``stem`` (3×3 conv; with batch norm followed by ``stem_bn``), ``stages.i.j`` (basic
    blocks), ``head`` (linear read-out after the global average pool). Built uninitialised;
    :func:`build_model` draws the weights.
    """

    def __init__(self, spec: ArchSpec, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        entry = ARCHITECTURES.get(spec.name)
        widths, k = spec.resolved_hidden(), RESNET_KERNEL
        self.stem = nn.Conv2d(spec.input_shape[0], widths[0], k, padding=k // 2, bias=spec.bias, dtype=dtype,
                              device=device)
        self.stem_bn = _batch_norm(widths[0], spec.batch_norm, dtype=dtype, device=device)
        stages, cin = [], widths[0]
        for i, width in enumerate(widths):
            blocks = []
            for j in range(entry.blocks or 1):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(_BasicBlock(cin, width, stride, bias=spec.bias, dtype=dtype, device=device,
                                          batch_norm=spec.batch_norm))
                cin = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, spec.num_outputs, bias=spec.bias, dtype=dtype, device=device)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = self.stages(self.relu(h if self.stem_bn is None else self.stem_bn(h)))
        return self.head(h.mean(dim=(2, 3)))


def conv_output_size(size: int, kernel: int) -> int:
    """Spatial size after one ``cnn`` convolution: ⌊(size + 2⌊k/2⌋ − k) / 2⌋ + 1."""
    return (size + 2 * (kernel // 2) - kernel) // CNN_STRIDE + 1


def _cnn_layers(spec: ArchSpec) -> list[tuple[str, tuple[int, ...]]]:
    """[("conv", (in, out, k)) ..., ("linear", (in_features, out))] of a ``cnn`` spec."""
    if len(spec.input_shape) != 3:
        raise DataReconError(f"architecture cnn needs image inputs (C, H, W), got input_shape {list(spec.input_shape)}")
    k = spec.resolved_kernel()
    c, h, w = spec.input_shape
    layers: list[tuple[str, tuple[int, ...]]] = []
    for out in spec.resolved_hidden():
        layers.append(("conv", (c, out, k)))
        c, h, w = out, conv_output_size(h, k), conv_output_size(w, k)
    layers.append(("linear", (c * h * w, spec.num_outputs)))
    return layers


def build_model(spec: ArchSpec, *, generator: torch.Generator | None = None,
                dtype: torch.dtype = torch.float32) -> nn.Module:
    """Build the network of ``spec`` with freshly initialised weights.

    Args:
        spec: the architecture.
        generator: randomness for the initialisation (same seed, same weights).
        dtype: parameter dtype.

    Returns:
        ``nn.Sequential(Flatten, Linear, ReLU, ..., Linear)`` (a ``cnn``: convolutions first; a ResNet:
        :class:`ResNet`); input (N, *input_shape), output (N, num_outputs).
    """
    entry = ARCHITECTURES.get(spec.name)
    if spec.batch_norm and entry.blocks is None:
        resnets = [n for n in ARCHITECTURES.names() if ARCHITECTURES.get(n).blocks is not None]
        raise DataReconError(f"batch_norm applies to the ResNets ({', '.join(resnets)}), not {spec.name!r}; drop it")
    if entry.blocks is not None:
        return _build_resnet(spec, generator=generator, dtype=dtype)
    if entry.convolutional:
        return _build_cnn(spec, generator=generator, dtype=dtype)
    if spec.kernel is not None:
        raise DataReconError(f"kernel applies to convolutional architectures (cnn), not {spec.name!r}; drop it")
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


def _build_cnn(spec: ArchSpec, *, generator: torch.Generator | None, dtype: torch.dtype) -> nn.Sequential:
    """``Sequential(Conv2d, ReLU, ..., Conv2d, ReLU, Flatten, Linear)`` of a ``cnn`` spec."""
    layers: list[nn.Module] = []
    for kind, dims in _cnn_layers(spec):
        if kind == "conv":
            cin, cout, k = dims
            conv = nn.Conv2d(cin, cout, k, stride=CNN_STRIDE, padding=k // 2, bias=spec.bias, dtype=dtype)
            _init_linear(conv, generator=generator)
            layers += [conv, nn.ReLU()]
        else:
            lin = nn.Linear(dims[0], dims[1], bias=spec.bias, dtype=dtype)
            _init_linear(lin, generator=generator)
            layers += [nn.Flatten(), lin]
    if spec.init_scale is not None:
        with torch.no_grad():
            layers[0].weight.normal_(0.0, 1.0, generator=generator).mul_(spec.init_scale)  # type: ignore[operator]
    return nn.Sequential(*layers)


def _build_resnet(spec: ArchSpec, *, generator: torch.Generator | None, dtype: torch.dtype) -> ResNet:
    """A :class:`ResNet` initialised in module order as torchvision's ResNets are: every convolution's weights
    N(0, 2/fan_out) (He et al. 2015, ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``), biases and
    the read-out PyTorch's default (:func:`_init_linear`); ``init_scale``: the stem's weights
    N(0, 1)·init_scale instead. (PyTorch's default U(±1/√fan_in) for the convolutions too shrinks the
    signal at every convolution without batch norm, and the network does not train: docs/DESIGN.md.)"""
    if len(spec.input_shape) != 3:
        raise DataReconError(f"architecture {spec.name} needs image inputs (C, H, W), "
                             f"got input_shape {list(spec.input_shape)}")
    if spec.kernel is not None:
        raise DataReconError(f"the ResNets use {RESNET_KERNEL}x{RESNET_KERNEL} kernels; drop kernel for {spec.name}")
    model = ResNet(spec, dtype=dtype)
    for mod in model.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            _init_linear(mod, generator=generator)
        if isinstance(mod, nn.Conv2d):
            fan_out = mod.weight.shape[0] * math.prod(mod.weight.shape[2:])
            with torch.no_grad():
                mod.weight.normal_(0.0, math.sqrt(2.0 / fan_out), generator=generator)
    if spec.init_scale is not None:
        with torch.no_grad():
            model.stem.weight.normal_(0.0, 1.0, generator=generator).mul_(spec.init_scale)
    return model


def _init_linear(lin: nn.Linear | nn.Conv2d, *, generator: torch.Generator | None) -> None:
    """PyTorch's default Linear / Conv2d init (Kaiming-uniform a=√5: bound 1/√fan_in), drawn from ``generator``."""
    fan_in = math.prod(lin.weight.shape[1:])
    bound = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        lin.weight.uniform_(-bound, bound, generator=generator)
        if lin.bias is not None:
            lin.bias.uniform_(-bound, bound, generator=generator)


def state_shapes(spec: ArchSpec) -> dict[str, tuple[int, ...]]:
    """The names and shapes of what a model directory's weights file holds for ``spec``: the parameters
    (:func:`parameter_shapes`) and the floating buffers (batch norm's running mean and variance; its
    integer batch counter is not saved), computed without allocating storage."""
    shapes = parameter_shapes(spec)
    if spec.batch_norm and ARCHITECTURES.get(spec.name).blocks is not None:
        shapes.update({name: tuple(b.shape) for name, b in ResNet(spec, device="meta").named_buffers()
                       if b.dtype.is_floating_point})
    return shapes


def parameter_shapes(spec: ArchSpec) -> dict[str, tuple[int, ...]]:
    """The parameter names and shapes :func:`build_model` gives ``spec``, computed without building it
    (so a spec can be checked against a weights file before any memory is allocated)."""
    if ARCHITECTURES.get(spec.name).blocks is not None:  # built on the meta device: shapes, no storage
        return {name: tuple(p.shape) for name, p in ResNet(spec, device="meta").named_parameters()}
    if ARCHITECTURES.get(spec.name).convolutional:
        shapes: dict[str, tuple[int, ...]] = {}
        layer = 0  # Sequential(Conv2d, ReLU, ..., Conv2d, ReLU, Flatten, Linear)
        for kind, dims in _cnn_layers(spec):
            if kind == "linear":
                layer += 1  # the Flatten
                shapes[f"{layer}.weight"] = (dims[1], dims[0])
                out = dims[1]
            else:
                cin, out, k = dims
                shapes[f"{layer}.weight"] = (out, cin, k, k)
            if spec.bias:
                shapes[f"{layer}.bias"] = (out,)
            layer += 2
        return shapes
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
    return sum(math.prod(shape) for shape in parameter_shapes(spec).values())


def first_layer_init_std(spec: ArchSpec) -> float:
    """Standard deviation of the i.i.d. initialisation of the first dense (``nn.Linear``) layer.

    ``init_scale`` when it applies to that layer (MLP, affine, one-hidden), else PyTorch's
    Kaiming-uniform default U(−1/√fan_in, 1/√fan_in), whose std is 1/√(3·fan_in) (for a CNN the
    first dense layer is the read-out after the convolutions).
    """
    entry = ARCHITECTURES.get(spec.name)
    if entry.blocks is not None:
        return 1.0 / math.sqrt(3.0 * spec.resolved_hidden()[-1])  # the read-out after the average pool
    if entry.convolutional:
        fan_in = _cnn_layers(spec)[-1][1][0]
        return 1.0 / math.sqrt(3.0 * fan_in)
    if spec.init_scale is not None:
        return float(spec.init_scale)
    return 1.0 / math.sqrt(3.0 * spec.input_dim)


def is_homogeneous(spec: ArchSpec) -> bool:
    """Whether the architecture is positively homogeneous in its parameters, Φ(x; c·θ) = c^L Φ(x; θ) for c > 0
    (Lyu & Li 2020; the property the KKT conditions of Haim et al. 2022 rest on).

    Bias-free ReLU MLPs and CNNs are (L = their number of layers); with biases they are not, except a
    model without hidden layers: Wx + b is homogeneous of degree 1 in θ = (W, b). ResNets are not
    (a block adds a degree-2 branch to a degree-1 or degree-0 shortcut).
    """
    if ARCHITECTURES.get(spec.name).blocks is not None:
        return False
    hidden = spec.hidden if spec.hidden is not None else ARCHITECTURES.get(spec.name).default_hidden
    return not spec.bias or len(hidden) == 0


ModelFactory = Callable[[ArchSpec], nn.Module]
