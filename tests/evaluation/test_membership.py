"""Membership ROC: toys whose answers are known, scikit-learn as the reference, the estimability rule."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from datarecon.errors import DataReconError
from datarecon.evaluation.membership import calibrated_threshold, candidate_roc, membership_roc, min_negatives


def test_perfect_separation():
    r = membership_roc(np.linspace(1, 2, 50), np.linspace(-2, 0, 1200), name="toy")
    assert r.auc == 1.0 and r.auc_ci == pytest.approx((1.0, 1.0))
    assert r.tpr_at[0.01] == 1.0 and r.tpr_at[0.001] == 1.0 and r.tpr_ci[0.01] == (1.0, 1.0)
    assert not r.notes


def test_auc_and_tpr_match_independent_references():
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 2000)
    r = membership_roc(pos, neg)
    labels = np.r_[np.ones(300), np.zeros(2000)]
    assert r.auc == pytest.approx(roc_auc_score(labels, np.r_[pos, neg]), abs=1e-12)
    # TPR at 1% FPR: the fraction of positives above the calibrated threshold of the negatives
    thr = r.thresholds[0.01]
    assert (neg >= thr).mean() <= 0.01
    assert r.tpr_at[0.01] == pytest.approx((pos >= thr).mean(), abs=1e-12)
    lo, hi = r.auc_ci
    assert lo < r.auc < hi and hi - lo < 0.1
    assert r.tpr_ci[0.01][0] <= r.tpr_at[0.01] <= r.tpr_ci[0.01][1]


def test_identical_distributions_have_an_interval_around_one_half():
    rng = np.random.default_rng(1)
    r = membership_roc(rng.normal(size=400), rng.normal(size=400))
    assert r.auc_ci[0] < 0.5 < r.auc_ci[1]


def test_tpr_at_low_fpr_needs_enough_negatives():
    r = membership_roc(np.ones(30), np.zeros(250))
    assert r.tpr_at[0.01] == 1.0 and r.tpr_at[0.001] is None and r.tpr_ci[0.001] is None
    assert any("needs at least 1000" in n for n in r.notes)
    assert "not estimable (250 non-members, needs 1000)" in r.line()
    assert min_negatives(0.01) == 100 and min_negatives(0.001) == 1000


@pytest.mark.parametrize("members, nonmembers", [(20, 2), (90, 8), (9, 500), (3, 0)])
def test_fewer_than_ten_of_a_class_is_not_measurable_as_in_evaluate(members, nonmembers):
    """One rule for membership and evaluate's privacy ROCs: an AUC needs MIN_CLASS_SIZE of each class."""
    from datarecon.evaluation.privacy import MIN_CLASS_SIZE, score_privacy

    r = membership_roc(np.linspace(1, 2, members), np.linspace(-2, 0, nonmembers), name="loss")
    assert np.isnan(r.auc) and r.auc_ci is None and all(v is None for v in r.tpr_at.values())
    assert r.line() == (f"loss: not measurable ({members} members and {nonmembers} non-members; an AUC needs at least "
                        f"{MIN_CLASS_SIZE} of each)")
    labels = np.r_[np.ones(members, bool), np.zeros(nonmembers, bool)]
    assert not score_privacy(labels, np.r_[np.linspace(1, 2, members), np.linspace(-2, 0, nonmembers)]).measurable
    assert np.isfinite(membership_roc(np.linspace(1, 2, 10), np.linspace(-2, 0, 10)).auc)


def test_empty_class_and_bad_scores():
    r = membership_roc(np.ones(3), np.zeros(0))
    assert np.isnan(r.auc) and "not measurable" in r.line()
    with pytest.raises(DataReconError, match="non-finite"):
        membership_roc(np.array([1.0, np.nan]), np.zeros(5))


@pytest.mark.parametrize("fpr", [0.01, 0.05, 0.2])
def test_calibrated_threshold_keeps_the_rate(fpr):
    null = np.random.default_rng(2).normal(size=1000)
    thr = calibrated_threshold(null, fpr)
    assert (null >= thr).mean() <= fpr
    assert (null >= np.nextafter(thr, -np.inf) - 1e-9).sum() >= (null >= thr).sum()
    # ties: a null of equal scores passes entirely or not at all
    assert calibrated_threshold(np.zeros(10), 0.05) > 0


def test_candidate_roc_names_a_signal_only_when_its_interval_excludes_one_half():
    rng = np.random.default_rng(3)
    sim = np.r_[np.full(40, 0.6), np.full(160, 0.2)]  # 40 candidates reconstruct
    good = np.r_[rng.normal(2, 1, 40), rng.normal(0, 1, 160)]
    noise = rng.normal(size=200)
    out = candidate_roc(sim, 0.4, {"good": good, "noise": noise})
    assert out["positives"] == 40 and out["negatives"] == 160
    assert out["best"] == "good" and out["signals"]["good"]["auc"] > 0.85
    assert candidate_roc(sim, 0.4, {"noise": noise})["best"] is None
    few = candidate_roc(np.r_[np.full(3, 0.6), np.full(197, 0.2)], 0.4, {"good": np.r_[np.full(3, 9.0), noise[3:]]})
    assert not few["measurable"] and few["best"] is None and "not measurable: 3 candidates" in few["note"]


