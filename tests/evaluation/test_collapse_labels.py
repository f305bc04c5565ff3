"""Collapsed candidates are labelled by what was measured (issue 25, item 2): the distance of each
candidate to its nearest other candidate, its collapse cluster, and how many distinct training
images the candidates "closer to a training image" match — never "real"."""

from __future__ import annotations

import torch

from datarecon.evaluation import evaluation_of
from datarecon.evaluation.protocol import collapse, collapse_clusters


def test_clusters_are_connected_components_largest_first():
    close = torch.zeros(6, 6, dtype=torch.bool)
    for a, b in ((4, 5), (0, 2), (2, 3)):  # chain 0-2-3, pair 4-5, candidate 1 alone
        close[a, b] = close[b, a] = True
    assert collapse_clusters(close).tolist() == [0, -1, 0, 0, 1, 1]


def test_collapse_reports_nearest_other_and_clusters(smooth):
    x = smooth(4, 1, 8, 8, seed=1)
    cands = torch.cat([x, x[:1].repeat(3, 1, 1, 1)])  # candidate 0 and three copies: one cluster of four
    c = collapse(cands, metric="l2")
    assert c.cluster.tolist() == [0, -1, -1, -1, 0, 0, 0] and c.cluster_sizes() == [4]
    assert c.nearest_other[0] == 0.0 and c.nearest_other[1] > 0
    naive = [min(float((cands[i] - cands[j]).norm()) for j in range(7) if j != i) for i in range(7)]
    assert torch.allclose(c.nearest_other, torch.tensor(naive, dtype=torch.float64), atol=1e-5)


def test_a_shared_blob_is_one_training_match_not_many(smooth):
    """Seventeen copies of one blob near training image 0 are seventeen candidates closer to a training
    image, but they match one training image; the summary and rows say so."""
    train, held = smooth(20, 1, 8, 8, seed=2), smooth(40, 1, 8, 8, seed=3)
    blob = 0.9 * train[:1] + 0.1 * held[:1]
    cands = torch.cat([blob.repeat(17, 1, 1, 1), smooth(3, 1, 8, 8, seed=4)])
    ev = evaluation_of(cands, train=train, heldout=held, config={"n_floor_noise": 20})
    priv = ev.summary["privacy"]
    assert priv["n_real"] >= 17 and priv["n_real_distinct_train"] <= priv["n_real"] - 16
    assert priv["largest_shared"] == {"train_index": 0, "count": 17}
    assert priv["positive"] == "closer to a training image than to any held-out image"
    col = ev.summary["collapse"]
    assert col["clusters"][0] == 17 and col["n_with_duplicate"] >= 17
    assert [r["collapse_cluster"] for r in ev.rows[:17]] == [0] * 17
    assert ev.rows[0]["nearest_other_l2"] == 0.0
