"""Null baselines: the same statistic for images that were never trained on.

A similarity statistic ("best SSIM to the training set", "Haim protocol SSIM
per training image") means little on its own: on small images even noise or
unrelated natural images reach SSIM 0.4 (METHODS.md section 7). So every
statistic is reported next to its value when the candidates are replaced by

* ``heldout``: held-out images of the same distribution (never trained on);
* ``noise``: uniform noise in ``[0, 1]`` from a seeded generator, as many
  images as candidates.

References:
    Runkel et al. (2024), section 5 (partition and noise references);
    Haim et al. (2022) protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from datarecon.attacks.init import DATA_NEEDS, INITS
from datarecon.errors import DataReconError
from datarecon.evaluation.neighbours import NeighbourSearch, nearest_neighbours
from datarecon.evaluation.protocol import DEFAULT_THRESHOLDS, HaimSettings, counts_at, haim_protocol
from datarecon.evaluation.similarity import Window, check_images

__all__ = [
    "NULL_RATE",
    "PAPER_THRESHOLD",
    "INIT_MARGIN",
    "NullCalibrated",
    "null_calibrated",
    "HEADLINE_RULES",
    "headline_rule",
    "init_rule_mask",
    "retention",
    "Baselines",
    "noise_images",
    "null_baselines",
    "best_similarity_to",
    "haim_ssim_against",
    "summarise",
]


#: Share of the training images that the held-out null may "reconstruct" at the null-calibrated
#: threshold (5%: 2 of 40).
NULL_RATE = 0.05
#: The papers' fixed "good reconstruction" SSIM (Haim et al. 2022; Buzaglo et al. 2023): the floor of
#: the headline threshold, which is never below it.
PAPER_THRESHOLD = 0.4
#: Partition and mixture initialisations: a candidate counts only if its SSIM to its training match
#: exceeds its SSIM to its own initial image by at least this much (it moved towards the training set).
INIT_MARGIN = 0.1


@dataclass(frozen=True)
class NullCalibrated:
    """A count at a threshold set by the null, beside the null counts at that threshold.

    Attributes:
        threshold: The threshold applied, ``max(floor, t)``; None when there is no floor and the
            null stays undefined (NaN) for more than all but ``allowed`` training images, i.e. any
            threshold would do (every finite value then counts).
        allowed: ``floor(rate * N)``: the most training images the null may reach.
        rate: The rate asked for.
        count: Training images whose value is ``> threshold`` with the real candidates (and, when
            ``eligible`` was given, whose entry is eligible).
        null: The same with the null candidates (``<= allowed`` by construction).
        others: ``{name: count}`` for other baselines (e.g. noise) at the threshold.
        n: Training images ``N``.
        null_threshold: ``t``, the lowest threshold the null passes for at most ``allowed`` training
            images (None: undefined, see ``threshold``).
        floor: The floor of the threshold (None: none).
        excluded: Training images above the threshold that ``eligible`` excluded from ``count``.
    """

    threshold: float | None
    allowed: int
    rate: float
    count: int
    null: int
    others: dict[str, int]
    n: int
    null_threshold: float | None = None
    floor: float | None = None
    excluded: int = 0


def null_calibrated(real: Tensor, null: Tensor, *, others: dict[str, Tensor] | None = None,
                    rate: float = NULL_RATE, floor: float | None = None,
                    eligible: Tensor | None = None) -> NullCalibrated:
    """Count of per-training-image values above ``max(floor, t)``, ``t`` the lowest threshold the null rarely passes.

    The headline rule of every report (one definition): a training image counts as reconstructed
    when the SSIM of its matched candidate exceeds ``max(floor, t)`` (``floor`` = the papers' 0.4),
    where ``t`` is the ``(k+1)``-th largest null value, ``k = floor(rate * N)``, so that images
    that were never trained on, standing in for the candidates (as many as the attack has), pass
    for at most ``k`` training images; the null count at the same threshold is printed beside it.
    Unlike the fixed 0.4 alone (which unseen 8x8 digits pass for most training images), the
    threshold adapts to how similar unseen images of the distribution already are, and it never
    drops below the papers' criterion where unseen images are dissimilar.

    Args:
        real: ``(N,)`` the statistic per training image with the attack's candidates (e.g. the
            Haim-protocol SSIM); NaN counts as not above.
        null: ``(N,)`` the same with held-out images as candidates (use as many as the attack
            has candidates; fewer lower the threshold and flatter the attack).
        others: ``{name: (N,)}`` further baselines counted at the same threshold (e.g. noise).
        rate: Largest share of training images the null may reach, in ``[0, 1)``.
        floor: Lowest threshold applied (:data:`PAPER_THRESHOLD` in every report); None: ``t`` alone.
        eligible: ``(N,)`` bool, which training images may count (e.g. the init rule of a
            partition-initialised run, :func:`init_rule_mask`); None: all. Not applied to the nulls.

    Returns:
        :class:`NullCalibrated`.

    Raises:
        DataReconError: ``real``, ``null`` and ``eligible`` differ in length, or ``rate`` is
            outside ``[0, 1)``.
    """
    r = torch.as_tensor(real, dtype=torch.float64).reshape(-1)
    z = torch.as_tensor(null, dtype=torch.float64).reshape(-1)
    if r.shape != z.shape:
        raise DataReconError(f"real ({r.numel()}) and null ({z.numel()}) values differ in length")
    if not 0.0 <= rate < 1.0:
        raise DataReconError(f"rate must be in [0, 1), got {rate}")
    ok = torch.ones_like(r, dtype=torch.bool) if eligible is None else torch.as_tensor(eligible).reshape(-1).bool()
    if ok.shape != r.shape:
        raise DataReconError(f"eligible has {ok.numel()} entries for {r.numel()} training images")
    n = int(r.numel())
    allowed = int(rate * n + 1e-9)
    ranked = torch.sort(torch.nan_to_num(z, nan=-torch.inf), descending=True).values
    t = float(ranked[allowed]) if allowed < n else -torch.inf
    null_threshold = t if t > -torch.inf else None
    if floor is not None:
        t = max(t, float(floor))
    threshold = t if t > -torch.inf else None

    def above(v: Tensor) -> Tensor:
        v = torch.nan_to_num(torch.as_tensor(v, dtype=torch.float64).reshape(-1), nan=-torch.inf)
        return (v > t) if threshold is not None else torch.isfinite(v)

    passed = above(r)
    return NullCalibrated(threshold, allowed, float(rate), int((passed & ok).sum()), int(above(z).sum()),
                          {k: int(above(v).sum()) for k, v in (others or {}).items()}, n,
                          null_threshold=null_threshold, floor=None if floor is None else float(floor),
                          excluded=int((passed & ~ok).sum()))


#: How a run's headline is counted, by where its candidates started (see :func:`headline_rule`).
HEADLINE_RULES: dict[str, str] = {
    "standard": "a training image counts when the SSIM of its matched candidate exceeds the threshold",
    "init-shift": ("a training image counts when the SSIM of its matched candidate exceeds the threshold and "
                   "exceeds that candidate's SSIM to its own initial image by at least {margin:g} (data-initialised "
                   "run: a candidate that stayed at its initial image is not a reconstruction)"),
    "retention": ("ground-truth-initialised run: no reconstruction count; retention = candidates whose SSIM to "
                  "their own initial (training) image exceeds the threshold"),
}


def headline_rule(init_name: str | None) -> str:
    """Which :data:`HEADLINE_RULES` entry applies to a run initialised by ``init_name``.

    ``retention`` for an initialisation that starts at the training images only
    (``ground-truth``), ``init-shift`` for any other that uses data (``partition``, ``mix``: the
    registry's ``needs``), ``standard`` otherwise (random starts, starts computed from the weights
    such as ``unmix``, unknown or missing names).
    """
    if not init_name:
        return "standard"

    try:
        needs = tuple(getattr(INITS.get(init_name), "needs", ()))
    except DataReconError:
        return "standard"
    if needs == ("ground_truth",):
        return "retention"

    # starts built from the attacker's own view (the weights: ``unmix``) are attacks, not data
    return "init-shift" if any(n in DATA_NEEDS for n in needs) else "standard"


def init_rule_mask(train_ssim: Tensor, init_ssim: Tensor, candidate_index: Tensor, *,
                   margin: float = INIT_MARGIN) -> Tensor:
    """Which training images' matches moved towards them from their initial image.

    Training image ``i`` with matched candidate ``j = candidate_index[i]`` is eligible iff
    ``train_ssim[i] - init_ssim[j] >= margin``; unmatched images (``j = -1``) and NaN values are not.

    Args:
        train_ssim: ``(N,)`` SSIM of each training image's matched candidate (Haim protocol).
        init_ssim: ``(M,)`` SSIM of each candidate to its own initial image
            (:func:`~datarecon.evaluation.protocol.init_similarity`).
        candidate_index: ``(N,)`` int64 matched candidate per training image (-1: none).
        margin: :data:`INIT_MARGIN`.

    Returns:
        ``(N,)`` bool.
    """
    s = torch.as_tensor(train_ssim, dtype=torch.float64).reshape(-1)
    init = torch.as_tensor(init_ssim, dtype=torch.float64).reshape(-1)
    idx = torch.as_tensor(candidate_index, dtype=torch.int64).reshape(-1)
    if idx.shape != s.shape:
        raise DataReconError(f"candidate_index has {idx.numel()} entries for {s.numel()} training images")
    ok = idx >= 0
    gain = torch.full_like(s, float("nan"))
    gain[ok] = s[ok] - init[idx[ok]]
    return torch.nan_to_num(gain, nan=-torch.inf) >= margin - 1e-12


def retention(init_ssim: Tensor, threshold: float) -> int:
    """Candidates whose SSIM to their own initial image exceeds ``threshold`` (NaN: not)."""
    v = torch.nan_to_num(torch.as_tensor(init_ssim, dtype=torch.float64).reshape(-1), nan=-torch.inf)
    return int((v > threshold).sum())


def noise_images(n: int, shape: Sequence[int], *, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """``n`` images of ``shape`` (C, H, W), i.i.d. uniform in ``[0, 1]``.

    Args:
        generator: Source of randomness; None means a generator seeded with 0
            (same call, same images).
    """
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    return torch.rand((int(n), *tuple(shape)), generator=generator, dtype=dtype)


def summarise(values: Tensor, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> dict:
    """Mean, median, min, max (NaN ignored) and counts above thresholds of a 1-D statistic."""
    v = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    f = v[~torch.isnan(v)]
    if f.numel() == 0:
        nan = float("nan")
        stats = {"mean": nan, "median": nan, "min": nan, "max": nan}
    else:
        stats = {"mean": float(f.mean()), "median": float(f.median()),
                 "min": float(f.min()), "max": float(f.max())}
    stats["n"] = int(v.numel())
    stats["counts"] = {str(k): c for k, c in counts_at(v, thresholds).items()}
    return stats


@dataclass(frozen=True)
class Baselines:
    """A statistic for the real candidates and for null candidates.

    Attributes:
        statistic: Name of the statistic.
        real: Values for the candidates (shape defined by the statistic).
        heldout: Values with held-out images as candidates, or None.
        noise: Values with uniform-noise images as candidates, or None.
    """

    statistic: str
    real: Tensor
    heldout: Tensor | None
    noise: Tensor | None

    def summary(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> dict:
        """``{"real"|"heldout"|"noise": summarise(values)}`` for the available sets."""
        out = {"statistic": self.statistic, "real": summarise(self.real, thresholds)}
        for name in ("heldout", "noise"):
            v = getattr(self, name)
            if v is not None:
                out[name] = summarise(v, thresholds)
        return out


def best_similarity_to(refs: Tensor, *, metric: str = "ssim", search: NeighbourSearch = NeighbourSearch(),
                       window: str | Window = "gaussian") -> Callable[[Tensor], Tensor]:
    """Statistic: each candidate's best similarity to ``refs`` ((M, C, H, W) -> (M,)); exact up to
    ``search.exact_up_to`` pairs (see :func:`~datarecon.evaluation.neighbours.nearest_neighbours`)."""
    def stat(cands: Tensor) -> Tensor:
        return nearest_neighbours(cands, refs, metric=metric, search=search, window=window).score
    stat.__name__ = f"best_{metric}_to_references"
    return stat


def haim_ssim_against(train: Tensor, settings: HaimSettings = HaimSettings()) -> Callable[[Tensor], Tensor]:
    """Statistic: the Haim-protocol SSIM per training image ((M, C, H, W) -> (N,)) under ``settings``
    (:class:`~datarecon.evaluation.protocol.HaimSettings`)."""
    def stat(cands: Tensor) -> Tensor:
        return haim_protocol(cands, train, settings).ssim
    stat.__name__ = "haim_ssim_per_training_image"
    return stat


def null_baselines(statistic: Callable[[Tensor], Tensor], candidates: Tensor, *,
                   heldout: Tensor | None = None, noise: bool = True, n_noise: int | None = None,
                   generator: torch.Generator | None = None, name: str | None = None) -> Baselines:
    """Evaluate ``statistic`` on the candidates, on held-out images and on noise.

    Args:
        statistic: Function of a candidate batch ``(M, C, H, W)`` (display
            space), e.g. :func:`best_similarity_to` (train) or
            :func:`haim_ssim_against` (train).
        candidates: ``(M, C, H, W)`` the real candidates.
        heldout: ``(K, C, H, W)`` held-out images used as candidates (all of
            them), or None to skip.
        noise: Also evaluate uniform noise images in ``[0, 1]``.
        n_noise: Number of noise images (default ``M``).
        generator: Seeded generator for the noise (default: seed 0).
        name: Statistic name (default: ``statistic.__name__``).

    Returns:
        :class:`Baselines` with the three values side by side.
    """
    candidates = check_images(candidates, "candidates")
    real = statistic(candidates)
    held = None
    if heldout is not None:
        heldout = check_images(heldout, "held-out images")
        if heldout.shape[1:] != candidates.shape[1:]:
            raise DataReconError(f"held-out images {tuple(heldout.shape[1:])} differ in shape from candidates {tuple(candidates.shape[1:])}")
        held = statistic(heldout)
    nz = None
    if noise:
        k = candidates.shape[0] if n_noise is None else int(n_noise)
        nz = statistic(noise_images(k, candidates.shape[1:], generator=generator, dtype=candidates.dtype))
    return Baselines(name or getattr(statistic, "__name__", "statistic"), real, held, nz)
