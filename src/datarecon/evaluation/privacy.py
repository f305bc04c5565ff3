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
    ``floor``). :func:`~datarecon.evaluation.evaluation_against` sets it by
    default to the best similarity to the training set reached by any of M
    uniform-noise images (the noise null baseline).

The attacker scores each candidate with attacker-side signals only (higher =
more likely real), e.g. the candidate's multiplier λ_i, its margin, or its
KKT residual share. We report ROC AUC (ties count one half, the
Mann-Whitney statistic), TPR at 1% and 0.1% FPR and the ROC points. ROC and
AUC are implemented here with numpy (tested against scikit-learn).

Naming: in code the two classes are ``real``/``fake`` (``n_real``, :func:`real_labels`); everything a
reader sees calls them by what the rule measured (:data:`POSITIVE`, :data:`NEGATIVE`), since a
candidate closer to a training image than to any held-out one need not be that training image.

References:
    Runkel et al. (2024), "Training Data Reconstruction: Privacy due to
    Uncertainty?"; Carlini et al. (2022), "Membership Inference Attacks From
    First Principles" (TPR at low FPR).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from datarecon.errors import DataReconError
from datarecon.evaluation.neighbours import METRICS, NeighbourSearch, Neighbours, nearest_neighbours
from datarecon.evaluation.similarity import Window

__all__ = [
    "LOW_FPRS",
    "MIN_CLASS_SIZE",
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
    "negatives_needed",
    "POSITIVE",
    "NEGATIVE",
    "SignalVerdict",
    "signal_verdict",
]

#: False-positive rates at which the TPR is reported.
LOW_FPRS: tuple[float, ...] = (0.01, 0.001)

#: Fewest real and fewest fake candidates for which an ROC is reported: below it one candidate
#: moves the AUC by more than 0.1 (one fake among 80 gives AUC 1.0 or 0.0 by luck).
MIN_CLASS_SIZE = 10

#: What the two classes of the rule are called wherever a reader sees them. The labels say what was
#: measured; a candidate closer to a training image is not thereby a "real" training image (a blurred
#: mean digit shared by many candidates can be closer to one training image than to any held-out one).
POSITIVE = "closer to a training image than to any held-out image"
NEGATIVE = "not closer to a training image"


