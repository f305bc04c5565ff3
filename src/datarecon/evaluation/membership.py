"""How well an attacker-side score tells members from non-members, reported as LiRA reports it.

Ground truth enters here: the scores of images known to be training images (members) and of
images known not to be (non-members: held-out images of the same distribution, or reconstructions
known to be fake). Reported: ROC AUC with a stratified bootstrap 95 % interval, and the TPR at
low FPR (1 % and 0.1 %) with its own bootstrap interval. A TPR at FPR f is only *estimable* with
at least 1/f negatives (100 for 1 %, 1000 for 0.1 %): below that the lowest non-zero FPR on the
curve is above f, and "TPR at 0.1 %" would be the TPR at FPR 0 of a few dozen images, so it is
reported as ``None`` with the reason (Carlini et al. 2022 report TPR at low FPR only with enough
negatives to resolve it).

Pure functions of score arrays; :func:`membership_roc` is the one entry point.

References:
    Carlini, Chien, Nasr, Song, Terzis, Tramèr (2022), "Membership Inference Attacks From First
    Principles" (TPR at low FPR); Efron & Tibshirani (1993), ch. 13 (percentile bootstrap).
"""

from __future__ import annotations

from dataclasses import asdict as dataclasses_asdict
from dataclasses import dataclass, field
from typing import Any

import math

import numpy as np
from scipy.special import betaincinv

from datarecon.attacks.mia import ranked
from datarecon.errors import DataReconError
from datarecon.evaluation.privacy import LOW_FPRS, MIN_CLASS_SIZE, bootstrap_auc_ci, roc_auc, roc_curve, tpr_at_fpr

__all__ = ["EXPECTED_GAIN", "EpsilonBound", "MembershipROC", "calibrated_threshold", "clopper_pearson", "epsilon_lower_bound",
           "headline_verdict", "membership_roc", "min_negatives"]

#: what the reference attacks found on the networks measured (docs/RESULTS.md, "Membership on the networks people
#: train"): said wherever they were not run, as the gain they may bring
EXPECTED_GAIN = ("on the CNNs measured they raised the TPR at 1% FPR over the loss threshold's from 0.12 to 0.68 "
                 "(CIFAR CNN, n = 100) and from 0 to 0.50 (a fine-tuned CNN); docs/RESULTS.md")

#: Bootstrap resamples of the intervals, and their seed (same data, same interval).
N_BOOT, BOOT_SEED = 1000, 0


def min_negatives(fpr: float) -> int:
    """Fewest negatives at which a TPR at ``fpr`` can be read off the ROC curve: ⌈1/fpr⌉."""
    return int(np.ceil(1.0 / fpr - 1e-9))


def calibrated_threshold(null: np.ndarray, fpr: float) -> float:
    """The lowest score threshold that at most a fraction ``fpr`` of the null scores reach (≥ counts).

    Scores ≥ the threshold are called members; +inf when no finite threshold keeps the rate.
    """
    s = np.sort(np.asarray(null, dtype=float))[::-1]
    allowed = int(np.floor(fpr * s.size + 1e-9))  # this many null scores may pass
    if s.size == 0:
        return float("inf")
    if allowed >= s.size:
        return float(s[-1])
    # the (allowed+1)-th largest null score must fail: threshold just above it
    return float(np.nextafter(s[allowed], np.inf))


