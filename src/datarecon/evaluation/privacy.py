"""Can an attacker tell real reconstructions from plausible fakes?

The paper's question (Runkel et al. 2024), measured. Ground truth per
candidate, decided here (never visible to the attacker):

    **Rule.** A candidate is *real* iff its nearest training image is more
    similar to it than *every* held-out image of the same distribution, i.e.
    ``best_train_similarity > best_heldout_similarity`` (strict; for a
    distance such as L2: ``best_train_distance < best_heldout_distance``).
    A tie counts as *fake*. The held-out set plays the role of "images the
    model never saw": a candidate that resembles the training set no more
    than it resembles unseen images carries no evidence of memorisation.

    **Floor (optional).** Far from every image (e.g. uniform noise) the
    comparison is a coin flip between two tiny similarities, so the rule
    takes an optional ``floor``: a real candidate must also be more similar
    to its training match than ``floor`` (for a distance: closer than
    ``floor``). :func:`~datarecon.evaluation.evaluate_candidates` sets it by
    default to the best similarity to the training set reached by any of M
    uniform-noise images (the noise null baseline).

The attacker scores each candidate with attacker-side signals only (higher =
more likely real), e.g. the candidate's multiplier λ_i, its margin, or its
KKT residual share. We report ROC AUC (ties count one half, the
Mann-Whitney statistic), TPR at 1% and 0.1% FPR and the ROC points. ROC and
AUC are implemented here with numpy (tested against scikit-learn).

References:
    Runkel et al. (2024), "Training Data Reconstruction: Privacy due to
    Uncertainty?"; Carlini et al. (2022), "Membership Inference Attacks From
    First Principles" (TPR at low FPR).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from datarecon.errors import DataReconError
from datarecon.evaluation.neighbours import METRICS, Neighbours, nearest_neighbours
from datarecon.evaluation.similarity import Window

__all__ = [
    "LOW_FPRS",
    "RealLabels",
    "real_labels",
    "label_candidates",
    "roc_curve",
    "roc_auc",
    "tpr_at_fpr",
    "PrivacyScore",
    "score_privacy",
    "privacy_report",
    "bootstrap_auc_ci",
]

#: False-positive rates at which the TPR is reported.
LOW_FPRS: tuple[float, ...] = (0.01, 0.001)


def real_labels(best_train: Tensor, best_heldout: Tensor, *, higher_is_better: bool = True,
                floor: float | None = None) -> Tensor:
    """Apply the rule: real iff the best training match beats the best held-out match.

    Args:
        best_train: ``(M,)`` each candidate's best similarity (or distance) to the training set.
        best_heldout: ``(M,)`` the same to the held-out set.
        higher_is_better: True for similarities (SSIM, NCC), False for distances (L2).
        floor: If given, a real candidate must also have ``best_train > floor``
            (distances: ``best_train < floor``). None: no floor.

    Returns:
        ``(M,)`` bool, True = real (ties are fake).
    """
    a = torch.as_tensor(best_train, dtype=torch.float64)
    b = torch.as_tensor(best_heldout, dtype=torch.float64)
    if a.shape != b.shape:
        raise DataReconError(f"best_train {tuple(a.shape)} and best_heldout {tuple(b.shape)} differ in shape")
    real = a > b if higher_is_better else a < b
    if floor is not None:
        real = real & ((a > floor) if higher_is_better else (a < floor))
    return real


@dataclass(frozen=True)
class RealLabels:
    """Ground-truth real/fake labels and the searches behind them.

    Attributes:
        real: ``(M,)`` bool.
        train: Nearest training images (:class:`Neighbours`).
        heldout: Nearest held-out images (:class:`Neighbours`).
        metric: Metric used by the rule.
        floor: Floor used by the rule, or None.
    """

    real: Tensor
    train: Neighbours
    heldout: Neighbours
    metric: str
    floor: float | None = None


def label_candidates(cands: Tensor, train: Tensor, heldout: Tensor, *, metric: str = "ssim",
                     prefilter: str | None = "lncc", top_k: int = 32,
                     window: str | Window = "gaussian", floor: float | None = None,
                     progress: bool = False) -> RealLabels:
    """Nearest neighbours in the training and held-out sets, then :func:`real_labels`.

    Args:
        cands: ``(M, C, H, W)`` display-space candidates in ``[0, 1]``.
        train: ``(N, C, H, W)`` training images; heldout: ``(K, C, H, W)``.
        metric, prefilter, top_k, window: See :func:`nearest_neighbours`.
        floor: See :func:`real_labels`.

    Returns:
        :class:`RealLabels`.
    """
    m = METRICS.get(metric)
    kw = dict(metric=metric, prefilter=prefilter, top_k=top_k, window=window, progress=progress)
    nt = nearest_neighbours(cands, train, **kw)
    nh = nearest_neighbours(cands, heldout, **kw)
    real = real_labels(nt.score, nh.score, higher_is_better=m.higher_is_better, floor=floor)
    return RealLabels(real, nt, nh, m.name, floor)


def _as_np(x, name: str) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    arr = np.asarray(x, dtype=float).reshape(-1)
    return arr


def roc_curve(labels, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve with one point per distinct score (ties move diagonally).

    Args:
        labels: ``(n,)`` bool/0-1, True = positive (real).
        scores: ``(n,)`` higher = more likely positive. NaN scores are
            treated as the lowest possible score.

    Returns:
        ``(fpr, tpr, thresholds)``: arrays of length ``d + 1`` for ``d``
        distinct scores, starting at ``(0, 0)`` with threshold ``+inf``;
        point k classifies ``score >= thresholds[k]`` as positive. With no
        positives (negatives) the TPR (FPR) is NaN.
    """
    y = _as_np(labels, "labels") > 0.5
    s = _as_np(scores, "scores")
    if y.shape != s.shape:
        raise DataReconError(f"labels ({y.size}) and scores ({s.size}) have different lengths")
    s = np.where(np.isnan(s), -np.inf, s)
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last = np.r_[np.nonzero(s[1:] != s[:-1])[0], s.size - 1] if s.size else np.array([], dtype=int)
    tp = np.cumsum(y)[last]
    fp = np.cumsum(~y)[last]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    tp = np.r_[0, tp].astype(float)
    fp = np.r_[0, fp].astype(float)
    thr = np.r_[np.inf, s[last]]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr = tp / n_pos if n_pos else np.full_like(tp, np.nan)
        fpr = fp / n_neg if n_neg else np.full_like(fp, np.nan)
    return fpr, tpr, thr


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve (trapezoid; ties count one half).

    Equals ``P(score_pos > score_neg) + 0.5 P(score_pos == score_neg)``.

    Returns:
        AUC in ``[0, 1]``, or NaN if only one class is present.
    """
    fpr, tpr, _ = roc_curve(labels, scores)
    if np.isnan(fpr).any() or np.isnan(tpr).any():
        return float("nan")
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Highest TPR among ROC points with FPR <= ``target`` (no interpolation).

    With ``n_neg`` negatives, any ``target < 1 / n_neg`` gives the TPR at
    FPR 0. Returns NaN if the curve is undefined (one class).
    """
    fpr = np.asarray(fpr, dtype=float)
    tpr = np.asarray(tpr, dtype=float)
    if fpr.size == 0 or np.isnan(fpr).any() or np.isnan(tpr).any():
        return float("nan")
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max())


