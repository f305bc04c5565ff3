"""The attack interface: what an attacker has, and what an attack returns.

An attack receives a :class:`Target` (architecture + θ*, loss, weight decay)
and an :class:`AttackerPrior` (candidate count m, labels, input shape and value
range). It never receives training images; those enter only through an
*initialisation* the user explicitly chooses for the paper's experiments
(ground truth / partition / mixture), and through evaluation.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer
from torch import nn
from torch.func import functional_call

from datarecon.attacks.optim import (
    OPTIMIZERS,
    OptimizerSettings,
    finite_rows,
    init_optimizer_state,
    optimizer_step,
)
from datarecon.attacks.grouped import CROSS_RUN_PRIORS, CoupledGroup
from datarecon.attacks.priors import PriorInput, add_priors, weighted_priors
from datarecon.attacks.surrogate import count_functional_relus
from datarecon.config import MAX_STEPS, drop_defaults
from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions
from datarecon.kernel.status import Status
from datarecon.models.byom import check_loss, check_outputs, check_parameters, measure_homogeneity
from datarecon.models.checkpoint import load_model_dir
from datarecon.models.spec import is_homogeneous
from datarecon.registry import Registry, registered
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.io import to_jsonable

#: An attack run's loop settings by default: a history row every 10 steps, a checkpoint every 100
#: (and at the end), a progress display.
ATTACK_LOOP = LoopOptions(log_every=10, progress=True, checkpoint_every=100)


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
    """

    labels: torch.Tensor
    input_shape: tuple[int, ...]
    lower: torch.Tensor | float = 0.0
    upper: torch.Tensor | float = 1.0
    known_init: Any = None
    n: int | None = None
    subspace: Any = None
    recipe: Any = None

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
        status: a :class:`~datarecon.kernel.status.Status` value ("complete", "diverged", "stopped-early",
            "running").
        steps_done: optimisation steps completed.
    """

    x: torch.Tensor
    labels: torch.Tensor
    multipliers: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    status: str = Status.COMPLETE
    steps_done: int = 0


@dataclass(frozen=True)
class AttackSetup:
    """What one attack run starts from: the attacker's view of the target, its prior, x₀ and its randomness.

    Attributes:
        target: the attacked model (θ*, architecture, loss, weight decay).
        prior: labels (m,), input shape and pixel box (model input space).
        x0: (m, C, H, W) initial candidates in model input space (:func:`datarecon.attacks.init.make_init`).
        generator: the run's seeded generator (the attack's own initial state, e.g. λ₀); its state
            is checkpointed with the run.
        record: what run.json records about the set-up besides the attack (e.g. the seed, the init
            name and parameters, m, the device).
    """

    target: Target
    prior: AttackerPrior
    x0: torch.Tensor
    generator: torch.Generator
    record: Mapping[str, Any] = field(default_factory=dict)


ATTACKS: Registry[type[Attack]] = Registry("attack method")

#: what a run's failure message tells the user to lower when an attack does not say (the default
#: step's one step size)
DEFAULT_DIVERGENCE_HINT = "lower the step size lr_x"


#: prior weight fields added after runs were recorded: left out of config dumps at their default 0
PRIOR_FIELDS = ("feature_stats_weight", "group_weight")


class AttackConfig(BaseModel):
    """The fields every attack built on :class:`Attack`'s default step has: steps, the candidates' step
    size and optimiser, the priors' weights and the precision. An attack's own config subclasses it.

    Attributes:
        steps: optimisation steps, in [0, MAX_STEPS].
        lr_x: step size of the candidates x, > 0.
        optimizer: a key of :data:`datarecon.attacks.optim.OPTIMIZERS`.
        momentum, nesterov: SGD's momentum in [0, 1) and Nesterov flag.
        adam_beta1, adam_beta2, adam_eps: Adam's constants.
        box_weight: weight of the pixel-box prior (:data:`datarecon.attacks.priors.PRIORS` ``box``), >= 0.
        feature_stats_weight: weight of the feature-statistics prior of batch-norm targets (``feature_stats``), >= 0.
        group_weight: weight of group consistency across runs stepped together (``group``), >= 0.
        dtype: the attack's precision.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    steps: int = Field(default=1000, ge=0, le=MAX_STEPS, description="optimisation steps")
    lr_x: float = Field(default=0.1, gt=0, description="learning rate of the candidates x")
    optimizer: Annotated[str, registered(OPTIMIZERS)] = Field(default="sgd", description="key of attacks.optim.OPTIMIZERS")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum")
    nesterov: bool = Field(default=False, description="Nesterov momentum (optimizer sgd)")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam's β1 (optimizer adam)")
    adam_beta2: float = Field(default=0.999, ge=0, lt=1, description="Adam's β2 (optimizer adam)")
    adam_eps: float = Field(default=1e-8, gt=0, description="Adam's ε (optimizer adam)")
    box_weight: float = Field(default=1.0, ge=0, description="weight of the pixel-box prior")
    feature_stats_weight: float = Field(default=0.0, ge=0, description="weight of the feature-statistics prior "
                                        "(batch-norm targets)")
    group_weight: float = Field(default=0.0, ge=0, description="weight of group consistency across --runs")
    dtype: Literal["float32", "float64"] = Field(default="float32", description="float32 | float64")

    @model_serializer(mode="wrap")
    def _drop_unset_priors(self, handler):  # type: ignore[no-untyped-def]
        # config hashes of runs written before these priors existed stay what they were
        return drop_defaults(self, handler(self), PRIOR_FIELDS)

    def optimizer_settings(self) -> OptimizerSettings:
        """The optimiser's constants (:class:`~datarecon.attacks.optim.OptimizerSettings`)."""
        return OptimizerSettings(momentum=self.momentum, nesterov=self.nesterov, beta1=self.adam_beta1,
                                 beta2=self.adam_beta2, eps=self.adam_eps)