def negatives_needed(fpr: float) -> int:
    """Fewest negatives at which a TPR at false-positive rate ``fpr`` is estimable: ``ceil(1 / fpr)``
    (100 for 1 %, 1000 for 0.1 %); with fewer, one false positive already exceeds ``fpr``."""
    return int(math.ceil(1.0 / fpr - 1e-9))


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
                     search: NeighbourSearch = NeighbourSearch(), window: str | Window = "gaussian",
                     floor: float | None = None, progress: bool = False) -> RealLabels:
    """Nearest neighbours in the training and held-out sets, then :func:`real_labels`.

    Args:
        cands: ``(M, C, H, W)`` display-space candidates in ``[0, 1]``.
        train: ``(N, C, H, W)`` training images; heldout: ``(K, C, H, W)``.
        metric, search, window: See :func:`nearest_neighbours`.
        floor: See :func:`real_labels`.

    Returns:
        :class:`RealLabels`.
    """
    m = METRICS.get(metric)
    nt = nearest_neighbours(cands, train, metric=metric, search=search, window=window, progress=progress)
    nh = nearest_neighbours(cands, heldout, metric=metric, search=search, window=window, progress=progress)
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
        tpr_at: ``{fpr: tpr}`` at :data:`LOW_FPRS`; NaN where not estimable (fewer negatives than
            :func:`negatives_needed`).
        fpr, tpr, thresholds: ROC points.
        n_real, n_fake: Class sizes.
        note: Caveats (one class; too few negatives for the low FPRs; NaN scores).
        measurable: both classes have at least ``min_class_size`` candidates; when False, ``auc``
            and ``tpr_at`` are NaN (the ROC of a handful of candidates is luck, not a measurement).
        tpr_estimable: ``{fpr: bool}``: enough negatives for that FPR.
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
    measurable: bool = True
    tpr_estimable: dict[float, bool] = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready summary (without the curve)."""
        return {"auc": self.auc, "tpr_at_fpr": {str(k): v for k, v in self.tpr_at.items()},
                "tpr_estimable": {str(k): v for k, v in self.tpr_estimable.items()},
                "negatives_needed": {str(k): negatives_needed(k) for k in self.tpr_at},
                "n_real": self.n_real, "n_fake": self.n_fake, "note": self.note, "measurable": self.measurable}


def score_privacy(labels, scores, *, name: str = "score", fprs: tuple[float, ...] = LOW_FPRS,
                  min_class_size: int = MIN_CLASS_SIZE) -> PrivacyScore:
    """ROC AUC, TPR at low FPR and the ROC curve of one score.

    Args:
        labels: ``(M,)`` bool, True = real (from :func:`real_labels`).
        scores: ``(M,)`` attacker-side score, higher = more likely real.
        name: Score name.
        fprs: FPRs at which to report the TPR; a TPR at FPR ``f`` is only estimated with at least
            :func:`negatives_needed` ``(f)`` fake candidates (else NaN, "not estimable").
        min_class_size: below this many real or fake candidates the separation is reported as not
            measurable (AUC and TPRs NaN, ``measurable`` False).
    """
    y = _as_np(labels, "labels") > 0.5
    s = _as_np(scores, "scores")
    fpr, tpr, thr = roc_curve(y, s)
    n_real, n_fake = int(y.sum()), int((~y).sum())
    estimable = {float(f): n_fake >= negatives_needed(f) for f in fprs}
    notes = []
    nan = float("nan")
    if n_real == 0 or n_fake == 0:
        notes.append(f"only one class ({n_real} closer to a training image, {n_fake} not): AUC undefined")
    elif min(n_real, n_fake) < min_class_size:
        notes.append(f"not measurable: {n_real} candidates closer to a training image and {n_fake} not, fewer than "
                     f"{min_class_size} in a class")
        return PrivacyScore(name, nan, {float(f): nan for f in fprs}, fpr, tpr, thr, n_real, n_fake,
                            "; ".join(notes), measurable=False, tpr_estimable=estimable)
    else:
        small = [f for f in fprs if not estimable[float(f)]]
        if small:
            notes.append("TPR at FPR " + ", ".join(f"{100 * f:g}%" for f in small) + " not estimable: "
                         f"{n_fake} negatives, " + ", ".join(str(negatives_needed(f)) for f in small)
                         + " needed")
    if np.isnan(s).any():
        notes.append(f"{int(np.isnan(s).sum())} NaN scores ranked lowest")
    tprs = {float(f): (tpr_at_fpr(fpr, tpr, f) if estimable[float(f)] else nan) for f in fprs}
    return PrivacyScore(name, roc_auc(y, s), tprs, fpr, tpr, thr, n_real, n_fake, "; ".join(notes),
                        measurable=n_real > 0 and n_fake > 0, tpr_estimable=estimable)


def privacy_report(labels, scores: Mapping[str, Tensor], *, fprs: tuple[float, ...] = LOW_FPRS,
                   min_class_size: int = MIN_CLASS_SIZE) -> dict[str, PrivacyScore]:
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
        out[k] = score_privacy(labels, v, name=k, fprs=fprs, min_class_size=min_class_size)
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


@dataclass(frozen=True)
class SignalVerdict:
    """What a privacy measurement says, in words, from its summary (the report's privacy card).

    Attributes:
        measured: One sentence: what was measured (class sizes under the rule).
        lead: The verdict: the signal that separates the classes (only one whose 95% CI excludes
            0.5), that none does better than chance, or that it is not measurable and why.
        needs: What would make it measurable or the low-FPR TPRs estimable ("" when nothing).
        best: Name of the signal whose CI lies wholly above 0.5 with the highest AUC, or None.
        status: ``ok`` (a signal separates), ``warn`` (not measurable), ``""`` (no signal beats chance).
    """

    measured: str
    lead: str
    needs: str
    best: str | None
    status: str


def signal_verdict(summary: Mapping[str, Any], *, fprs: Sequence[float] = LOW_FPRS) -> SignalVerdict:
    """Read a privacy summary (``metrics.json`` ``privacy``) generically over its signals.

    Every attacker-side signal in ``summary["scores"]`` is judged the same way: its AUC counts as a
    separation only when its stratified-bootstrap 95% CI lies above 0.5 (a CI that covers 0.5 is
    indistinguishable from chance, whatever the point estimate); TPRs at low FPR need
    :func:`negatives_needed` negatives.

    Args:
        summary: ``{"n_real", "n_fake", "min_class_size", "scores": {name: {"auc", "auc_ci_95",
            "measurable", ...}}}`` (:func:`datarecon.evaluation.reports.privacy_section`).
        fprs: The low FPRs reported.

    Returns:
        :class:`SignalVerdict`.
    """
    n_pos, n_neg = summary.get("n_real"), summary.get("n_fake")
    least = int(summary.get("min_class_size") or MIN_CLASS_SIZE)
    if n_pos is None or n_neg is None:
        return SignalVerdict("", str(summary.get("note") or "not measured: no held-out images"),
                             "needs both training and held-out images: evaluate against train and heldout "
                             "(--against)", None, "warn")
    measured = f"{n_pos} candidates {POSITIVE}, {n_neg} {NEGATIVE}"
    scores = dict(summary.get("scores") or {})
    if min(n_pos, n_neg) < least:
        short = []
        if n_neg < least:
            short.append(f"{least - n_neg} more {NEGATIVE} (more candidates m, or more held-out images, which make "
                         "the rule stricter)")
        if n_pos < least:
            short.append(f"{least - n_pos} more {POSITIVE} (a stronger attack, or more candidates m)")
        lead = (f"not measurable: an AUC needs at least {least} candidates of each class; {n_pos} and {n_neg} "
                "were found")
        return SignalVerdict(measured, lead, "; ".join(short), None, "warn")
    if not scores:
        return SignalVerdict(measured, "no attacker-side signals were recorded", "", None, "warn")
    best, best_auc = None, -1.0
    for name, v in scores.items():
        ci = v.get("auc_ci_95")
        auc = v.get("auc")
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and ci[0] is not None and ci[0] > 0.5 \
                and isinstance(auc, (int, float)) and auc > best_auc:
            best, best_auc = name, float(auc)
    if best is not None:
        ci = scores[best]["auc_ci_95"]
        lead = f"{best} separates them: AUC {best_auc:.2f} (95% CI {ci[0]:.2f}–{ci[1]:.2f}, above 0.5)"
        status = "ok"
    else:
        lead = f"no signal separates them better than chance: every 95% CI covers 0.5 ({len(scores)} signals)"
        status = ""
    missing = [f for f in fprs if n_neg < negatives_needed(f)]
    needs = ("TPR at " + " and ".join(f"{100 * f:g}% FPR" for f in missing) + " not estimable: "
             + ", ".join(f"{negatives_needed(f)}" for f in missing) + f" negatives needed, {n_neg} found") \
        if missing else ""
    return SignalVerdict(measured, lead, needs, best, status)