@dataclass(frozen=True)
class MembershipROC:
    """Separation of members from non-members by one score (higher = member).

    Attributes:
        name: the score's name.
        n_members, n_nonmembers: class sizes.
        auc: ROC AUC (ties one half); NaN with an empty class.
        auc_ci: (low, high) stratified bootstrap 95 % interval, or None.
        tpr_at: ``{fpr: TPR or None}`` (None: not estimable, see ``notes``).
        tpr_ci: ``{fpr: (low, high) or None}``.
        thresholds: ``{fpr: score threshold}`` calibrated on the non-members (at most fpr pass).
        notes: why a number is missing or approximate.
    """

    name: str
    n_members: int
    n_nonmembers: int
    auc: float
    auc_ci: tuple[float, float] | None
    tpr_at: dict[float, float | None]
    tpr_ci: dict[float, tuple[float, float] | None]
    thresholds: dict[float, float]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"name": self.name, "n_members": self.n_members, "n_nonmembers": self.n_nonmembers,
                "auc": self.auc, "auc_ci": list(self.auc_ci) if self.auc_ci else None,
                "tpr_at_fpr": {str(k): v for k, v in self.tpr_at.items()},
                "tpr_ci": {str(k): (list(v) if v else None) for k, v in self.tpr_ci.items()},
                "thresholds": {str(k): v for k, v in self.thresholds.items()}, "notes": list(self.notes)}

    @property
    def chance(self) -> bool:
        """Whether the AUC's interval covers 0.5 (the signal is not shown to separate the classes)."""
        return self.auc_ci is not None and self.auc_ci[0] <= 0.5 <= self.auc_ci[1]

    def tpr_text(self, f: float) -> str:
        """``TPR 0.071 at 1.0% FPR (95% CI 0.000-0.214, covers 1.0%: not above chance)``, or why it is missing."""
        t = self.tpr_at.get(f)
        if t is None:
            return f"TPR at {f:.1%} FPR not estimable ({self.n_nonmembers} non-members, needs {min_negatives(f)})"
        ci = self.tpr_ci.get(f)
        if ci is None:
            return f"TPR {t:.3f} at {f:.1%} FPR"
        chance = f", covers {f:.1%}: not above chance" if ci[0] <= f else ""
        return f"TPR {t:.3f} at {f:.1%} FPR (95% CI {ci[0]:.3f}-{ci[1]:.3f}{chance})"

    def line(self) -> str:
        """One line for a terminal or a report card: the AUC with its interval (saying so where it covers 0.5), each
        TPR with its interval (saying so where it covers its FPR), and the members and non-members it was measured on."""
        if not np.isfinite(self.auc):
            return f"{self.name}: not measurable ({'; '.join(self.notes)})"
        ci = ""
        if self.auc_ci:
            ci = f" (95% CI {self.auc_ci[0]:.3f}-{self.auc_ci[1]:.3f}" + ("; covers 0.5: no better than chance)"
                                                                           if self.chance else ")")
        parts = [f"{self.name}: AUC {self.auc:.3f}{ci}", *[self.tpr_text(f) for f in self.tpr_at]]
        return ", ".join(parts) + f" [{self.n_members} members, {self.n_nonmembers} non-members]"


def _tpr_bootstrap(pos: np.ndarray, neg: np.ndarray, fpr: float, rng: np.random.Generator,
                   n_boot: int) -> tuple[float, float]:
    vals = np.empty(n_boot)
    lab = np.r_[np.ones(pos.size, bool), np.zeros(neg.size, bool)]
    for b in range(n_boot):
        p = pos[rng.integers(0, pos.size, pos.size)]
        q = neg[rng.integers(0, neg.size, neg.size)]
        f, t, _ = roc_curve(lab, np.r_[p, q])
        vals[b] = tpr_at_fpr(f, t, fpr)
    return float(np.quantile(vals, 0.025)), float(np.quantile(vals, 0.975))