@dataclass(frozen=True)
class PrivacyScore:
    """How well one attacker-side score separates real from fake candidates.

    Attributes:
        name: Score name.
        auc: ROC AUC (NaN if one class).
        tpr_at: ``{fpr: tpr}`` at :data:`LOW_FPRS`.
        fpr, tpr, thresholds: ROC points.
        n_real, n_fake: Class sizes.
        note: Caveats (one class; too few negatives for the low FPRs; NaN scores).
    """

    name: str
    auc: float
    tpr_at: dict[float, float]
    fpr: np.ndarray
    tpr: np.ndarray
    thresholds: np.ndarray
    n_real: int
    n_fake: int
    note: str = ""

    def summary(self) -> dict:
        """JSON-ready summary (without the curve)."""
        return {"auc": self.auc, "tpr_at_fpr": {str(k): v for k, v in self.tpr_at.items()},
                "n_real": self.n_real, "n_fake": self.n_fake, "note": self.note}


def score_privacy(labels, scores, *, name: str = "score",
                  fprs: tuple[float, ...] = LOW_FPRS) -> PrivacyScore:
    """ROC AUC, TPR at low FPR and the ROC curve of one score.

    Args:
        labels: ``(M,)`` bool, True = real (from :func:`real_labels`).
        scores: ``(M,)`` attacker-side score, higher = more likely real.
        name: Score name.
        fprs: FPRs at which to report the TPR.
    """
    y = _as_np(labels, "labels") > 0.5
    s = _as_np(scores, "scores")
    fpr, tpr, thr = roc_curve(y, s)
    n_real, n_fake = int(y.sum()), int((~y).sum())
    notes = []
    if n_real == 0 or n_fake == 0:
        notes.append(f"only one class ({n_real} real, {n_fake} fake): AUC undefined")
    else:
        small = [f for f in fprs if f < 1.0 / n_fake]
        if small:
            notes.append(f"{n_fake} fake candidates: TPR at FPR {', '.join(map(str, small))} is the TPR at FPR 0")
    if np.isnan(s).any():
        notes.append(f"{int(np.isnan(s).sum())} NaN scores ranked lowest")
    return PrivacyScore(name, roc_auc(y, s), {float(f): tpr_at_fpr(fpr, tpr, f) for f in fprs},
                        fpr, tpr, thr, n_real, n_fake, "; ".join(notes))


