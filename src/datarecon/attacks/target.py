"""What an attacker has: the attacked model as it sees it (:class:`Target`) and what it assumes about the
training set (:class:`AttackerPrior`).

An attack receives a :class:`Target` (architecture + θ*, loss, weight decay) and an :class:`AttackerPrior`
(candidate count m, labels, input shape and value range). It never receives training images; those enter
only through an *initialisation* the user explicitly chooses for the paper's experiments (ground truth /
partition / mixture), and through evaluation.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from datarecon.attacks.surrogate import count_functional_relus
from datarecon.errors import DataReconError
from datarecon.models.byom import check_loss, check_outputs, check_parameters, measure_homogeneity
from datarecon.models.checkpoint import load_model_dir
from datarecon.models.spec import is_homogeneous


@dataclass(frozen=True)
class Target:
    """The attacked model as the attacker sees it.

    Attributes:
        model: the architecture (any ``nn.Module``); its own parameters are not used by attacks,
            which call it functionally with ``params``.
        params: θ*, name -> tensor (detached).
        loss: the training loss: a name (``datarecon.kernel.losses.LOSSES``) or, for a user's own
            model (:meth:`from_module`), a callable ``loss(outputs (m, k), labels (m,)) -> scalar``.
        weight_decay: the training weight decay (0 if none).
        input_shape: (C, H, W) of one input.
        num_outputs: model output size (1 binary/regression, k multiclass).
        homogeneous: True when Φ(x; c·θ) = c^L·Φ(x; θ) (bias-free ReLU MLP or CNN); the KKT attack
            assumes it. From the architecture for model directories, measured by :meth:`from_module`.
        model_dir: where it was loaded from (for the run record), if anywhere.
        value_range: (lower, upper) of valid inputs in model input space, when the target knows it
            (:meth:`from_module`); model directories keep it in their input mean instead.
    """

    model: nn.Module
    params: dict[str, torch.Tensor]
    loss: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    weight_decay: float
    input_shape: tuple[int, ...]
    num_outputs: int
    homogeneous: bool = False
    model_dir: str | None = None
    value_range: tuple[float, float] | None = None

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
                      homogeneous=self.homogeneous, model_dir=self.model_dir, value_range=self.value_range)

    @classmethod
    def from_module(cls, model: nn.Module, *, loss: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    input_shape: Sequence[int], value_range: tuple[float, float] = (0.0, 1.0),
                    labels: int | Sequence[Any] | None = None, weight_decay: float = 0.0) -> Target:
        """The attacker's view of any ``nn.Module`` (bring your own model), checked before an attack.

        The module's current parameters are θ*. It is copied and put in eval mode (``model`` itself
        is not changed). Homogeneity is measured, not trusted
        (:func:`datarecon.models.byom.measure_homogeneity`): a warning names the first layer that
        breaks Φ(x; c·θ) = c^L Φ(x; θ) (bias, non-ReLU activation, normalisation). A warning also
        names BatchNorm layers (run with their running statistics) and ReLUs applied as functions
        (the KKT surrogate cannot replace them).

        Args:
            model: the network; forward maps (m, *input_shape) to (m, k) logits (k = 1: binary or
                regression with labels ±1 / real; k ≥ 2: classes 0..k−1).
            loss: the training loss: a ``LOSSES`` name fitting k, or ``loss(outputs, labels) -> scalar``.
            input_shape: shape of one input, e.g. (3, 32, 32).
            value_range: (lower, upper) of valid inputs in model input space (e.g. (0, 1), or
                (−mean, 1 − mean) as scalars for mean-subtracted data); the attacks' pixel box.
            labels: the label set the attacker assumes: a class count or the labels themselves;
                None: from the output size. Checked against k (two labels for k = 1).
            weight_decay: the training weight decay wd in E = mean L + (wd/2)‖θ‖².

        Returns:
            A :class:`Target` with ``value_range`` set (see :meth:`prior`).

        Raises:
            DataReconError: non-float parameters, a forward that fails on (2, *input_shape) or returns
                anything but (m, k) floats (an (m,) output names the fix), a loss that does not fit,
                a loss callable with the wrong signature, labels that do not fit k, a bad value range.
        """
        if not isinstance(model, nn.Module):
            raise DataReconError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        shape = tuple(int(d) for d in input_shape)
        if not shape or any(d < 1 for d in shape):
            raise DataReconError(f"input_shape must be positive sizes like (3, 32, 32), got {tuple(input_shape)}")
        lo, hi = (float(v) for v in value_range)
        if not lo < hi:
            raise DataReconError(f"value_range must be (lower, upper) with lower < upper, got {tuple(value_range)}")
        if not math.isfinite(float(weight_decay)) or weight_decay < 0:
            raise DataReconError(f"weight_decay must be a finite number >= 0 (--weight-decay), got {weight_decay}")
        net = copy.deepcopy(model).eval()
        params = {k: v.detach() for k, v in net.named_parameters()}
        check_parameters(params)
        k = check_outputs(net, params, shape, value_range=(lo, hi))
        if labels is not None:
            count = labels if isinstance(labels, int) else len(list(labels))
            if count != (2 if k == 1 else k):
                raise DataReconError(f"{count} labels do not fit a model with {k} output(s); "
                                     f"a {k}-output model takes {2 if k == 1 else k} labels")
        check_loss(loss, k)
        norms = [n for n, m in net.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if norms:
            warnings.warn(f"the model has BatchNorm layers ({', '.join(norms[:3])}); attacks run it in eval mode "
                          "with the running statistics, and normalisation breaks the homogeneity the KKT "
                          "attack assumes", stacklevel=2)
        calls = count_functional_relus(net)
        if calls:
            warnings.warn(f"the model applies ReLU as a function in forward ({calls} call(s)); the KKT surrogate "
                          "replaces nn.ReLU modules only: write them as nn.ReLU modules", stacklevel=2)
        h = measure_homogeneity(net, params, shape, value_range=(lo, hi))
        if not h.homogeneous:
            warnings.warn(f"the model is not positively homogeneous in its parameters (relative error "
                          f"{h.rel_error:.2g} at the output); first break: {h.first_break}. The KKT "
                          "conditions of Haim et al. assume a homogeneous ReLU network", stacklevel=2)
        return cls(model=net, params=params, loss=loss, weight_decay=float(weight_decay), input_shape=shape,
                   num_outputs=k, homogeneous=h.homogeneous, value_range=(lo, hi))

    def prior(self, m: int, *, proportions: tuple[float, ...] | None = None) -> AttackerPrior:
        """m balanced labels (or in ``proportions``) and the pixel box of ``value_range``.

        Raises:
            DataReconError: the target has no value range (model directories: use
                :func:`datarecon.experiments.reconstruct.prepare`), or m < 1.
        """
        if self.value_range is None:
            raise DataReconError("this target has no value_range; build it with Target.from_module(..., value_range=...) "
                                 "or use experiments.reconstruct.prepare for a model directory")
        lo, hi = self.value_range
        return AttackerPrior.balanced(m=m, num_outputs=self.num_outputs, input_shape=self.input_shape,
                                      lower=lo, upper=hi, proportions=proportions)

    @classmethod
    def from_model_dir(cls, path: str | Path, *, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float64) -> Target:
        """Load the attacker's view of a model directory: weights, architecture, loss, weight decay.

        The training indices stored in the directory are deliberately not part of a Target.
        """
        b = load_model_dir(path, device=device, dtype=dtype)
        return cls(model=b.model, params=b.params, loss=b.loss, weight_decay=b.weight_decay,
                   input_shape=tuple(b.arch.input_shape), num_outputs=b.arch.num_outputs,
                   homogeneous=is_homogeneous(b.arch), model_dir=str(Path(path).resolve()))


def check_weight_scale(target: Target) -> float:
    """‖θ*‖² of ``target`` (computed in float64), when the attack's residuals can hold it.

    Every attack of the KKT family compares θ* with a combination g of candidate gradients
    through ‖θ* − g‖², in the parameters' dtype. Weights scaled far beyond a trained network's
    (θ* × 10³⁰) overflow that at the first step; refusing them here names the weights, not the
    step sizes, as the cause.

    Raises:
        DataReconError: ‖θ*‖² is beyond the range of the parameters' dtype (or not finite in float64).
    """
    sq = sum(float(p.detach().double().square().sum()) for p in target.params.values())
    dtype = next(iter(target.params.values())).dtype if target.params else torch.float64
    largest = torch.finfo(dtype).max
    if not (sq <= largest):
        name = str(dtype).replace("torch.", "")
        raise DataReconError(f"the weights' squared norm ||theta*||^2 = {sq:.3g} is beyond the range of {name} "
                             f"({largest:.3g}), so no attack residual can be computed: the weights are not a trained "
                             "network at this scale (scaled or damaged); check the weights file"
                             + (", or attack in --dtype float64" if dtype != torch.float64 else ""))
    return sq


@dataclass(frozen=True)
class AttackerPrior:
    """What the attacker assumes about the training set, and what it knows beyond the weights.

    Attributes:
        labels: (m,) candidate labels: float ±1 for binary/regression targets, int64 classes otherwise.
        input_shape: (C, H, W).
        lower, upper: per-pixel bounds of valid inputs in model input space (scalars or (C,H,W)),
            e.g. 0 − mean and 1 − mean for mean-subtracted images.
        known_init: θ_init when the attacker knows it (:class:`datarecon.attacks.knowledge.KnownInit`),
            else None (the weights-only attacker of the papers).
        n: the training-set size when the attacker knows it, else None.
        subspace: the first dense layer's training subspace (:class:`datarecon.attacks.subspace.
            SubspaceAnalysis`), computed from the weights (and ``known_init``) before the attack,
            or None.
        recipe: the training recipe when the attacker knows it (:class:`datarecon.attacks.knowledge.
            KnownRecipe`), else None.
        public: the principal subspace of the attacker's public images (:class:`datarecon.attacks.public.
            PublicSubspace`) when the public-data prior is weighed, else None.
    """

    labels: torch.Tensor
    input_shape: tuple[int, ...]
    lower: torch.Tensor | float = 0.0
    upper: torch.Tensor | float = 1.0
    known_init: Any = None
    n: int | None = None
    subspace: Any = None
    recipe: Any = None
    public: Any = None

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


__all__ = ["AttackerPrior", "Target", "check_weight_scale"]
