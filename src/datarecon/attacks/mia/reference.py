"""Reference-model membership attacks: LiRA (offline and online) and RMIA, from statistics arrays.

The attacker trains K reference (shadow) models with the target's recipe on random subsets of a
population pool and queries every model on every candidate. ``inside[k, i]`` says whether candidate
i was in reference model k's training set (the attacker drew the subsets, so it knows this); the
target's membership is what the attack decides. Everything here is pure array arithmetic on
float64 tensors (K models × N candidates).

**LiRA** (Carlini et al. 2022, §4): the logit-scaled confidence φ of a candidate is close to Gaussian
over training runs, one Gaussian over the models that trained on it (IN) and one over the others
(OUT), fitted per candidate (:func:`fit_gaussians`; the variance is shrunk towards the variance
pooled over all candidates, which the paper recommends when there are few reference models).

* offline (:func:`lira_offline`): OUT models only; the score is the one-sided standardised
  distance (φ_target − μ_out) / σ_out (higher: more likely a member);
* online (:func:`lira_online`): the likelihood ratio log N(φ; μ_in, σ_in) − log N(φ; μ_out, σ_out).
  A Gaussian ratio with σ_in < σ_out is a concave parabola: it *falls* again for a target more
  confident than a typical IN model, which calls the most memorised examples non-members (its
  Gaussian tails are the model's, not the data's). The score is therefore the ratio's
  non-decreasing envelope in φ (the ratio evaluated at φ clipped to the interval where it rises,
  ties beyond it broken by φ itself): training on an example raises its confidence, the premise of
  every membership attack.

**RMIA** (Zarifzadeh et al. 2024, §3): the likelihood ratio of the candidate x against population
samples z, LR(x, z) = [p(x|θ)/p(x)] / [p(z|θ)/p(z)], p(·|θ) the target's true-label probability and
p(·) its average over reference models; the score is the fraction of z with LR(x, z) ≥ γ. Offline,
p(x) = ½[(1 + a)·p_OUT(x) + (1 − a)] corrects the OUT-only average for the missing IN models (a is
the paper's offline parameter); online, p(x) = ½[p_IN(x) + p_OUT(x)], the average of a pool in which
x is a member of half the models. The z samples are never in a reference model's training set, so
p(z) always takes the offline form.

References:
    Carlini, Chien, Nasr, Song, Terzis, Tramèr (2022), "Membership Inference Attacks From First
    Principles", IEEE S&P (LiRA, eq. 4 and the offline variant); Zarifzadeh, Liu, Shokri (2024),
    "Low-Cost High-Power Membership Inference Attacks", ICML (RMIA, eq. 3–4 and the offline p(x)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from datarecon.errors import DataReconError

__all__ = ["GaussianFit", "fit_gaussians", "lira_offline", "lira_online", "rmia"]

#: the weight of the pooled variance in the shrunk per-candidate variance, in "models"
VARIANCE_PRIOR = 4.0
#: the slope of the tie-break beyond the online ratio's turning point (ratios are O(1)–O(100))
TIE_SLOPE = 1e-6


def _check(stats: torch.Tensor, inside: torch.Tensor, target: torch.Tensor | None = None) -> None:
    if stats.dim() != 2 or inside.shape != stats.shape:
        raise DataReconError(f"reference statistics must be (K models, N candidates) with a membership mask of the "
                             f"same shape; got {tuple(stats.shape)} and {tuple(inside.shape)}")
    if target is not None and target.shape != (stats.shape[1],):
        raise DataReconError(f"{target.shape[0] if target.dim() else 0} target statistics for "
                             f"{stats.shape[1]} candidates; pass one per candidate")
    if not bool(torch.isfinite(stats).all()):
        raise DataReconError("a reference model's statistics are not finite; retrain the reference models")


@dataclass(frozen=True)
class GaussianFit:
    """Per-candidate Gaussians of a statistic over a set of models.

    Attributes:
        mean: (N,) mean over the models used (the pooled mean where a candidate has none).
        std: (N,) standard deviation (shrunk towards the pooled one).
        count: (N,) number of models used per candidate.
    """

    mean: torch.Tensor
    std: torch.Tensor
    count: torch.Tensor


def fit_gaussians(stats: torch.Tensor, use: torch.Tensor, *, variance_prior: float = VARIANCE_PRIOR) -> GaussianFit:
    """Fit N(μ_i, σ_i²) to ``stats[use[:, i], i]`` for each candidate i.

    σ_i² = ((c_i − 1)·s_i² + ν·g²) / (c_i − 1 + ν): the unbiased per-candidate variance s_i² of c_i
    models, shrunk towards the pooled variance g² (the (c − 1)-weighted mean of the s_i²) with weight
    ν = ``variance_prior`` (ν = 0: per candidate only; ν → ∞: the pooled variance, LiRA's "global
    variance"). A candidate with no model gets the pooled mean and g.

    Args:
        stats: (K, N) float statistic of each model on each candidate.
        use: (K, N) bool, which models to use for each candidate.
        variance_prior: ν ≥ 0.

    Raises:
        DataReconError: shapes that do not fit, non-finite statistics, ν < 0, or no candidate with two models.
    """
    _check(stats, use)
    if not variance_prior >= 0:
        raise DataReconError(f"variance_prior must be >= 0, got {variance_prior}")
    s = stats.to(torch.float64)
    w = use.to(torch.float64)
    count = w.sum(0)
    mean = (s * w).sum(0) / count.clamp_min(1)
    sq = (((s - mean) ** 2) * w).sum(0)
    dof = (count - 1).clamp_min(0)
    if float(dof.sum()) <= 0:
        raise DataReconError("too few reference models to fit a variance (each candidate has at most one); "
                             "train more reference models")
    pooled_var = float(sq.sum() / dof.sum())
    pooled_mean = float((s * w).sum() / w.sum())
    var = (sq + variance_prior * pooled_var) / (dof + variance_prior).clamp_min(1e-300)
    var = torch.where(dof > 0, var, torch.full_like(var, pooled_var))
    mean = torch.where(count > 0, mean, torch.full_like(mean, pooled_mean))
    std = torch.sqrt(var.clamp_min(1e-24))
    return GaussianFit(mean=mean, std=std, count=count.to(torch.int64))


def lira_offline(target: torch.Tensor, stats: torch.Tensor, inside: torch.Tensor, *,
                 variance_prior: float = VARIANCE_PRIOR) -> torch.Tensor:
    """Offline LiRA: (φ − μ_out) / σ_out per candidate, (N,) (higher: more likely a member).

    Args:
        target: (N,) the target's statistic (φ) on each candidate.
        stats: (K, N) each reference model's statistic; inside: (K, N) bool, candidate in model k's training set.
        variance_prior: see :func:`fit_gaussians`.
    """
    _check(stats, inside, target)
    out = fit_gaussians(stats, ~inside, variance_prior=variance_prior)
    return (target.to(torch.float64) - out.mean) / out.std


def _log_normal(s: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return -0.5 * ((s - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)


def lira_online(target: torch.Tensor, stats: torch.Tensor, inside: torch.Tensor, *,
                variance_prior: float = VARIANCE_PRIOR) -> torch.Tensor:
    """Online LiRA: the non-decreasing envelope in φ of log N(φ; μ_in, σ_in) − log N(φ; μ_out, σ_out), (N,).

    The ratio r(s) has derivative r'(s) = −a·s + b with a = 1/σ_in² − 1/σ_out² and
    b = μ_in/σ_in² − μ_out/σ_out²; it rises on {s : −a·s + b ≥ 0}. φ is clipped to that set (to its
    one end beyond which r falls) and the score is r(clipped φ) + 10⁻⁶·(φ − clipped φ). Where r rises
    nowhere (equal variances and μ_in < μ_out) the score is that tie-break alone.

    Args:
        target, stats, inside, variance_prior: as in :func:`lira_offline`.
    """
    _check(stats, inside, target)
    fin = fit_gaussians(stats, inside, variance_prior=variance_prior)
    fout = fit_gaussians(stats, ~inside, variance_prior=variance_prior)
    s = target.to(torch.float64)
    a = 1 / fin.std ** 2 - 1 / fout.std ** 2
    b = fin.mean / fin.std ** 2 - fout.mean / fout.std ** 2
    turn = b / torch.where(a == 0, torch.ones_like(a), a)
    inf = torch.full_like(s, math.inf)
    lo = torch.where(a < 0, turn, -inf)  # convex: rises right of the turning point
    hi = torch.where(a > 0, turn, inf)   # concave: rises left of it
    nowhere = (a == 0) & (b < 0)
    lo = torch.where(nowhere, fout.mean, lo)
    hi = torch.where(nowhere, fout.mean, hi)
    clipped = torch.minimum(torch.maximum(s, lo), hi)
    ratio = _log_normal(clipped, fin.mean, fin.std) - _log_normal(clipped, fout.mean, fout.std)
    return ratio + TIE_SLOPE * (s - clipped)


def _offline_log_px(log_mean_out: torch.Tensor, a: float) -> torch.Tensor:
    """log of ½[(1 + a)·p_OUT + (1 − a)] from log p_OUT."""
    if a >= 1.0:
        return log_mean_out
    floor = torch.full_like(log_mean_out, math.log(1.0 - a))
    return torch.logaddexp(log_mean_out + math.log1p(a), floor) - math.log(2.0)


def _log_masked_mean(log_p: torch.Tensor, use: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log of the mean of exp(log_p) over the models ``use`` selects, per candidate; how many), (N,) each."""
    count = use.sum(0)
    masked = torch.where(use, log_p, torch.full_like(log_p, -math.inf))
    return torch.logsumexp(masked, dim=0) - torch.log(count.clamp_min(1).to(log_p.dtype)), count


def rmia(target_x: torch.Tensor, refs_x: torch.Tensor, inside: torch.Tensor, target_z: torch.Tensor,
         refs_z: torch.Tensor, *, a: float = 0.3, gamma: float = 1.0, online: bool = False) -> torch.Tensor:
    """RMIA scores: for each candidate x, the fraction of population samples z with LR(x, z) ≥ γ, (N,).

    Probabilities enter as their logarithms (log p = −ℓ, the per-example loss), so that neither a
    confident example (p rounding to 1) nor a badly wrong one (p underflowing to 0) loses its value.

    Args:
        target_x: (N,) the target's log true-label probability log p(x|θ) on each candidate, ≤ 0.
        refs_x: (K, N) each reference model's log p(x|θ_k); inside: (K, N) bool, x in model k's training set.
        target_z: (M,) the target's log p(z|θ) on the population samples; refs_z: (K, M) the reference models'.
        a: the offline correction, in [0, 1] (a = 1: p(x) is the OUT average itself).
        gamma: γ > 0.
        online: p(x) = ½[p_IN(x) + p_OUT(x)] where x has IN models (else the offline form).

    Raises:
        DataReconError: shapes that do not fit, log-probabilities above 0 or NaN, a outside [0, 1],
            γ ≤ 0, no population samples.
    """
    _check(refs_x, inside, target_x)
    if refs_z.dim() != 2 or refs_z.shape != (refs_x.shape[0], target_z.shape[0]) or target_z.shape[0] == 0:
        raise DataReconError(f"population statistics must be (K, M) with M >= 1 and K = {refs_x.shape[0]}; "
                             f"got {tuple(refs_z.shape)}")
    if not 0.0 <= a <= 1.0 or not gamma > 0:
        raise DataReconError(f"RMIA needs a in [0, 1] and gamma > 0; got a = {a}, gamma = {gamma}")
    for p in (target_x, refs_x, target_z, refs_z):
        if bool(torch.isnan(p).any()) or bool((p > 1e-12).any()):
            raise DataReconError("log-probabilities must be <= 0 and not NaN; check the model's outputs")
    lx, lz = refs_x.to(torch.float64), refs_z.to(torch.float64)
    log_out, n_out = _log_masked_mean(lx, ~inside)
    log_all, _ = _log_masked_mean(lx, torch.ones_like(inside))
    log_px = _offline_log_px(torch.where(n_out > 0, log_out, log_all), a)
    if online:
        log_in, n_in = _log_masked_mean(lx, inside)
        both = torch.logaddexp(log_in, log_out) - math.log(2)
        log_px = torch.where((n_in > 0) & (n_out > 0), both, log_px)
    log_pz = _offline_log_px(torch.logsumexp(lz, dim=0) - math.log(lz.shape[0]), a)
    ratio_x = target_x.to(torch.float64) - log_px
    ratio_z, _ = torch.sort(target_z.to(torch.float64) - log_pz)
    beaten = torch.searchsorted(ratio_z, ratio_x - math.log(gamma), right=True)
    return beaten.to(torch.float64) / ratio_z.numel()
