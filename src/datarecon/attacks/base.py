"""The attack interface: what an attacker has, and what an attack returns.

An attack receives a :class:`Target` (architecture + θ*, loss, weight decay)
and an :class:`AttackerPrior` (candidate count m, labels, input shape and value
range). It never receives training images; those enter only through an
*initialisation* the user explicitly chooses for the paper's experiments
(ground truth / partition / mixture), and through evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.func import functional_call

from datarecon.errors import DataReconError
from datarecon.registry import Registry


@dataclass(frozen=True)
class Target:
    """The attacked model as the attacker sees it.

    Attributes:
        model: the architecture (any ``nn.Module``); its own parameters are not used by attacks,
            which call it functionally with ``params``.
        params: θ*, name -> tensor (detached).
        loss: the training loss name (``datarecon.training.losses.LOSSES``).
        weight_decay: the training weight decay (0 if none).
        input_shape: (C, H, W) of one input.
        num_outputs: model output size (1 binary/regression, k multiclass).
        homogeneous: True when Φ(c·x; θ) = c·Φ(x; θ) (bias-free ReLU MLP); the KKT attack assumes it.
        model_dir: where it was loaded from (for the run record), if anywhere.
    """

    model: nn.Module
    params: dict[str, torch.Tensor]
    loss: str
    weight_decay: float
    input_shape: tuple[int, ...]
    num_outputs: int
    homogeneous: bool = False
    model_dir: str | None = None

    def forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Φ(x; params) with ``params`` defaulting to θ*. x: (m, *input_shape) → (m, num_outputs)."""
        return functional_call(self.model, dict(params if params is not None else self.params), (x,))

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def to(self, *, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> Target:
        """A copy on ``device`` with floating tensors in ``dtype``."""
        model = self.model.to(device=device, dtype=dtype)
        params = {k: v.to(device=device, dtype=dtype) for k, v in self.params.items()}
        return Target(model=model, params=params, loss=self.loss, weight_decay=self.weight_decay,
                      input_shape=self.input_shape, num_outputs=self.num_outputs,
                      homogeneous=self.homogeneous, model_dir=self.model_dir)

    @classmethod
    def from_model_dir(cls, path: str | Path, *, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float64) -> Target:
        """Load the attacker's view of a model directory: weights, architecture, loss, weight decay.

        The training indices stored in the directory are deliberately not part of a Target.
        """
        from datarecon.models.checkpoint import load_model_dir
        from datarecon.models.spec import is_homogeneous

        b = load_model_dir(path, device=device, dtype=dtype)
        return cls(model=b.model, params=b.params, loss=b.loss, weight_decay=b.weight_decay,
                   input_shape=tuple(b.arch.input_shape), num_outputs=b.arch.num_outputs,
                   homogeneous=is_homogeneous(b.arch), model_dir=str(Path(path).resolve()))


@dataclass(frozen=True)
class AttackerPrior:
    """What the attacker assumes about the training set.

    Attributes:
        labels: (m,) candidate labels: float ±1 for binary/regression targets, int64 classes otherwise.
        input_shape: (C, H, W).
        lower, upper: per-pixel bounds of valid inputs in model input space (scalars or (C,H,W)),
            e.g. 0 − mean and 1 − mean for mean-subtracted images.
    """

    labels: torch.Tensor
    input_shape: tuple[int, ...]
    lower: torch.Tensor | float = 0.0
    upper: torch.Tensor | float = 1.0

    @property
    def m(self) -> int:
        return int(self.labels.shape[0])

    @staticmethod
    def balanced(*, m: int, num_outputs: int, input_shape: tuple[int, ...], lower: Any = 0.0,
                 upper: Any = 1.0, proportions: tuple[float, ...] | None = None) -> AttackerPrior:
        """m labels split by class proportions (default: balanced).

        Binary (num_outputs == 1): the first ⌈m/2⌉ labels are +1, the rest −1.
        Multiclass: class c gets ⌊m·p_c⌋ labels (remainder to the first classes), in class order.

        Raises:
            DataReconError: m < 1.
        """
        if m < 1:
            raise DataReconError(f"candidate count must be at least 1, got {m}; pass --candidates M with M >= 1")
        if num_outputs == 1:
            half = (m + 1) // 2
            labels = torch.cat([torch.ones(half), -torch.ones(m - half)]).double()
        else:
            p = torch.tensor(proportions if proportions is not None else [1.0] * num_outputs, dtype=torch.float64)
            if p.numel() != num_outputs or (p < 0).any() or p.sum() <= 0:
                raise DataReconError(
                    f"class proportions must be {num_outputs} non-negative numbers; got {list(p.tolist())}"
                )
            counts = torch.floor(p / p.sum() * m).long()
            counts[: m - int(counts.sum())] += 1  # distribute the remainder
            labels = torch.repeat_interleave(torch.arange(num_outputs), counts)
        return AttackerPrior(labels=labels, input_shape=tuple(input_shape), lower=lower, upper=upper)

    def check(self, target: Target) -> None:
        """Refuse labels inconsistent with the model's output size.

        Raises:
            DataReconError: labels of the wrong kind or out of range.
        """
        if self.m < 1:
            raise DataReconError("candidate count must be at least 1; pass --candidates M with M >= 1")
        if tuple(self.input_shape) != tuple(target.input_shape):
            raise DataReconError(f"prior input shape {self.input_shape} != model input shape {target.input_shape}")
        if target.num_outputs == 1:
            if not self.labels.dtype.is_floating_point:
                raise DataReconError("a single-output model needs float labels (+1/-1 or real targets)")
        else:
            if self.labels.dtype.is_floating_point:
                raise DataReconError(f"a {target.num_outputs}-output model needs integer class labels")
            if int(self.labels.min()) < 0 or int(self.labels.max()) >= target.num_outputs:
                raise DataReconError(
                    f"labels must lie in [0, {target.num_outputs}) for a {target.num_outputs}-output model; "
                    f"got range [{int(self.labels.min())}, {int(self.labels.max())}]"
                )


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
        status: a :class:`~datarecon.status.Status` value ("complete", "diverged", "stopped-early",
            "running").
        steps_done: optimisation steps completed.
    """

    x: torch.Tensor
    labels: torch.Tensor
    multipliers: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    status: str = "complete"
    steps_done: int = 0


class Attack(Protocol):
    """An attack: a frozen config plus ``run``."""

    def run(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
            generator: torch.Generator) -> Reconstruction: ...


ATTACKS: Registry[Any] = Registry("attack method")


class IterativeAttack(Protocol):
    """The stepping form every attack implements, so one runner can checkpoint and resume any attack.

    All mutable state (candidates, multipliers, optimiser buffers, inner θ, ...) lives in a flat
    ``dict[str, Tensor]`` so the runner can save it as safetensors and restore it bit-identically.
    ``step`` updates the state in place and returns scalar metrics; it must not apply a non-finite
    update (it returns the non-finite metric and leaves the state as it was, so the runner keeps
    the last finite state).

    Attributes:
        name: registry key (``kkt``, ``decoreco``, ``gradnorm``, ``bilevel``).
        config: the attack's frozen pydantic config (saved in run.json).
    """

    name: str
    config: Any

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]: ...

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]: ...

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Return (per-candidate attacker-side scores name -> (m,), summary scalars incl. selection)."""
        ...
