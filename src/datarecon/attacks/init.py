"""Initialisations of the candidates x₀ (Runkel et al. 2024, §4.3 and §4.5); shared by all attacks.

Every initialisation returns candidates in **model input space**, shape (m, C, H, W), so any
attack (KKT, DecoReco, gradnorm, bilevel) can start from it. Registered in :data:`INITS`:

* ``uniform``: U(low, high) per pixel in *display* space (default U(0, 1)), then the training
  mean is subtracted: "U(0,1) relative to mean-subtracted inputs means uniform valid images".
* ``gaussian``: N(0, 1)·scale drawn *directly in model input space*, as the reference KKT code
  does (untuned scale 1; the reference's tuned scales are ~1e-3).
* ``ground-truth``: the training images (experimenter's choice; an attacker does not have them).
* ``partition``: images of the same classes from a split disjoint from training.
* ``mix``: x₀ = λ₂(λ₁ x_GT + (1 − λ₁) x_part) + (1 − λ₂) x_rnd (Runkel §4.5, 25 grid points
  λ₁, λ₂ ∈ {0, .25, .5, .75, 1}; any values in [0, 1] are accepted). x_rnd is drawn by the
  ``noise`` init (``uniform`` or ``gaussian``). Because the weights sum to one, mixing in display
  space and then subtracting the mean equals mixing in model space.

Data-dependent initialisations never reach an attack by themselves: the experimenter passes the
images explicitly through :class:`InitSources` (in model input space). The attack only ever
sees the resulting x₀.

Candidate count vs image count: when the number of source images n differs from m, the
``count`` policy decides: ``"exact"`` (default) refuses with an error; ``"cycle"`` uses image
``i mod n`` for candidate i (takes the first m when n > m, repeats when n < m). The same indices
pick the source labels (:func:`init_labels`).

Typical use::

    x0 = make_init("gaussian", CandidateSpec(m=100, input_shape=(3, 32, 32), mean=mean), generator=g, scale=1e-3)
    x0 = make_init("mix", CandidateSpec(m=500, input_shape=shape, mean=mean), generator=g,
                   sources=InitSources(ground_truth=x_gt, partition=x_part), l1=0.5, l2=0.75)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from datarecon.attacks.unmix import unmix_candidates
from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.registry import Registry

CountPolicy = Literal["exact", "cycle"]


@dataclass(frozen=True)
class InitSources:
    """Images an experimenter chooses to start from (model input space).

    Attributes:
        ground_truth: (n, C, H, W) the training images, or None.
        ground_truth_labels: (n,) their labels, or None.
        partition: (n', C, H, W) disjoint images of the same classes, or None.
        partition_labels: (n',) their labels, or None.
    """

    ground_truth: torch.Tensor | None = None
    ground_truth_labels: torch.Tensor | None = None
    partition: torch.Tensor | None = None
    partition_labels: torch.Tensor | None = None


@dataclass(frozen=True)
class CandidateSpec:
    """What x₀ holds: ``m`` candidates of one input shape, in model input space.

    Attributes:
        m: number of candidates (>= 1; checked by :func:`make_init`).
        input_shape: (C, H, W) of one candidate.
        mean: per-pixel training mean (C, H, W) or a scalar; model input = display − mean.
        dtype: of the returned tensor (the draws happen on CPU in float64, then are cast).
        device: of the returned tensor.
    """

    m: int
    input_shape: tuple[int, ...]
    mean: torch.Tensor | float = 0.0
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"


class _Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class UniformInit(_Params):
    """U(low, high) per pixel in display space, minus the training mean (low < high).

    Attributes:
        low: lower end of the uniform draw (display space).
        high: upper end of the uniform draw (display space), above low.
    """

    low: float = 0.0
    high: float = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> UniformInit:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g}); e.g. low 0, high 1")
        return self


class GaussianInit(_Params):
    """N(0, 1)·scale in model input space (reference KKT initialisation).

    Attributes:
        scale: std s > 0 of the Gaussian draw.
    """

    scale: float = Field(default=1.0, gt=0)


class GroundTruthInit(_Params):
    """The training images (sources.ground_truth).

    Attributes:
        count: exact (m must equal the number of images) or cycle (repeat them up to m).
    """

    count: CountPolicy = "exact"


class PartitionInit(_Params):
    """Disjoint images of the same classes (sources.partition).

    Attributes:
        count: exact (m must equal the number of images) or cycle (repeat them up to m).
    """

    count: CountPolicy = "exact"


class UnmixInit(_Params):
    """Images unmixed from the first layer's non-negative structure (:mod:`datarecon.attacks.unmix`)."""


class MixInit(_Params):
    """x₀ = l2·(l1·x_GT + (1 − l1)·x_part) + (1 − l2)·x_rnd; x_rnd from ``noise``.

    Attributes:
        l1: weight l1 in [0, 1] of the ground truth against the partition.
        l2: weight l2 in [0, 1] of the images against the noise.
        noise: the noise x_rnd: uniform or gaussian.
        scale: std of gaussian noise, > 0.
        count: exact (m must equal the number of images) or cycle (repeat them up to m).
    """

    l1: float = Field(default=0.5, ge=0.0, le=1.0)
    l2: float = Field(default=0.5, ge=0.0, le=1.0)
    noise: Literal["uniform", "gaussian"] = "uniform"
    scale: float = Field(default=1.0, gt=0)  # for noise="gaussian"
    count: CountPolicy = "exact"


InitFn = Callable[..., torch.Tensor]


#: What an initialisation may need: training / partition images (the experimenter's choice) or the
#: attacker's view of the target (``weights``: θ*, its subspace and known θ_init, never images).
DATA_NEEDS: tuple[str, ...] = ("ground_truth", "partition")


@dataclass(frozen=True)
class InitEntry:
    """A registered initialisation: its parameter model, function and what it needs.

    ``needs`` names data sources (:data:`DATA_NEEDS`: the experimenter's choice, images loaded
    through the model's data spec) and/or ``weights`` (the attacker's view, passed as ``attacker``).
    """

    params_cls: type[_Params]
    fn: InitFn
    needs: tuple[str, ...]
    doc: str

    @property
    def data(self) -> bool:
        """True when the initialisation starts from images (an experimenter's choice, not an attack)."""
        return any(n in DATA_NEEDS for n in self.needs)


INITS: Registry[InitEntry] = Registry("initialisation")


def _check_shape(x: torch.Tensor, input_shape: tuple[int, ...], what: str) -> None:
    if tuple(x.shape[1:]) != tuple(input_shape):
        raise DataReconError(f"{what} images have shape {tuple(x.shape[1:])}, the model takes {tuple(input_shape)}")


def source_indices(n: int, m: int, *, count: str, what: str) -> torch.Tensor:
    """Indices (m,) into n source images under the count policy (see module docstring).

    Raises:
        DataReconError: n == 0, or n != m with policy "exact".
    """
    if n == 0:
        raise DataReconError(f"no {what} images to initialise from")
    if n != m and count == "exact":
        raise DataReconError(
            f"{m} candidates but {n} {what} images; pass --candidates {n}, or --init-count cycle "
            "(count='cycle') to reuse/truncate them"
        )
    return torch.arange(m) % n


def _source(sources: InitSources | None, key: str, *, m: int, input_shape, count: str) -> torch.Tensor:
    x = getattr(sources, key, None) if sources is not None else None
    if x is None:
        raise DataReconError(
            f"initialisation needs {key.replace('_', '-')} images; pass them via InitSources({key}=...) "
            "(CLI: it loads them from the model's data spec)"
        )
    _check_shape(x, input_shape, key.replace("_", "-"))
    return x[source_indices(x.shape[0], m, count=count, what=key.replace("_", "-"))]


def _mean(mean: torch.Tensor | float, input_shape) -> torch.Tensor:
    mean_t = torch.as_tensor(mean, dtype=torch.float64)
    return mean_t.expand(tuple(input_shape)) if mean_t.dim() == 0 else mean_t.to(torch.float64)


def init_uniform(*, m: int, input_shape: tuple[int, ...], mean: torch.Tensor | float, generator: torch.Generator,
                 params: UniformInit, sources: InitSources | None = None) -> torch.Tensor:
    """x = U(low, high) − mean. Returns (m, *input_shape) float64."""
    u = torch.rand((m, *input_shape), generator=generator, dtype=torch.float64)
    return params.low + (params.high - params.low) * u - _mean(mean, input_shape)


def init_gaussian(*, m: int, input_shape: tuple[int, ...], mean: torch.Tensor | float, generator: torch.Generator,
                  params: GaussianInit, sources: InitSources | None = None) -> torch.Tensor:
    """x = N(0, 1)·scale in model space (mean ignored). Returns (m, *input_shape) float64."""
    return torch.randn((m, *input_shape), generator=generator, dtype=torch.float64) * params.scale


def init_ground_truth(*, m: int, input_shape: tuple[int, ...], mean: torch.Tensor | float,
                      generator: torch.Generator, params: GroundTruthInit,
                      sources: InitSources | None = None) -> torch.Tensor:
    """x = the training images (copied), (m, *input_shape) float64."""
    return _source(sources, "ground_truth", m=m, input_shape=input_shape, count=params.count).to(torch.float64).clone()


def init_partition(*, m: int, input_shape: tuple[int, ...], mean: torch.Tensor | float,
                   generator: torch.Generator, params: PartitionInit,
                   sources: InitSources | None = None) -> torch.Tensor:
    """x = the partition images (copied), (m, *input_shape) float64."""
    return _source(sources, "partition", m=m, input_shape=input_shape, count=params.count).to(torch.float64).clone()


def mix_formula(x_gt: torch.Tensor, x_part: torch.Tensor, x_rnd: torch.Tensor, *, l1: float, l2: float) -> torch.Tensor:
    """λ₂(λ₁ x_GT + (1 − λ₁) x_part) + (1 − λ₂) x_rnd (Runkel §4.5); all (m, C, H, W)."""
    return l2 * (l1 * x_gt + (1.0 - l1) * x_part) + (1.0 - l2) * x_rnd


def init_mix(*, m: int, input_shape: tuple[int, ...], mean: torch.Tensor | float, generator: torch.Generator,
             params: MixInit, sources: InitSources | None = None) -> torch.Tensor:
    """Runkel's mixture; sources with zero weight are not required (e.g. l2 = 0: pure noise).

    The noise is drawn first (always, so the same seed gives the same x_rnd for every (l1, l2)).
    """
    if params.noise == "uniform":
        x_rnd = init_uniform(m=m, input_shape=input_shape, mean=mean, generator=generator, params=UniformInit())
    else:
        x_rnd = init_gaussian(m=m, input_shape=input_shape, mean=mean, generator=generator,
                              params=GaussianInit(scale=params.scale))
    zeros = torch.zeros_like(x_rnd)
    need_gt = params.l2 > 0 and params.l1 > 0
    need_part = params.l2 > 0 and params.l1 < 1
    x_gt = _source(sources, "ground_truth", m=m, input_shape=input_shape, count=params.count).to(torch.float64) \
        if need_gt else zeros
    x_part = _source(sources, "partition", m=m, input_shape=input_shape, count=params.count).to(torch.float64) \
        if need_part else zeros
    if need_gt and need_part:
        _check_paired_labels(sources, m=m, count=params.count)
    return mix_formula(x_gt, x_part, x_rnd, l1=params.l1, l2=params.l2)


def _check_paired_labels(sources: InitSources | None, *, m: int, count: str) -> None:
    """Mixed pairs (x_GT_i, x_part_i) must share a label, else the mixture's label is undefined."""
    if sources is None or sources.ground_truth_labels is None or sources.partition_labels is None:
        return
    a = sources.ground_truth_labels[source_indices(len(sources.ground_truth_labels), m, count=count,
                                                   what="ground-truth")]
    b = sources.partition_labels[source_indices(len(sources.partition_labels), m, count=count, what="partition")]
    if not torch.equal(a.to(torch.float64), b.to(torch.float64)):
        i = int((a.to(torch.float64) != b.to(torch.float64)).nonzero()[0])
        raise DataReconError(
            f"mix pairs ground-truth and partition image {i} with different labels; order both sources by class "
            "with equal counts per class"
        )


def init_unmix(*, m: int, input_shape: tuple[int, ...], mean: torch.Tensor | float, generator: torch.Generator,
               params: UnmixInit, sources: InitSources | None = None, attacker: Any = None) -> torch.Tensor:
    """m images from :func:`datarecon.attacks.unmix.unmix_candidates` (attacker side: the weights,
    their subspace and a known θ_init), labels in the balanced layout. (m, *input_shape) float64."""
    if attacker is None or getattr(attacker, "subspace", None) is None:
        raise DataReconError("the unmix initialisation needs the target's weights and subspace analysis; run it "
                             "through datarecon reconstruct / execute")
    x, _ = unmix_candidates(attacker.model, attacker.params, attacker.subspace, m=m, generator=generator,
                            known_init=attacker.known_init, lower=attacker.lower, upper=attacker.upper)
    return x.reshape(m, *input_shape)


INITS.register("uniform", InitEntry(UniformInit, init_uniform, (), "U(0,1) display space minus mean"))
INITS.register("gaussian", InitEntry(GaussianInit, init_gaussian, (), "N(0,1)*scale in model space"))
INITS.register("ground-truth", InitEntry(GroundTruthInit, init_ground_truth, ("ground_truth",),
                                         "the training images (experimenter's choice)"))
INITS.register("partition", InitEntry(PartitionInit, init_partition, ("partition",),
                                      "disjoint images of the same classes"))
INITS.register("mix", InitEntry(MixInit, init_mix, ("ground_truth", "partition"),
                                "l2*(l1*GT + (1-l1)*partition) + (1-l2)*noise (Runkel 4.5)"))
INITS.register("unmix", InitEntry(UnmixInit, init_unmix, ("weights",),
                                  "images unmixed from the first layer's ReLU cone (attacker side)"))


def init_params(name: str, **params: Any) -> _Params:
    """Validate ``params`` for init ``name`` (unknown or bad values → one-line DataReconError)."""
    entry = INITS.get(name)
    return build_config(entry.params_cls, params, where=f"parameters of init {name!r}")


def make_init(name: str, spec: CandidateSpec, *, generator: torch.Generator, sources: InitSources | None = None,
              attacker: Any = None, **params: Any) -> torch.Tensor:
    """Build x₀ for ``spec.m`` candidates.

    Args:
        name: a key of :data:`INITS`.
        spec: how many candidates, their shape, the training mean, the returned dtype and device.
        generator: the randomness (CPU generator; draws happen on CPU in float64, then cast).
        sources: images for data-dependent inits (model input space), chosen by the experimenter.
        attacker: the attacker's view for inits that need ``weights`` (an object with ``model``,
            ``params``, ``subspace``, ``known_init``, ``lower``, ``upper``).
        **params: the init's parameters (see the ``*Init`` models, e.g. ``scale``, ``l1``, ``l2``).

    Returns:
        x₀ of shape (m, *input_shape) in model input space.

    Raises:
        DataReconError: unknown name (lists valid ones), bad parameters, m < 1, missing sources,
            or an image count that does not match m under ``count="exact"``.
    """
    m = spec.m
    if m < 1:
        raise DataReconError(f"candidate count must be at least 1, got {m}; pass --candidates M with M >= 1")
    entry = INITS.get(name)
    p = init_params(name, **params)
    extra = {"attacker": attacker} if "weights" in entry.needs else {}
    x0 = entry.fn(m=m, input_shape=tuple(spec.input_shape), mean=spec.mean, generator=generator, params=p,
                  sources=sources, **extra)
    return x0.to(device=spec.device, dtype=spec.dtype)


def init_labels(name: str, *, m: int, sources: InitSources | None, **params: Any) -> torch.Tensor | None:
    """Labels implied by a data-dependent init (the labels of the images used), else None.

    ``ground-truth`` → the ground-truth labels; ``partition`` → the partition labels; ``mix`` →
    ground-truth labels when l1 > 0 and l2 > 0, partition labels when l1 = 0 < l2, None when l2 = 0.
    """
    p = init_params(name, **params)
    count = getattr(p, "count", "exact")
    key = None
    if name == "ground-truth":
        key = "ground_truth"
    elif name == "partition":
        key = "partition"
    elif name == "mix":
        if p.l2 > 0:  # type: ignore[attr-defined]
            key = "ground_truth" if p.l1 > 0 else "partition"  # type: ignore[attr-defined]
    if key is None or sources is None:
        return None
    labels = getattr(sources, f"{key}_labels")
    if labels is None:
        return None
    return labels[source_indices(len(labels), m, count=count, what=key.replace("_", "-"))].clone()