def privacy_report(labels, scores: Mapping[str, Tensor], *,
                   fprs: tuple[float, ...] = LOW_FPRS) -> dict[str, PrivacyScore]:
    """:func:`score_privacy` for every attacker-side score.

    Args:
        labels: ``(M,)`` bool real/fake ground truth.
        scores: ``{name: (M,) tensor}``, higher = more likely real.

    Returns:
        ``{name: PrivacyScore}`` in the order of ``scores``.
    """
    n = _as_np(labels, "labels").size
    out = {}
    for k, v in scores.items():
        if _as_np(v, k).size != n:
            raise DataReconError(f"score {k!r} has {_as_np(v, k).size} values for {n} candidates")
        out[k] = score_privacy(labels, v, name=k, fprs=fprs)
    return out


def bootstrap_auc_ci(labels, scores, *, n_boot: int = 1000, level: float = 0.95,
                     generator: np.random.Generator | int | None = 0) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the ROC AUC.

    Stratified: each resample draws ``n_real`` real and ``n_fake`` fake candidates with
    replacement from their own class, so every resample has both classes and the class sizes
    of the data. The AUC of a resample is :func:`roc_auc` (ties one half, NaN scores lowest).

    Args:
        labels: ``(M,)`` bool, True = real.
        scores: ``(M,)`` attacker-side score, higher = more likely real.
        n_boot: Resamples.
        level: Coverage of the interval, in ``(0, 1)``.
        generator: numpy Generator or seed (same seed, same interval).

    Returns:
        ``(low, high)``, or None when one class is empty (AUC undefined: "not measurable").

    References:
        Efron & Tibshirani (1993), ch. 13 (percentile interval).
    """
    y = _as_np(labels, "labels") > 0.5
    s = _as_np(scores, "scores")
    if y.shape != s.shape:
        raise DataReconError(f"labels ({y.size}) and scores ({s.size}) have different lengths")
    if not 0.0 < level < 1.0 or n_boot < 1:
        raise DataReconError(f"need 0 < level < 1 and n_boot >= 1, got level {level}, n_boot {n_boot}")
    pos, neg = s[y], s[~y]
    if pos.size == 0 or neg.size == 0:
        return None
    rng = generator if isinstance(generator, np.random.Generator) else np.random.default_rng(generator)
    ip = rng.integers(0, pos.size, size=(n_boot, pos.size))
    ineg = rng.integers(0, neg.size, size=(n_boot, neg.size))
    lab = np.r_[np.ones(pos.size, bool), np.zeros(neg.size, bool)]
    aucs = np.array([roc_auc(lab, np.r_[pos[a], neg[b]]) for a, b in zip(ip, ineg, strict=True)])
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(aucs, alpha)), float(np.quantile(aucs, 1.0 - alpha))
