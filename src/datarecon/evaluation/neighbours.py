"""Nearest neighbours of candidates (reconstructions) in a reference set.

Exact all-pairs SSIM is expensive (``M * R`` filtered images). Up to
:data:`EXACT_UP_TO` pairs (cheap: seconds on one CPU core) the search is exhaustive,
hence exact; beyond that it shortlists ``top_k`` references per candidate with a
cheap matrix product metric (local NCC by default, or L2 via ``torch.cdist``, or
global NCC) and computes the exact metric on the shortlist only, so a best match
outside the shortlist is missed: such results carry ``exact=False`` and are
labelled approximate in ``metrics.json``. ``NeighbourSearch(exhaustive=True)``
computes all pairs at any size. With ``top_k`` large enough the two agree (tested);
``benchmarks/bench_evaluation.py`` measures the agreement and the speed-up on
structured images.

Metrics live in :data:`METRICS`; each knows whether higher is better.

References:
    Runkel et al. (2024), section 5: nearest neighbours of each
    reconstruction in the training, partition and noise sets by SSIM and by
    L2, and the rank of a reconstruction's best match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from datarecon.errors import DataReconError
from datarecon.evaluation.similarity import (
    DEFAULT_CHUNK,
    Window,
    check_image_pair,
    l2_matrix,
    local_ncc_matrix,
    ncc_matrix,
    ssim_index_pairs,
    ssim_matrix,
)
from datarecon.registry import Registry

__all__ = [
    "EXACT_UP_TO",
    "METRICS",
    "Metric",
    "NeighbourSearch",
    "Neighbours",
    "is_exact",
    "nearest_neighbours",
    "similarity_matrix",
    "reference_rank",
    "match_rank",
]


@dataclass(frozen=True)
class Metric:
    """A similarity/distance between images.

    Attributes:
        name: Registry name.
        matrix: ``(cands, refs, **kw) -> (M, R)`` all-pairs values.
        higher_is_better: True for similarities (SSIM, NCC), False for distances (L2).
        cheap: True if ``matrix`` is a matrix product (usable as a prefilter).
    """

    name: str
    matrix: Callable[..., Tensor]
    higher_is_better: bool
    cheap: bool


METRICS: Registry[Metric] = Registry("similarity metric")
METRICS.register("ssim", Metric("ssim", ssim_matrix, True, False))
METRICS.register("l2", Metric("l2", l2_matrix, False, True))
METRICS.register("ncc", Metric("ncc", ncc_matrix, True, True))
METRICS.register("lncc", Metric("lncc", local_ncc_matrix, True, True))


#: exhaustive (exact) searches up to this many candidate-reference pairs: about 6 s for 32x32x3
#: images at the 8 800 SSIM pairs/s of ``benchmarks/bench_evaluation.py`` (2 CPU threads,
#: benchmarks/results/evaluation.json), where the top-32 shortlist got 8 % of the top-1 matches wrong
EXACT_UP_TO = 50_000


@dataclass(frozen=True)
class NeighbourSearch:
    """How :func:`nearest_neighbours` searches: exhaustively up to ``exact_up_to`` candidate-reference
    pairs, else the best of a ``top_k`` shortlist per candidate by a cheap ``prefilter`` metric.

    Attributes:
        prefilter: cheap metric of the shortlist (``"lncc"``, ``"l2"``, ``"ncc"``; see :data:`METRICS`)
            or None for an exhaustive search.
        top_k: shortlist length per candidate (>= 1; clipped to the reference count ``R``).
        exhaustive: compute the exact metric on all pairs, whatever their number.
        exact_up_to: compute all pairs when ``M * R`` is at most this (>= 0; 0: prefilter whenever
            ``top_k < R``).
    """

    prefilter: str | None = "lncc"
    top_k: int = 32
    exhaustive: bool = False
    exact_up_to: int = EXACT_UP_TO


def is_exact(n_cands: int, n_refs: int, *, metric: str = "ssim", search: NeighbourSearch = NeighbourSearch()) -> bool:
    """Whether :func:`nearest_neighbours` with these settings computes every pair (an exact result)."""
    return (METRICS.get(metric).cheap or search.exhaustive or search.prefilter is None or search.top_k >= n_refs
            or n_cands * n_refs <= search.exact_up_to)


@dataclass(frozen=True)
class Neighbours:
    """Result of a nearest-neighbour search.

    Attributes:
        index: ``(M,)`` int64, the best reference for each candidate.
        score: ``(M,)`` the metric value of that match (SSIM/NCC: higher is
            better; L2: a distance, lower is better).
        metric: Metric name.
        higher_is_better: Direction of ``score``.
        topk_index: ``(M, k)`` references ordered best first by the exact
            metric (the shortlist when a prefilter was used), or None.
        topk_score: ``(M, k)`` their metric values, or None.
        prefilter: Prefilter metric name, or None when exhaustive.
        top_k: Shortlist length used by the prefilter (0 when exhaustive).
        exact: every pair was compared, so ``index`` and ``score`` are the true best match
            (False: best of the prefilter's shortlist, an approximation).
    """

    index: Tensor
    score: Tensor
    metric: str
    higher_is_better: bool
    topk_index: Tensor | None = None
    topk_score: Tensor | None = None
    prefilter: str | None = None
    top_k: int = 0
    exact: bool = True


def similarity_matrix(cands: Tensor, refs: Tensor, *, metric: str = "ssim",
                      window: str | Window = "gaussian", chunk: int = DEFAULT_CHUNK,
                      progress: bool = False) -> Tensor:
    """All-pairs metric values ``(M, R)`` for any metric in :data:`METRICS`."""
    m = METRICS.get(metric)
    if m.name == "ssim":
        return ssim_matrix(cands, refs, window=window, chunk=chunk, progress=progress)
    return m.matrix(cands, refs)


def _best_first(values: Tensor, k: int, higher: bool) -> tuple[Tensor, Tensor]:
    """Top-k along dim 1, best first; ties broken by the lower reference index."""
    # stable sort keeps the lower index first among equal values
    order = torch.sort(values, dim=1, descending=higher, stable=True).indices[:, :k]
    return values.gather(1, order), order


def nearest_neighbours(cands: Tensor, refs: Tensor, *, metric: str = "ssim",
                       search: NeighbourSearch = NeighbourSearch(), return_topk: int | None = None,
                       window: str | Window = "gaussian", chunk: int = DEFAULT_CHUNK,
                       progress: bool = False) -> Neighbours:
    """Best reference for each candidate under ``metric``.

    For an expensive metric (SSIM) with more than ``search.exact_up_to`` pairs and not
    ``search.exhaustive``, references are shortlisted by ``search.prefilter`` (top ``search.top_k``
    per candidate from a matrix product), then ranked by the exact metric; the result is exact
    whenever the true best match is in the shortlist and is marked ``exact=False``. Cheap metrics
    (L2, NCC) and searches of at most ``search.exact_up_to`` pairs are always exhaustive.

    Args:
        cands: ``(M, C, H, W)`` display-space candidates in ``[0, 1]``.
        refs: ``(R, C, H, W)`` display-space references in ``[0, 1]``.
        metric: ``"ssim"``, ``"l2"``, ``"ncc"`` or ``"lncc"`` (see :data:`METRICS`).
        search: :class:`NeighbourSearch` (prefilter, shortlist length, when to compute all pairs;
            default: exhaustive up to :data:`EXACT_UP_TO` pairs, else a top-32 local-NCC shortlist).
        return_topk: Also return this many best references per candidate
            (clipped to the shortlist length when prefiltering).
        window: SSIM window (see :data:`~datarecon.evaluation.similarity.WINDOWS`).
        chunk: Pairs per SSIM chunk (memory bound).
        progress: Show a progress bar over SSIM chunks.

    Returns:
        :class:`Neighbours`; ties go to the lower reference index.

    Raises:
        DataReconError: empty reference set, unknown metric, a prefilter that
            is not cheap, or mismatched image shapes.
    """
    m = METRICS.get(metric)
    cands, refs = check_image_pair(cands, refs, ("candidates", "references"))
    n_c, n_r = cands.shape[0], refs.shape[0]
    _check_search(search, n_r)
    use_prefilter = ((not m.cheap) and (not search.exhaustive) and search.prefilter is not None
                     and n_c * n_r > search.exact_up_to)
    if use_prefilter:
        pf = METRICS.get(search.prefilter)
        k = min(search.top_k, n_r)
        vals, order = _shortlist_ranked(cands, refs, pf, k, window=window, chunk=chunk, progress=progress)
        kk = k if return_topk is None else min(return_topk, k)
        return Neighbours(
            index=order[:, 0].clone(), score=vals[:, 0].clone(), metric=m.name,
            higher_is_better=True,
            topk_index=order[:, :kk].clone() if return_topk else None,
            topk_score=vals[:, :kk].clone() if return_topk else None,
            prefilter=pf.name, top_k=k, exact=k >= n_r,
        )
    full = similarity_matrix(cands, refs, metric=m.name, window=window, chunk=chunk, progress=progress)
    kk = 1 if not return_topk else min(return_topk, n_r)
    vals, order = _best_first(full, kk, m.higher_is_better)
    return Neighbours(
        index=order[:, 0].clone(), score=vals[:, 0].clone(), metric=m.name,
        higher_is_better=m.higher_is_better,
        topk_index=order if return_topk else None,
        topk_score=vals if return_topk else None,
        prefilter=None, top_k=0,
    )


def _check_search(search: NeighbourSearch, n_refs: int) -> None:
    """Refuse an empty reference set and bad search settings (a prefilter is checked whether or not it is used)."""
    if n_refs == 0:
        raise DataReconError("the reference set is empty; pass at least one reference image")
    if search.top_k < 1:
        raise DataReconError(f"top_k must be >= 1, got {search.top_k}")
    if search.exact_up_to < 0:
        raise DataReconError(f"exact_up_to must be >= 0, got {search.exact_up_to}")
    if search.prefilter is not None and not METRICS.get(search.prefilter).cheap:
        cheap = [n for n in METRICS.names() if METRICS.get(n).cheap]
        raise DataReconError(f"prefilter {search.prefilter!r} is not a cheap metric; use one of: {', '.join(cheap)}")


def _shortlist_ranked(cands: Tensor, refs: Tensor, pf: Metric, k: int, *, window: str | Window, chunk: int,
                      progress: bool) -> tuple[Tensor, Tensor]:
    """The ``k`` references of each candidate's ``pf`` shortlist ranked by exact SSIM, best first.

    Returns:
        ``(values, indices)``, each ``(M, k)``; ties go to the lower reference index.
    """
    n_c = cands.shape[0]
    pre = pf.matrix(cands, refs)
    _, shortlist = _best_first(pre, k, pf.higher_is_better)  # (M, k)
    ia = torch.arange(n_c, device=cands.device).repeat_interleave(k)
    ib = shortlist.reshape(-1)
    exact = ssim_index_pairs(cands, refs, (ia, ib), window=window, data_range=1.0, chunk=chunk,
                             progress=progress, desc="top-k SSIM").view(n_c, k)
    # order the shortlist by the exact metric; ties -> lower reference index
    key_idx = torch.sort(shortlist, dim=1, stable=True)
    exact_sorted_by_idx = exact.gather(1, key_idx.indices)
    vals, pos = _best_first(exact_sorted_by_idx, k, True)
    return vals, key_idx.values.gather(1, pos)


def _rank_in_rows(values: Tensor, target: Tensor, higher: bool) -> Tensor:
    """1-based rank of ``values[i, target[i]]`` within row i (ties share the best rank)."""
    t = values.gather(1, target.view(-1, 1))
    better = values > t if higher else values < t
    return better.sum(dim=1) + 1


def reference_rank(cands: Tensor, refs: Tensor, target: Tensor, *, metric: str = "ssim",
                   window: str | Window = "gaussian", chunk: int = DEFAULT_CHUNK,
                   progress: bool = False) -> Tensor:
    """Rank of a given reference among each candidate's neighbours.

    E.g. for a reconstruction initialised from training image ``j``: where
    does ``j`` rank among all training images sorted by similarity to the
    reconstruction? (Runkel et al.: four of five in the top 10, one 51st.)
    Exact: computes all ``M * R`` values of the metric.

    Args:
        cands: ``(M, C, H, W)``; refs: ``(R, C, H, W)`` (display space).
        target: ``(M,)`` int64 reference index per candidate.
        metric: Name in :data:`METRICS`.

    Returns:
        ``(M,)`` int64 ranks in ``[1, R]``: 1 + number of references strictly
        more similar than the target (ties share the better rank).
    """
    target = torch.as_tensor(target, dtype=torch.int64)
    if target.ndim != 1 or target.shape[0] != cands.shape[0]:
        raise DataReconError(f"target must have shape ({cands.shape[0]},), got {tuple(target.shape)}")
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= refs.shape[0]):
        raise DataReconError(f"target indices must lie in [0, {refs.shape[0]}); got out-of-range values")
    m = METRICS.get(metric)
    full = similarity_matrix(cands, refs, metric=metric, window=window, chunk=chunk, progress=progress)
    return _rank_in_rows(full, target, m.higher_is_better)


def match_rank(values: Tensor, index: Tensor, *, higher_is_better: bool = True) -> Tensor:
    """Rank of each candidate among all candidates for its own best match.

    Given an all-pairs matrix ``values`` ``(M, R)`` and each candidate's
    matched reference ``index`` ``(M,)``, returns 1 + the number of other
    candidates strictly closer to that same reference: rank 1 means the
    candidate is the best reconstruction of the reference it matches.

    Returns:
        ``(M,)`` int64 ranks in ``[1, M]``.
    """
    index = torch.as_tensor(index, dtype=torch.int64)
    cols = values[:, index].t()  # (M, M): row i = all candidates' values at ref index[i]
    return _rank_in_rows(cols, torch.arange(values.shape[0]), higher_is_better)