def membership_roc(members: Any, nonmembers: Any, *, name: str = "score", fprs: tuple[float, ...] = LOW_FPRS,
                   n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> MembershipROC:
    """ROC AUC with its interval and the TPR at each of ``fprs`` where estimable; not measurable (AUC NaN, no
    interval, no TPR) with fewer than :data:`~datarecon.evaluation.privacy.MIN_CLASS_SIZE` members or non-members,
    the rule ``datarecon evaluate`` applies to its privacy ROCs.

    Args:
        members: (P,) scores of known members (higher = member).
        nonmembers: (N,) scores of known non-members.
        name: the score's name.
        fprs: false-positive rates of the TPRs (each needs ≥ 1/fpr non-members).
        n_boot, seed: bootstrap resamples and seed (0 resamples: no intervals).

    Raises:
        DataReconError: scores that are not finite numbers.
    """
    pos = np.asarray(members, dtype=float).reshape(-1)
    neg = np.asarray(nonmembers, dtype=float).reshape(-1)
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        raise DataReconError(f"membership score {name!r} has non-finite values; check the images and the model")
    notes: list[str] = []
    if min(pos.size, neg.size) < MIN_CLASS_SIZE:  # the rule of every ROC datarecon reports (evaluate's too)
        notes.append(f"{pos.size} members and {neg.size} non-members; an AUC needs at least {MIN_CLASS_SIZE} of each")
        return MembershipROC(name, pos.size, neg.size, float("nan"), None, {f: None for f in fprs},
                             {f: None for f in fprs}, {f: calibrated_threshold(neg, f) for f in fprs}, notes)
    labels = np.r_[np.ones(pos.size, bool), np.zeros(neg.size, bool)]
    scores = np.r_[pos, neg]
    auc = roc_auc(labels, scores)
    ci = bootstrap_auc_ci(labels, scores, n_boot=n_boot, generator=seed) if n_boot > 0 else None
    fpr, tpr, _ = roc_curve(labels, scores)
    rng = np.random.default_rng(seed + 1)
    tprs: dict[float, float | None] = {}
    tcis: dict[float, tuple[float, float] | None] = {}
    for f in fprs:
        if neg.size < min_negatives(f):
            tprs[f], tcis[f] = None, None
            notes.append(f"TPR at {f:g} FPR not estimable: {neg.size} non-members, needs at least {min_negatives(f)}")
        else:
            tprs[f] = tpr_at_fpr(fpr, tpr, f)
            tcis[f] = _tpr_bootstrap(pos, neg, f, rng, n_boot) if n_boot > 0 else None
    return MembershipROC(name, int(pos.size), int(neg.size), auc, ci, tprs, tcis,
                         {f: calibrated_threshold(neg, f) for f in fprs}, notes)


def candidate_roc(train_similarity: Any, threshold: float, scores: dict[str, Any]) -> dict[str, Any]:
    """Among one attack's candidates, do attacker-side scores single out those that reconstruct?

    A candidate *reconstructs* when its SSIM to its nearest training image exceeds ``threshold``
    (the headline's max(0.4, t)); each score (higher = more trusted) is then judged by
    :func:`membership_roc` with the reconstructing candidates as positives.

    Args:
        train_similarity: (M,) each candidate's best SSIM to the training set.
        threshold: the headline threshold.
        scores: ``{name: (M,)}`` attacker-side scores.

    Returns:
        JSON-ready: ``threshold``, ``positives``, ``negatives``, ``measurable`` (both classes have at
        least :data:`~datarecon.evaluation.privacy.MIN_CLASS_SIZE` candidates), ``signals`` (name → ROC
        summary), ``best`` (the signal with the highest AUC whose interval excludes 0.5, None when
        none or not measurable), ``note``.
    """
    sim = np.asarray(train_similarity, dtype=float).reshape(-1)
    pos = sim > threshold
    measurable = min(int(pos.sum()), int((~pos).sum())) >= MIN_CLASS_SIZE
    signals: dict[str, Any] = {}
    best, best_auc = None, -1.0
    for name, values in scores.items():
        v = np.asarray(values, dtype=float).reshape(-1)
        if v.size != sim.size or not np.isfinite(v).all():
            continue
        roc = membership_roc(v[pos], v[~pos], name=name)
        signals[name] = roc.summary()
        if measurable and roc.auc_ci is not None and roc.auc_ci[0] > 0.5 and roc.auc > best_auc:
            best, best_auc = name, roc.auc
    note = "" if measurable else (f"not measurable: {int(pos.sum())} candidates reconstruct and {int((~pos).sum())} "
                                  f"do not; each class needs at least {MIN_CLASS_SIZE}")
    return {"threshold": float(threshold), "positives": int(pos.sum()), "negatives": int((~pos).sum()),
            "measurable": measurable, "signals": signals, "best": best, "note": note}


@dataclass(frozen=True)
class CalibrationSplit:
    """A seeded, stratified split of members and non-members into a calibration part and a reported part.

    The strongest signal is chosen on the calibration part (:func:`choose_strongest`); every ROC that is
    reported is measured on the reported part only, so the choice never reads the numbers it headlines.

    Attributes:
        calibration: (N,) bool over the candidates (members first, then non-members, as scored).
        fraction: the fraction of each class in the calibration part.
        seed: the split's seed.
    """

    calibration: np.ndarray
    fraction: float
    seed: int

    @property
    def report(self) -> np.ndarray:
        """(N,) bool: the reported part."""
        return ~self.calibration


def calibration_split(is_member: Any, *, fraction: float, seed: int) -> CalibrationSplit:
    """Put ⌊fraction·|class|⌋ members and as many non-members, drawn by a seeded permutation, in the calibration part.

    Args:
        is_member: (N,) bool, ground truth.
        fraction: in [0, 1); 0 puts everything in the reported part (the strongest signal is then
            chosen by the rule fixed in advance, :func:`fixed_rule`).
        seed: the permutation's seed.

    Raises:
        DataReconError: a fraction outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise DataReconError(f"the calibration fraction must lie in [0, 1), got {fraction}")
    mem = np.asarray(is_member, dtype=bool).reshape(-1)
    cal = np.zeros(mem.size, dtype=bool)
    rng = np.random.default_rng(seed)
    for cls in (True, False):
        idx = np.flatnonzero(mem == cls)
        take = int(np.floor(fraction * idx.size + 1e-9))
        cal[rng.permutation(idx)[:take]] = True
    return CalibrationSplit(calibration=cal, fraction=float(fraction), seed=int(seed))


#: The false-positive rate at which the strongest signal is chosen (its TPR there; the AUC breaks ties).
CHOICE_FPR = 0.01


def fixed_rule(available: list[str], why: str = "nothing to choose on") -> str:
    """The rule fixed in advance, stated: the first of ``available`` in the order of the signals' declared ranks
    (:func:`~datarecon.attacks.mia.ranked`: the strongest attacks in the literature, reference attacks first), and
    why nothing was chosen on data."""
    return f"the rule fixed in advance, the first measured of {', '.join(ranked(available)) or 'none'} ({why})"


@dataclass(frozen=True)
class SignalPower:
    """How well a signal separated members from non-members where the choice is made (never the reported part).

    Attributes:
        auc: ROC AUC (NaN: not measured).
        tpr: TPR at :data:`CHOICE_FPR` (None: too few non-members to estimate it).
        members, nonmembers: the class sizes of one measurement (of each, where several are averaged).
        measurements: how many separate measurements (pseudo-targets) the AUC and TPR are the mean of.
    """

    auc: float
    tpr: float | None
    members: int
    nonmembers: int
    measurements: int = 1

    @classmethod
    def of(cls, roc: MembershipROC) -> SignalPower:
        return cls(auc=roc.auc, tpr=roc.tpr_at.get(CHOICE_FPR), members=roc.n_members, nonmembers=roc.n_nonmembers)

    @classmethod
    def mean(cls, rocs: list[MembershipROC]) -> SignalPower:
        """The mean AUC and TPR over several separate measurements (pseudo-targets); the sizes of one (their mean)."""
        tprs = [r.tpr_at.get(CHOICE_FPR) for r in rocs]
        return cls(auc=float(np.mean([r.auc for r in rocs])),
                   tpr=None if any(t is None for t in tprs) else float(np.mean(tprs)),  # type: ignore[arg-type]
                   members=int(round(float(np.mean([r.n_members for r in rocs])))),
                   nonmembers=int(round(float(np.mean([r.n_nonmembers for r in rocs])))), measurements=len(rocs))

    def sizes(self) -> str:
        """``10 members, 1490 non-members`` (``each`` where several measurements are averaged)."""
        return f"{self.members} members, {self.nonmembers} non-members" + (" each" if self.measurements > 1 else "")


def choose_strongest(power: dict[str, SignalPower], *, where: str = "the calibration part") -> tuple[str | None, str]:
    """The signal with the highest TPR at :data:`CHOICE_FPR` (the AUC breaks ties) where the choice is made.

    Where some signal's non-members are too few to resolve that TPR, the highest AUC; with nothing measured, the
    rule fixed in advance (:func:`fixed_rule`). Ties that remain go to the signal ranked first by that rule
    (:func:`~datarecon.attacks.mia.ranked`).

    Args:
        power: signal name → its :class:`SignalPower` where the choice is made.
        where: what that is, for the returned rule ("the calibration part", "4 reference models as
            pseudo-targets").

    Returns:
        (the chosen name or None when no signal was measured, how it was chosen).
    """
    measured = {k: p for k, p in power.items() if np.isfinite(p.auc)}
    if not measured:
        names = ranked(power)
        return (names[0] if names else None), fixed_rule(list(power))
    order = ranked(measured)  # max() keeps the first of equals: the earlier rank wins a tie
    unresolved = [k for k in order if measured[k].tpr is None]
    if not unresolved:
        best = max(order, key=lambda k: (measured[k].tpr, measured[k].auc))
        return best, (f"the highest TPR at {CHOICE_FPR:.0%} FPR on {where} ({measured[best].sizes()}), ties broken "
                      "by AUC")
    best = max(order, key=lambda k: measured[k].auc)
    few = measured[unresolved[0]]
    return best, (f"the highest AUC on {where} ({measured[best].sizes()}): {', '.join(unresolved)} "
                  f"{'was' if len(unresolved) == 1 else 'were'} measured on {few.sizes()}, too few non-members for a "
                  f"TPR at {CHOICE_FPR:.0%} FPR (needs {min_negatives(CHOICE_FPR)})")


def headline_verdict(chosen: MembershipROC, baseline: MembershipROC) -> str:
    """Why the chosen signal must not be the headline, measured beside the loss threshold on the same members and
    non-members ("" when it may): its AUC interval lies below 0.5 or below the loss threshold's interval, or it is
    weaker than the loss threshold both in AUC and in TPR at :data:`CHOICE_FPR` FPR. The headline is then the loss
    threshold, the baseline every membership attack is compared with."""
    if chosen.name == baseline.name or not (np.isfinite(chosen.auc) and np.isfinite(baseline.auc)):
        return ""
    ci, base_ci = chosen.auc_ci, baseline.auc_ci
    if ci is not None and ci[1] < 0.5:
        return f"{chosen.name}'s AUC interval {ci[0]:.3f}-{ci[1]:.3f} lies below 0.5"
    if ci is not None and base_ci is not None and ci[1] < base_ci[0]:
        return (f"{chosen.name}'s AUC interval {ci[0]:.3f}-{ci[1]:.3f} lies below the loss threshold's "
                f"{base_ci[0]:.3f}-{base_ci[1]:.3f}")
    t, tb = chosen.tpr_at.get(CHOICE_FPR), baseline.tpr_at.get(CHOICE_FPR)
    if chosen.auc < baseline.auc and (t is None or tb is None or t <= tb):
        tprs = f" and TPR {t:.3f} <= {tb:.3f} at {CHOICE_FPR:.0%} FPR" if t is not None and tb is not None else ""
        return f"{chosen.name} is weaker than the loss threshold (AUC {chosen.auc:.3f} < {baseline.auc:.3f}{tprs})"
    return ""


def clopper_pearson(successes: int, trials: int, *, alpha: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds of a binomial rate: (lower, upper), each holding with probability 1 − alpha.

    Raises:
        DataReconError: no trials, or successes outside 0..trials.
    """
    if trials <= 0 or not 0 <= successes <= trials:
        raise DataReconError(f"a rate needs 0 <= successes <= trials and trials > 0; got {successes} of {trials}")
    lo = 0.0 if successes == 0 else float(betaincinv(successes, trials - successes + 1, alpha))
    hi = 1.0 if successes == trials else float(betaincinv(successes + 1, trials - successes, 1 - alpha))
    return lo, hi


#: The false-positive rates whose thresholds the ε bound tries (fixed in advance; each needs 1/fpr non-members).
EPSILON_FPRS: tuple[float, ...] = (0.1, 0.01, 0.001)


@dataclass(frozen=True)
class EpsilonBound:
    """An empirical lower bound on the ε of any (ε, δ)-DP guarantee the training could have had.

    Attributes:
        lower: ε that holds with probability ``confidence`` (Clopper–Pearson bounds of TPR and FPR, Bonferroni
            over the thresholds tried); 0 when nothing is shown.
        estimate: the same with the observed TPR and FPR at that threshold (the error rates floored at one example,
            so that a perfect separation gives a finite number).
        fpr: the false-positive rate of the threshold that gave ``lower``; tpr: its observed TPR.
        delta: the δ assumed; confidence: the level of ``lower``.
        members, nonmembers: the class sizes; note: how it was computed.
    """

    lower: float
    estimate: float
    fpr: float | None
    tpr: float | None
    delta: float
    confidence: float
    members: int
    nonmembers: int
    note: str

    def summary(self) -> dict[str, Any]:
        return dataclasses_asdict(self)

    def line(self) -> str:
        if self.fpr is None:
            return f"empirical epsilon: no lower bound above 0 ({self.note})"
        return (f"empirical epsilon >= {self.lower:.2f} with {self.confidence:.0%} confidence (point estimate "
                f"{self.estimate:.2f}; threshold at {self.fpr:.1%} FPR, TPR {self.tpr:.3f}; delta = {self.delta:g}; "
                f"{self.members} members, {self.nonmembers} non-members)")


def _epsilon(tp: float, fp: float, delta: float) -> float:
    """max of the two (ε, δ)-DP inequalities' ε for a test with TPR ``tp`` and FPR ``fp`` (0 when neither binds)."""
    vals = [0.0]
    if tp - delta > 0 and fp > 0:
        vals.append(math.log((tp - delta) / fp))
    if 1 - fp - delta > 0 and tp < 1:
        vals.append(math.log((1 - fp - delta) / (1 - tp)))
    return max(vals)


def epsilon_lower_bound(members: Any, nonmembers: Any, *, delta: float = 0.0, confidence: float = 0.95,
                        fprs: tuple[float, ...] = EPSILON_FPRS) -> EpsilonBound:
    """The empirical ε lower bound of a membership test (Jagielski et al. 2020; Nasr et al. 2021).

    A training algorithm that is (ε, δ)-DP bounds every membership test: TPR ≤ e^ε·FPR + δ and
    1 − FPR ≤ e^ε·(1 − TPR) + δ. At each threshold fixed in advance (calibrated to let through
    ``fprs`` of the non-members, each where the non-members resolve it), the test's TPR and FPR are bounded
    by one-sided Clopper–Pearson intervals at level (1 − confidence)/(2·thresholds) (Bonferroni), and the
    largest ε the two inequalities then force is the bound. It treats the members and non-members as the
    draws of a DP game, which a membership evaluation approximates (members and non-members from one
    distribution); it bounds what the training could promise, not what an attacker gains.

    Args:
        members, nonmembers: scores (higher = member) of known members and non-members.
        delta: the δ of the guarantee bounded.
        confidence: the level of ``lower``.
        fprs: the false-positive rates of the thresholds tried.

    References:
        Jagielski, Ullman, Oprea (2020), "Auditing Differentially Private Machine Learning"; Nasr, Song, Thakurta,
        Papernot, Carlini (2021), "Adversary Instantiation: Lower Bounds for Differentially Private Machine Learning".
    """
    pos = np.asarray(members, dtype=float).reshape(-1)
    neg = np.asarray(nonmembers, dtype=float).reshape(-1)
    usable = [f for f in fprs if neg.size >= min_negatives(f)] if min(pos.size, neg.size) >= MIN_CLASS_SIZE else []
    if not usable:
        return EpsilonBound(0.0, 0.0, None, None, delta, confidence, int(pos.size), int(neg.size),
                            f"{pos.size} members, {neg.size} non-members: too few to bound a rate")
    alpha = (1 - confidence) / (2 * len(usable))
    best: tuple[float, float, float, float] = (0.0, 0.0, usable[0], 0.0)
    for f in usable:
        thr = calibrated_threshold(neg, f)
        tp, fp = int((pos >= thr).sum()), int((neg >= thr).sum())
        tpr_lo, _ = clopper_pearson(tp, pos.size, alpha=alpha)
        _, fpr_hi = clopper_pearson(fp, neg.size, alpha=alpha)
        lower = _epsilon(tpr_lo, fpr_hi, delta)
        estimate = _epsilon(min(tp, pos.size - 1) / pos.size, max(fp, 1) / neg.size, delta)
        if lower > best[0] or (lower == best[0] and estimate > best[1]):
            best = (lower, estimate, f, tp / pos.size)
    note = (f"thresholds at {', '.join(f'{f:.1%}' for f in usable)} FPR of the non-members; {2 * len(usable)} "
            f"one-sided Clopper-Pearson bounds (a TPR and an FPR per threshold), each at {1 - alpha:.2%} confidence "
            f"so that all hold together with {confidence:.0%} (Bonferroni)")
    if best[0] <= 0:
        return EpsilonBound(0.0, best[1], None, None, delta, confidence, int(pos.size), int(neg.size), note)
    return EpsilonBound(best[0], best[1], best[2], best[3], delta, confidence, int(pos.size), int(neg.size), note)
