"""Haim protocol, assignments (greedy / Hungarian vs brute force), collapse, parameter distance."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.evaluation import (
    HaimSettings,
    assign,
    collapse,
    counts_at,
    haim_protocol,
    param_distance,
)


def test_hungarian_matches_brute_force():
    g = np.random.default_rng(0)
    for m, n in [(4, 4), (5, 3), (3, 5)]:
        sim = g.random((m, n))
        idx = assign(torch.from_numpy(sim), assignment="hungarian").numpy()
        best = -math.inf
        k = min(m, n)
        for rows in itertools.permutations(range(m), k):
            for cols in itertools.combinations(range(n), k):
                best = max(best, sum(sim[r, c] for r, c in zip(rows, cols)))
        got = sum(sim[i, j] for j, i in enumerate(idx) if i >= 0)
        assert abs(got - best) < 1e-12
        assert (idx >= 0).sum() == k and len(set(idx[idx >= 0])) == k


def test_greedy_and_independent():
    sim = torch.tensor([[0.9, 0.8], [0.1, 0.7]])  # cand0 best for both training images
    assert assign(sim, assignment="independent").tolist() == [0, 0]
    assert assign(sim, assignment="greedy").tolist() == [0, 1]
    # greedy takes (0,0)=0.9 first; hungarian maximises the sum: 0.9 + 0.7 = 1.6 also here
    sim2 = torch.tensor([[0.9, 0.85], [0.8, 0.1]])
    assert assign(sim2, assignment="greedy").tolist() == [0, -1] or assign(sim2, assignment="greedy").tolist() == [0, 1]
    assert assign(sim2, assignment="greedy").tolist() == [0, 1]  # cand1 left for train1
    assert assign(sim2, assignment="hungarian").tolist() == [1, 0]  # 0.8 + 0.85 > 0.9 + 0.1
    assert assign(torch.zeros(1, 3), assignment="greedy").tolist() == [0, -1, -1]
    with pytest.raises(DataReconError, match="valid names: greedy, hungarian, independent"):
        assign(sim, assignment="best")


def test_haim_protocol_identical_candidates(smooth):
    train = smooth(6, 3, 16, 16, seed=1)
    perm = torch.tensor([2, 0, 5, 1, 4, 3])
    cands = train[perm] * 0.5 + 0.2  # affine change: NCC and min-max rescale undo it
    cands0 = cands.clone()
    res = haim_protocol(cands, train)
    assert torch.equal(cands, cands0)
    inv = torch.argsort(perm)
    assert torch.equal(res.candidate_index, inv)
    torch.testing.assert_close(res.ssim, torch.ones(6, dtype=torch.float64), atol=1e-4, rtol=0)
    assert res.counts[0.4] == 6 and res.window_size == 11
    assert bool((res.sorted_ssim[:-1] >= res.sorted_ssim[1:]).all())


def test_haim_duplicates_policy(smooth):
    train = smooth(4, 1, 16, 16, seed=2)
    cands = train[:1].repeat(3, 1, 1, 1)  # a collapsed attack: the same image three times
    cands = torch.cat([cands, smooth(1, 1, 16, 16, seed=9)])
    dup = haim_protocol(cands, train, HaimSettings(allow_duplicates=True))
    one = haim_protocol(cands, train)  # greedy: each candidate counts once
    assert dup.assignment == "independent" and one.assignment == "greedy"
    assert one.counts[0.9] <= 1 + 0  # only train[0] is matched exactly once
    assert dup.counts[0.9] >= one.counts[0.9]
    assert len(set(one.candidate_index[one.candidate_index >= 0].tolist())) == int((one.candidate_index >= 0).sum())
    few = haim_protocol(cands[:2], train, HaimSettings(assignment="hungarian"))
    assert int((few.candidate_index >= 0).sum()) == 2 and int(torch.isnan(few.ssim).sum()) == 2
    assert math.isnan(float(few.sorted_ssim[-1]))


def test_counts_at():
    c = counts_at(torch.tensor([0.35, 0.45, float("nan"), 0.95]), (0.3, 0.4, 0.9))
    assert c == {0.3: 3, 0.4: 2, 0.9: 1}


def test_collapse(smooth):
    x = smooth(5, 1, 16, 16, seed=3)
    x_col = torch.cat([x[:1].repeat(3, 1, 1, 1), x[1:3]])
    c = collapse(x_col, metric="ssim")
    assert c.n_pairs == 10 and c.n_close == 3 and abs(c.fraction_pairs - 0.3) < 1e-12
    assert abs(c.fraction_candidates - 0.6) < 1e-12
    c2 = collapse(x_col, metric="l2")
    assert c2.n_close == 3
    assert collapse(x, metric="l2").n_close == 0
    assert math.isnan(collapse(x[:1]).fraction_pairs)
    with pytest.raises(DataReconError, match="valid names"):
        collapse(x, metric="cos")


def test_param_distance():
    a = {"w": torch.ones(2, 3), "b": torch.zeros(2)}
    b = {"w": torch.zeros(2, 3), "b": torch.full((2,), 2.0)}
    assert param_distance(a, b) == 6.0 + 8.0
    assert param_distance(a, a) == 0.0
    with pytest.raises(DataReconError, match="names differ"):
        param_distance(a, {"w": a["w"]})
    with pytest.raises(DataReconError, match="shapes"):
        param_distance(a, {"w": torch.ones(3, 2), "b": a["b"]})
