"""Nearest-neighbour search vs brute force; prefilter + top-k vs exhaustive; ranks."""

from __future__ import annotations

import pytest
import torch

from datarecon.errors import DataReconError
from datarecon.evaluation import (
    METRICS,
    NeighbourSearch,
    match_rank,
    nearest_neighbours,
    reference_rank,
    ssim_pairs,
)


def _brute(cands, refs, metric):
    vals = torch.empty(cands.shape[0], refs.shape[0], dtype=torch.float64)
    for i in range(cands.shape[0]):
        for j in range(refs.shape[0]):
            a, b = cands[i:i + 1], refs[j:j + 1]
            if metric == "ssim":
                vals[i, j] = float(ssim_pairs(a, b))
            elif metric == "l2":
                vals[i, j] = float((a.double() - b.double()).norm())
            else:
                za = (a - a.mean((2, 3), keepdim=True)) / a.std((2, 3), unbiased=False, keepdim=True)
                zb = (b - b.mean((2, 3), keepdim=True)) / b.std((2, 3), unbiased=False, keepdim=True)
                vals[i, j] = float((za.double() * zb.double()).mean())
    return vals


@pytest.mark.parametrize("metric", ["ssim", "l2", "ncc"])
def test_exhaustive_matches_brute_force(smooth, metric):
    c = smooth(9, seed=1)
    r = smooth(11, seed=2)
    nb = nearest_neighbours(c, r, metric=metric, search=NeighbourSearch(exhaustive=True), return_topk=3)
    vals = _brute(c, r, metric)
    higher = METRICS.get(metric).higher_is_better
    best = vals.argmax(1) if higher else vals.argmin(1)
    assert torch.equal(nb.index, best)
    torch.testing.assert_close(nb.score.double(), vals.gather(1, best[:, None]).squeeze(1), atol=1e-5, rtol=0)
    assert nb.topk_index.shape == (9, 3) and torch.equal(nb.topk_index[:, 0], nb.index)
    assert nb.higher_is_better == higher


@pytest.mark.parametrize("prefilter", ["lncc", "l2", "ncc"])
def test_prefilter_topk_equals_exhaustive(smooth, prefilter):
    c = smooth(30, seed=3)
    r = smooth(40, seed=4)
    ex = nearest_neighbours(c, r, metric="ssim", search=NeighbourSearch(exhaustive=True))
    pf = nearest_neighbours(c, r, metric="ssim", search=NeighbourSearch(prefilter=prefilter, top_k=40, exact_up_to=0))
    assert torch.equal(ex.index, pf.index)
    torch.testing.assert_close(ex.score, pf.score)
    assert pf.prefilter == prefilter and pf.top_k == 40 and pf.exact
    small = nearest_neighbours(c, r, metric="ssim", search=NeighbourSearch(prefilter=prefilter, top_k=5, exact_up_to=0),
                               return_topk=5)
    assert not small.exact
    assert small.topk_index.shape == (30, 5)
    assert bool((small.topk_score[:, :-1] >= small.topk_score[:, 1:]).all())


def test_identical_references_found_and_inputs_untouched(smooth):
    r = smooth(20, seed=5)
    perm = torch.tensor([3, 17, 0, 8])
    c = r[perm].clone()
    r0, c0 = r.clone(), c.clone()
    for metric in ("ssim", "l2", "ncc"):
        nb = nearest_neighbours(c, r, metric=metric, search=NeighbourSearch(top_k=4))
        assert torch.equal(nb.index, perm)
    assert torch.equal(r, r0) and torch.equal(c, c0)
    ranks = reference_rank(c, r, perm)
    assert torch.equal(ranks, torch.ones(4, dtype=torch.int64))


def test_reference_rank_counts_better_references(smooth):
    vals_c = smooth(3, seed=6)
    r = smooth(10, seed=7)
    target = torch.tensor([0, 5, 9])
    ranks = reference_rank(vals_c, r, target, metric="l2")
    d = torch.cdist(vals_c.flatten(1).double(), r.flatten(1).double())
    expect = torch.tensor([int((d[i] < d[i, target[i]]).sum()) + 1 for i in range(3)])
    assert torch.equal(ranks, expect)


def test_match_rank():
    vals = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.95, 0.3]])
    idx = torch.tensor([0, 1, 0])
    # cand0 at ref0: cand2 better -> rank 2; cand1 at ref1: cand2 (0.3) better -> 2; cand2 best -> 1
    assert match_rank(vals, idx).tolist() == [2, 2, 1]
    assert match_rank(vals, idx, higher_is_better=False).tolist() == [2, 2, 3]


def test_errors(smooth):
    c = smooth(2, seed=1)
    with pytest.raises(DataReconError, match="valid names: l2, lncc, ncc, ssim"):
        nearest_neighbours(c, c, metric="cosine")
    with pytest.raises(DataReconError, match="not a cheap metric"):
        nearest_neighbours(c, c, search=NeighbourSearch(prefilter="ssim"))
    with pytest.raises(DataReconError, match="empty"):
        nearest_neighbours(c, c[:0])


def test_exact_by_default_when_cheap_and_labelled_when_approximate(smooth):
    """A shortlist of top_k < R misses true best matches; up to EXACT_UP_TO pairs the default search is exact."""
    from datarecon.evaluation.neighbours import EXACT_UP_TO

    c, r = smooth(40, seed=11), smooth(60, seed=12)
    ex = nearest_neighbours(c, r, metric="ssim", search=NeighbourSearch(exhaustive=True))
    short = nearest_neighbours(c, r, metric="ssim", search=NeighbourSearch(top_k=1, exact_up_to=0))
    assert not short.exact and not torch.equal(short.index, ex.index)  # the case this test is about
    assert 40 * 60 <= EXACT_UP_TO
    default = nearest_neighbours(c, r, metric="ssim", search=NeighbourSearch(top_k=1))
    assert default.exact and torch.equal(default.index, ex.index) and torch.equal(default.score, ex.score)
    with pytest.raises(DataReconError, match="exact_up_to must be >= 0"):
        nearest_neighbours(c, r, search=NeighbourSearch(exact_up_to=-1))
