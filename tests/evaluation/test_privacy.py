"""ROC / AUC against sklearn and a hand-computed case; the real/fake rule; baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.evaluation import (
    NeighbourSearch,
    best_similarity_to,
    label_candidates,
    noise_images,
    null_baselines,
    privacy_report,
    real_labels,
    roc_auc,
    roc_curve,
    score_privacy,
    tpr_at_fpr,
)

sk_metrics = pytest.importorskip("sklearn.metrics")


def test_auc_hand_computed_with_ties():
    y = [1, 0, 1, 0, 1]
    s = [0.9, 0.9, 0.5, 0.1, 0.05]
    # pairs (pos, neg): (0.9,0.9) tie 0.5; (0.9,0.1) 1; (0.5,0.9) 0; (0.5,0.1) 1; (0.05,0.9) 0; (0.05,0.1) 0
    assert abs(roc_auc(y, s) - 2.5 / 6) < 1e-12
    fpr, tpr, thr = roc_curve(y, s)
    np.testing.assert_allclose(fpr, [0, 0.5, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(tpr, [0, 1 / 3, 2 / 3, 2 / 3, 1.0])
    assert thr[0] == math.inf and thr[1] == 0.9


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [False, True], ids=["continuous", "ties"])
def test_auc_and_roc_match_sklearn(seed, ties):
    g = np.random.default_rng(seed)
    y = g.random(200) < 0.3
    s = g.normal(size=200) + y
    if ties:
        s = np.round(s, 1)
    assert abs(roc_auc(y, s) - sk_metrics.roc_auc_score(y, s)) < 1e-12
    fpr, tpr, _ = roc_curve(torch.from_numpy(y), torch.from_numpy(s))
    f2, t2, _ = sk_metrics.roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, f2)
    np.testing.assert_allclose(tpr, t2)


def test_one_class_and_tpr_at_fpr():
    assert math.isnan(roc_auc([1, 1, 1], [0.1, 0.2, 0.3]))
    r = score_privacy([0, 0], [0.1, 0.2], name="lam")
    assert math.isnan(r.auc) and "one class" in r.note and math.isnan(r.tpr_at[0.01])
    fpr = np.array([0, 0, 0.005, 0.02, 1])
    tpr = np.array([0, 0.3, 0.5, 0.8, 1])
    assert tpr_at_fpr(fpr, tpr, 0.01) == 0.5 and tpr_at_fpr(fpr, tpr, 0.001) == 0.3
    y = np.r_[np.ones(10), np.zeros(10)]
    rep = privacy_report(y, {"perfect": torch.from_numpy(np.r_[np.ones(10), np.zeros(10)]),
                             "nan": torch.full((20,), float("nan"))})
    # 10 negatives: a TPR at 1% or 0.1% FPR is not estimable (one false positive is already 10%)
    assert rep["perfect"].auc == 1.0 and all(math.isnan(v) for v in rep["perfect"].tpr_at.values())
    assert "TPR at FPR 1%, 0.1% not estimable: 10 negatives, 100, 1000 needed" in rep["perfect"].note
    assert rep["nan"].auc == 0.5 and "NaN" in rep["nan"].note
    with pytest.raises(DataReconError, match="3 values for 20"):
        privacy_report(y, {"x": torch.ones(3)})


@pytest.mark.parametrize("n_neg, at_1, at_01", [(99, False, False), (100, True, False), (999, True, False),
                                                (1000, True, True)])
def test_tpr_at_low_fpr_needs_100_or_1000_negatives(n_neg, at_1, at_01):
    """Issue 25: TPR at 1% FPR needs >= 100 negatives, at 0.1% >= 1000; else 'not estimable' (NaN)."""
    from datarecon.evaluation.privacy import negatives_needed

    assert (negatives_needed(0.01), negatives_needed(0.001)) == (100, 1000)
    y = np.r_[np.ones(20), np.zeros(n_neg)]
    s = np.r_[np.ones(20), np.zeros(n_neg)]
    r = score_privacy(y, s)
    assert r.tpr_estimable == {0.01: at_1, 0.001: at_01}
    assert (r.tpr_at[0.01] == 1.0) if at_1 else math.isnan(r.tpr_at[0.01])
    assert (r.tpr_at[0.001] == 1.0) if at_01 else math.isnan(r.tpr_at[0.001])
    assert r.summary()["negatives_needed"] == {"0.01": 100, "0.001": 1000}


def _summary(n_pos, n_neg, scores):
    return {"n_real": n_pos, "n_fake": n_neg, "min_class_size": 10, "scores": scores}


def test_signal_verdict_never_calls_a_signal_best_when_its_ci_covers_half():
    from datarecon.evaluation.privacy import signal_verdict

    v = signal_verdict(_summary(30, 20, {"margin": {"auc": 0.65, "auc_ci_95": [0.46, 0.83]},
                                         "lambda": {"auc": 0.55, "auc_ci_95": [0.40, 0.70]}}))
    assert v.best is None and "best" not in v.lead and "every 95% CI covers 0.5" in v.lead
    assert "30 candidates closer to a training image than to any held-out image" in v.measured
    assert "TPR at 1% FPR and 0.1% FPR not estimable: 100, 1000 negatives needed, 20 found" == v.needs
    v = signal_verdict(_summary(30, 20, {"margin": {"auc": 0.65, "auc_ci_95": [0.46, 0.83]},
                                         "subspace": {"auc": 0.81, "auc_ci_95": [0.70, 0.90]}}))
    assert v.best == "subspace" and "subspace separates them: AUC 0.81 (95% CI 0.70–0.90" in v.lead
    assert v.status == "ok"


def test_signal_verdict_says_what_would_make_it_measurable():
    from datarecon.evaluation.privacy import signal_verdict

    v = signal_verdict(_summary(32, 8, {"margin": {"auc": None, "auc_ci_95": None}}))
    assert v.status == "warn" and v.lead.startswith("not measurable: an AUC needs at least 10 candidates of each class")
    assert "2 more not closer to a training image (more candidates m, or more held-out images" in v.needs
    v = signal_verdict(_summary(3, 40, {}))
    assert "7 more closer to a training image than to any held-out image (a stronger attack" in v.needs
    v = signal_verdict({"note": "no 'heldout' reference set"})
    assert v.status == "warn" and "held-out images" in v.needs


def test_real_rule():
    assert real_labels(torch.tensor([0.9, 0.5, 0.5]), torch.tensor([0.8, 0.5, 0.6])).tolist() == [True, False, False]
    assert real_labels(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]), higher_is_better=False).tolist() == [True, False]
    assert real_labels(torch.tensor([0.9, 0.2]), torch.tensor([0.1, 0.1]), floor=0.3).tolist() == [True, False]
    assert real_labels(torch.tensor([1.0, 3.0]), torch.tensor([9.0, 9.0]), higher_is_better=False,
                       floor=2.0).tolist() == [True, False]


def test_training_copies_are_real_and_noise_is_fake(smooth):
    train = smooth(12, 3, 16, 16, seed=1)
    held = smooth(12, 3, 16, 16, seed=2)
    cands = torch.cat([train[[4, 7, 1]], noise_images(3, (3, 16, 16), generator=torch.Generator().manual_seed(3))])
    noise_floor = float(best_similarity_to(train, search=NeighbourSearch(top_k=12))(
        noise_images(20, (3, 16, 16), generator=torch.Generator().manual_seed(9))).max())
    lab = label_candidates(cands, train, held, search=NeighbourSearch(top_k=12), floor=noise_floor)
    assert lab.real.tolist() == [True, True, True, False, False, False]
    assert lab.floor == noise_floor
    assert lab.train.index[:3].tolist() == [4, 7, 1]
    torch.testing.assert_close(lab.train.score[:3], torch.ones(3), atol=1e-5, rtol=0)


def test_null_baselines(smooth):
    train = smooth(10, 1, 16, 16, seed=4)
    held = smooth(8, 1, 16, 16, seed=5)
    stat = best_similarity_to(train, search=NeighbourSearch(top_k=10))
    b = null_baselines(stat, train[:5], heldout=held, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(b.real, torch.ones(5), atol=1e-5, rtol=0)
    assert b.heldout.shape == (8,) and b.noise.shape == (5,)
    assert float(b.noise.max()) < float(b.heldout.max()) < 0.999
    s = b.summary()
    assert s["real"]["counts"]["0.4"] == 5 and s["noise"]["counts"]["0.9"] == 0
    # seeded: same generator seed, same noise
    b2 = null_baselines(stat, train[:5], generator=torch.Generator().manual_seed(0))
    assert torch.equal(b.noise, b2.noise) and b2.heldout is None


def test_too_few_of_a_class_is_not_measurable():
    """One fake among 80 candidates separates perfectly by luck: reported as not measurable."""
    from datarecon.evaluation.privacy import MIN_CLASS_SIZE, score_privacy

    labels = torch.tensor([True] * 79 + [False])
    scores = torch.arange(80.0, 0.0, -1.0)
    ps = score_privacy(labels, scores, name="lambda")
    assert not ps.measurable and math.isnan(ps.auc) and all(math.isnan(v) for v in ps.tpr_at.values())
    assert ps.note.startswith("not measurable: 79 candidates closer to a training image and 1 not") and ps.summary()["measurable"] is False
    ok = score_privacy(torch.tensor([True] * 70 + [False] * MIN_CLASS_SIZE), torch.arange(80.0, 0.0, -1.0))
    assert ok.measurable and ok.auc == 1.0


def test_bootstrap_auc_ci_matches_a_naive_loop_and_covers_the_auc():
    import numpy as np

    from datarecon.evaluation.privacy import bootstrap_auc_ci, roc_auc

    rng = np.random.default_rng(5)
    labels = np.r_[np.ones(30, bool), np.zeros(12, bool)]
    scores = np.r_[rng.normal(1.0, 1.0, 30), rng.normal(0.0, 1.0, 12)]
    lo, hi = bootstrap_auc_ci(labels, scores, n_boot=400, generator=7)
    # naive reference: the same stratified draws, AUC by counting pairs (ties one half)
    g = np.random.default_rng(7)
    ip, ineg = g.integers(0, 30, size=(400, 30)), g.integers(0, 12, size=(400, 12))
    pos, neg = scores[:30], scores[30:]
    aucs = []
    for a, b in zip(ip, ineg):
        p, n = pos[a], neg[b]
        aucs.append(sum((x > y) + 0.5 * (x == y) for x in p for y in n) / (len(p) * len(n)))
    assert np.allclose((lo, hi), (np.quantile(aucs, 0.025), np.quantile(aucs, 0.975)), rtol=0, atol=1e-12)
    assert lo < roc_auc(labels, scores) < hi
    assert bootstrap_auc_ci(labels, scores, n_boot=400, generator=7) == (lo, hi)  # seeded


def test_bootstrap_auc_ci_is_none_with_one_class():
    from datarecon.evaluation.privacy import bootstrap_auc_ci

    assert bootstrap_auc_ci([True, True, True], [0.1, 0.2, 0.3]) is None
    assert bootstrap_auc_ci([False, False], [0.1, 0.2]) is None