def config_dict(config: Any) -> dict[str, Any]:
    """A config as a JSON-able mapping (pydantic models, dataclasses or mappings)."""
    if config is None:
        return {}
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    if isinstance(config, dict):
        return to_jsonable(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return to_jsonable(dataclasses.asdict(config))
    raise TypeError(f"cannot serialise attack config of type {type(config).__name__}")


def apply_if_finite(optimizer: str, settings: OptimizerSettings, state: dict[str, torch.Tensor],
                    grads: dict[str, torch.Tensor], lrs: dict[str, float], metrics: dict[str, float], *,
                    norms: Mapping[str, float] | None = None) -> dict[str, float]:
    """The one finiteness rule of a step: apply the ``optimizer`` update of ``grads`` to ``state``
    only when the step's loss and the whole update are finite.

    Args:
        optimizer: a key of :data:`~datarecon.attacks.optim.OPTIMIZERS`; settings: its constants.
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


def commit_update(config: Any, state: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                  lrs: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
    """:func:`apply_if_finite` with the optimiser of ``config`` (``optimizer``, ``optimizer_settings()``)."""
    return apply_if_finite(config.optimizer, config.optimizer_settings(), state, grads, lrs, metrics)


def committed_metrics(metrics: dict[str, float], grad_norms: Mapping[str, float] | None) -> dict[str, float]:
    """A step's metrics once its update was applied (``grad_norm_<var>``: the norms of the gradients
    it applied) or, ``grad_norms`` None, refused as not finite (``update`` NaN: NaNStop trips and the
    state keeps its last finite value)."""
    if grad_norms is None:
        metrics["update"] = float("nan")
        return metrics
    metrics.update({f"grad_norm_{k}": v for k, v in grad_norms.items()})
    return metrics


class Attack:
    """The attack interface: everything generic code (the runner, batching, the run record, the
    threat model) needs from an attack is declared here, typed, with its default.

    A new attack subclasses it, sets ``name`` and ``config_cls`` (a subclass of :class:`AttackConfig`
    when it uses the default step) and writes :meth:`objective`; registering it in :data:`ATTACKS`
    makes it a method of ``datarecon reconstruct``, run files, ``--runs K``, ``--resume`` and
    ``evaluate`` (:func:`datarecon.attacks.runner.run_attack` runs one in memory or into a run
    directory). An attack with more state than the candidates (multipliers, an inner θ, a learned
    lr) overrides :meth:`init_state` and :meth:`step`.

    State: every mutable tensor of a run lives in one flat ``dict[str, Tensor]`` (at least ``"x"``
    (m, C, H, W), the optimiser's ``opt.*`` buffers and what the attack adds, e.g. its per-candidate
    weights, read through :meth:`multipliers`), so the runner
    checkpoints and restores it bit for bit. A step updates it in place and never applies a
    non-finite update (:func:`commit_update`).

    Class attributes:
        name: the registry key.
        config_cls: the frozen pydantic config (saved in run.json and hashed for resume).
        uses: what the attack uses of the attacker's knowledge (items of
            :data:`datarecon.attacks.knowledge.KNOWLEDGE_ITEMS`; recorded in the threat model).
        requires: the knowledge a run must give (refused without it).
        divergence_hint: which settings the message of a diverged run tells the user to lower.
        resume_ignore: config fields that may differ when a run is resumed (``steps``: extend a run).
        subspace_candidates: the attack can keep its candidates in the training subspace
            (:meth:`uses_subspace`; run.json then records what it did).
        step_size_fields: the config's step sizes, scaled together by the step-size probe
            (:mod:`datarecon.attacks.probe`); empty: the attack is not probed.
        early_stop_metric: the step metric an early stop watches for a plateau (it must decrease as the
            attack progresses; None: the attack has none, and an early stop is refused).
        early_stop_reason: the stop reason a run stopped by that plateau records (run.json ``stop_reason``).
        progress_keys: the step metrics the progress line shows, in order (a key a step does not log is
            left out).
        progress_labels: how the progress line names a metric, where not by its key.
    """

    name: ClassVar[str] = ""
    config_cls: ClassVar[type[Any]] = AttackConfig
    uses: ClassVar[tuple[str, ...]] = ("weights",)
    requires: ClassVar[tuple[str, ...]] = ()
    divergence_hint: ClassVar[str] = DEFAULT_DIVERGENCE_HINT
    resume_ignore: ClassVar[tuple[str, ...]] = ("steps",)
    subspace_candidates: ClassVar[bool] = False
    step_size_fields: ClassVar[tuple[str, ...]] = ("lr_x",)
    early_stop_metric: ClassVar[str | None] = "loss"
    early_stop_reason: ClassVar[str] = "stopped early: loss plateau"
    progress_keys: ClassVar[tuple[str, ...]] = ("loss", "box")
    progress_labels: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.config_cls()
        if not isinstance(self.config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}, "
                            f"got {type(self.config).__name__}")

    @classmethod
    def from_config(cls, config: Any) -> Attack:
        """Build the attack from its validated config (the ATTACKS registry's constructor)."""
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        """The attack's precision (``config.dtype``)."""
        return torch_dtype(self.config.dtype)

    # -- what generic code asks ------------------------------------------------------------------

    def hashed_config(self, target: Target | None = None) -> dict[str, Any]:
        """The config fields that identify a run for resume: all but ``resume_ignore``. An attack whose
        fields resolve against the target (``formulation: auto``) hashes what they resolve to."""
        ignore = set(self.resume_ignore)
        return {k: v for k, v in config_dict(self.config).items() if k not in ignore}

    def uses_subspace(self, prior: AttackerPrior) -> bool:
        """Whether this run keeps its candidates in the prior's training subspace."""
        return False

    def batch_key(self, target: Target, prior: AttackerPrior) -> tuple[Any, ...] | None:
        """Runs with equal keys share one stacked step (:meth:`stacked_group`); None: stepped alone.
        By default runs are stepped alone unless a prior couples them (``group_weight`` > 0): then runs
        of one config form one :class:`~datarecon.attacks.grouped.CoupledGroup`."""
        if not self.coupled():
            return None
        return ("coupled", json.dumps(config_dict(self.config), sort_keys=True))

    def coupled(self) -> bool:
        """Whether the config weighs a prior that reads every run of a group (``group_weight`` > 0)."""
        return any(name in CROSS_RUN_PRIORS for name in weighted_priors(self.config))

    def stacked_group(self, runs: Mapping[int, Any]) -> Any:
        """The stacked step of runs with one :meth:`batch_key` (run index → opened run): an object with
        ``rows``, ``gradients(target)`` and ``commit(target, requests, ...)``
        (:mod:`datarecon.attacks.batched`). Only called when :meth:`batch_key` is not None; the default
        couples the runs' own steps (:meth:`step_gradients`, :meth:`apply_step`) by the cross-run priors."""
        return CoupledGroup.of(runs)

    # -- the run ----------------------------------------------------------------------------------

    def labels(self, prior: AttackerPrior, device: torch.device) -> torch.Tensor:
        """The prior's labels (m,) on ``device``: floats in the attack's dtype, or int64 classes."""
        y = prior.labels.to(device)
        return y.to(self.dtype) if y.is_floating_point() else y.long()

    def bounds(self, prior: AttackerPrior, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The prior's pixel box (lower, upper) in the attack's dtype on ``device``."""
        return (torch.as_tensor(prior.lower, dtype=self.dtype, device=device),
                torch.as_tensor(prior.upper, dtype=self.dtype, device=device))

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The run's first state: x₀ on the weights' device in the attack's dtype, and the optimiser's buffers."""
        device = next(iter(target.params.values())).device
        state = {"x": x0.detach().to(device=device, dtype=self.dtype).clone()}
        state.update({k: v.to(device) for k, v in init_optimizer_state(self.config.optimizer, state).items()})
        return state

    def objective(self, target: Target, prior: AttackerPrior, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The attack's objective at the candidates x (m, C, H, W), differentiable in x: a mapping of
        scalar terms with the minimised total under ``"loss"`` (the priors are added by :meth:`step`)."""
        raise NotImplementedError(f"attack {self.name!r} must define objective() or step()")

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        """One step: the objective and its gradient in x, the priors of
        :data:`~datarecon.attacks.priors.PRIORS` the config weighs (:func:`~datarecon.attacks.priors.add_priors`),
        the finiteness rule and the optimiser (:func:`commit_update`).

        Returns:
            The step's scalar metrics: the objective's terms, each prior's value and ``loss`` (the total).
        """
        metrics, grads = self.step_gradients(target, prior, state)
        return self.apply_step(state, grads, metrics, index)

    def step_gradients(self, target: Target, prior: AttackerPrior,
                       state: dict[str, torch.Tensor]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """The first half of :meth:`step`: the objective, its gradient in x and the run's own priors
        (all but the cross-run ones, which a :class:`~datarecon.attacks.grouped.CoupledGroup` adds);
        the state is not changed. Returns (metrics, gradients by state name)."""
        x = state["x"].detach().requires_grad_(True)
        terms = dict(self.objective(target, prior, x))
        (gx,) = torch.autograd.grad(terms["loss"], [x])
        given = PriorInput(x.detach(), *self.bounds(prior, x.device), target=target, labels=self.labels(prior, x.device))
        terms, gx = add_priors(self.config, given, terms, gx, skip=CROSS_RUN_PRIORS)
        return {k: float(v.detach()) for k, v in terms.items()}, {"x": gx}

    def apply_step(self, state: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], metrics: dict[str, float],
                   index: int) -> dict[str, float]:
        """The second half of :meth:`step`: the optimiser's update under the finiteness rule
        (:func:`commit_update`); returns the step's metrics."""
        return commit_update(self.config, state, grads, {"x": self.config.lr_x}, metrics)

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(per-candidate attacker-side scores name → (m,), summary): the summary may hold
        ``selection`` (criterion → {"value": ...}) and ``extra`` (method-specific). Default: none."""
        return {}, {}

    def multipliers(self, prior: AttackerPrior, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """(m,) the candidates' weights in the reconstruction (``Reconstruction.multipliers``). Default:
        ones; an attack that learns a weight per candidate (the KKT family's λ) returns it."""
        return torch.ones(prior.m, dtype=state["x"].dtype, device=state["x"].device)