def test_lines_say_where_an_interval_covers_chance() -> None:
    """An AUC interval over 0.5 and a TPR interval over its FPR are said to be no better than chance."""
    rng = np.random.default_rng(0)
    weak = membership_roc(rng.normal(0.2, 1, 14), rng.normal(0, 1, 500), name="gradient-norm")
    assert weak.chance and "covers 0.5: no better than chance" in weak.line()
    assert "covers 1.0%: not above chance" in weak.line() and "[14 members, 500 non-members]" in weak.line()
    strong = membership_roc(rng.normal(4, 1, 200), rng.normal(0, 1, 2000), name="lira-online")
    assert not strong.chance and "chance" not in strong.line()


def test_the_epsilon_bound_is_the_clopper_pearson_bound_of_the_dp_inequalities() -> None:
    """A perfect test: TPR 1 at every threshold; the bound is log(TPR_lo / FPR_hi) with one-sided Clopper-Pearson
    bounds (scipy's beta quantiles) at 5 % / 6 (three thresholds, two rates each); no leak: no bound above 0."""
    import math

    from scipy.stats import beta

    from datarecon.evaluation.membership import clopper_pearson, epsilon_lower_bound

    pos, neg = np.full(100, 10.0), np.linspace(-1, 0, 2000)
    bound = epsilon_lower_bound(pos, neg)
    alpha = 0.05 / 6
    # at the 0.1 % threshold 100 of 100 members and 2 of 2000 non-members pass (it lets through at most 0.1 %)
    tpr_lo, fpr_hi = beta.ppf(alpha, 100, 1), beta.ppf(1 - alpha, 3, 1998)
    assert bound.fpr == 0.001 and math.isclose(bound.lower, math.log(tpr_lo / fpr_hi), rel_tol=1e-9)
    assert bound.estimate > bound.lower and "empirical epsilon >= " in bound.line()
    assert clopper_pearson(3, 10, alpha=0.05) == pytest.approx((beta.ppf(0.05, 3, 8), beta.ppf(0.95, 4, 7)))
    rng = np.random.default_rng(1)
    none = epsilon_lower_bound(rng.normal(size=100), rng.normal(size=2000))
    assert none.lower == 0.0 and none.fpr is None and "no lower bound above 0" in none.line()
    few = epsilon_lower_bound(pos[:5], neg)
    assert few.fpr is None and "too few" in few.note
    # the note states what the level is: six one-sided bounds, each at 1 - 0.05/6, all holding with 95 %
    assert "6 one-sided Clopper-Pearson bounds" in bound.note and "each at 99.17% confidence" in bound.note
    assert "all hold together with 95% (Bonferroni)" in bound.note


def _power(auc: float, tpr: float | None, members: int, nonmembers: int, measurements: int = 1):
    from datarecon.evaluation.membership import SignalPower

    return SignalPower(auc, tpr, members, nonmembers, measurements)


def test_the_choice_names_the_signals_that_lack_a_tpr_and_their_own_sizes() -> None:
    """Where some signals' non-members are too few for a TPR at 1 % FPR the AUC chooses, and the rule names those
    signals with their sizes, per pseudo-target (not the chosen signal's sizes, summed, as if they had been few)."""
    from datarecon.evaluation.membership import choose_strongest

    power = {"loss": _power(0.90, 0.0, 10, 1490, 4), "subspace": _power(0.99, 0.9, 10, 1490, 4),
             "lira-online": _power(0.95, None, 10, 10, 4), "rmia-online": _power(0.70, None, 10, 10, 4)}
    best, rule = choose_strongest(power, where="4 reference models as pseudo-targets")
    assert best == "subspace"
    assert rule == ("the highest AUC on 4 reference models as pseudo-targets (10 members, 1490 non-members each): "
                    "lira-online, rmia-online were measured on 10 members, 10 non-members each, too few non-members "
                    "for a TPR at 1% FPR (needs 100)")


def test_ties_go_to_the_signal_ranked_first_and_the_fixed_rule_follows_the_declared_ranks() -> None:
    """Equal TPR and AUC: the earlier rank wins, whatever the order of the mapping; nothing measured: the rule fixed
    in advance is the order of the signals' declared ranks (reference attacks first, then subspace, loss, ...)."""
    import math

    from datarecon.attacks.mia import SIGNALS, ranked
    from datarecon.evaluation.membership import choose_strongest, fixed_rule

    tie = {"gradient-norm": _power(0.9, 0.5, 20, 200), "loss": _power(0.9, 0.5, 20, 200),
           "lira-offline": _power(0.9, 0.5, 20, 200)}
    assert choose_strongest(tie)[0] == "lira-offline"
    assert choose_strongest(dict(reversed(list(tie.items()))))[0] == "lira-offline"
    assert ranked(SIGNALS.names()) == ["lira-online", "rmia-online", "rmia", "lira-offline", "subspace", "loss",
                                       "confidence", "gradient-norm"]
    nothing = {k: _power(math.nan, None, 0, 0) for k in ("confidence", "loss", "subspace")}
    assert choose_strongest(nothing) == ("subspace", fixed_rule(list(nothing)))
    assert fixed_rule(["loss", "subspace"], "why").startswith("the rule fixed in advance, the first measured of "
                                                              "subspace, loss (why)")
