"""Haim et al. (2022) evaluation protocol, collapse detection, parameter distance.

The protocol, per training image (not per candidate):

1. match: the candidate with the highest normalised cross-correlation (NCC)
   to the training image, both 2x-downsampled (average pooling);
2. score: SSIM between the min-max rescaled candidate (display space: the
   caller adds the training mean back) and the training image;
3. report the per-training-image SSIMs sorted in decreasing order and the
   number of training images whose SSIM exceeds thresholds (0.4 = "good",
   the follow-up papers' convention; values depend on the SSIM window).

Duplicates: the reference lets one candidate be the best match of several
training images, inflating counts when attacks collapse. Here the default is
``assignment="greedy"``: pairs are taken in decreasing NCC and a candidate is
used at most once; ``assignment="hungarian"`` maximises the total NCC of a
one-to-one matching (``scipy.optimize.linear_sum_assignment``);
``HaimSettings(allow_duplicates=True)`` (or ``assignment="independent"``)
reproduces the reference. Training images left without a candidate (fewer candidates than
training images) get index -1 and SSIM NaN, which counts as not good.

References:
    Haim, Vardi, Yehudai, Shamir, Irani (2022), "Reconstructing Training Data
    from Trained Neural Networks", section 5 (evaluation); Buzaglo et al.
    (2023); Runkel et al. (2024), eq. 2 (parameter distance l(θ*, θ)).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from datarecon.errors import DataReconError
from datarecon.evaluation.similarity import (
    DEFAULT_CHUNK,
    check_image_pair,
    check_images,
    downsample2x,
    effective_window_size,
    l2_matrix,
    minmax_rescale,
    ncc_matrix,
    ssim_index_pairs,
    ssim_matrix,
)
from datarecon.registry import Registry

__all__ = [
    "DEFAULT_THRESHOLDS",
    "ASSIGNMENTS",
    "HaimResult",
    "HaimSettings",
    "haim_protocol",
    "init_similarity",
    "assign",
    "counts_at",
    "Collapse",
    "collapse",
    "collapse_clusters",
    "param_distance",
]

#: SSIM thresholds at which "good reconstruction" counts are reported.
DEFAULT_THRESHOLDS: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

ASSIGNMENTS: Registry = Registry("assignment")


@ASSIGNMENTS.register("independent")
def _assign_independent(sim: np.ndarray) -> np.ndarray:
    """Each training image takes its best candidate; candidates may repeat (reference)."""
    if sim.shape[0] == 0:
        return np.full(sim.shape[1], -1, dtype=np.int64)
    return sim.argmax(axis=0).astype(np.int64)


@ASSIGNMENTS.register("greedy")
def _assign_greedy(sim: np.ndarray) -> np.ndarray:
    """Pairs in decreasing similarity; each candidate and training image used at most once."""
    m, n = sim.shape
    out = np.full(n, -1, dtype=np.int64)
    if m == 0 or n == 0:
        return out
    # stable order: by decreasing similarity, then training index, then candidate index
    flat = -sim.T.reshape(-1)  # index t = j * m + i
    order = np.argsort(flat, kind="stable")
    used = np.zeros(m, dtype=bool)
    left = min(m, n)
    for t in order:
        j, i = divmod(int(t), m)
        if out[j] >= 0 or used[i]:
            continue
        out[j] = i
        used[i] = True
        left -= 1
        if left == 0:
            break
    return out


@ASSIGNMENTS.register("hungarian")
def _assign_hungarian(sim: np.ndarray) -> np.ndarray:
    """One-to-one matching maximising the total similarity."""
    from scipy.optimize import linear_sum_assignment  # lazy: slow to import, and only this strategy uses it

    m, n = sim.shape
    out = np.full(n, -1, dtype=np.int64)
    if m == 0 or n == 0:
        return out
    rows, cols = linear_sum_assignment(sim, maximize=True)
    out[cols] = rows
    return out


def assign(sim: Tensor | np.ndarray, *, assignment: str = "greedy") -> Tensor:
    """Match training images (columns) to candidates (rows) of a similarity matrix.

    Args:
        sim: ``(M, N)`` similarity, higher is better (candidates x training).
        assignment: ``"greedy"``, ``"hungarian"`` or ``"independent"``
            (see :data:`ASSIGNMENTS`).

    Returns:
        ``(N,)`` int64 candidate index per training image, -1 if unmatched.
    """
    fn = ASSIGNMENTS.get(assignment)
    arr = sim.detach().cpu().double().numpy() if isinstance(sim, Tensor) else np.asarray(sim, dtype=float)
    if arr.ndim != 2:
        raise DataReconError(f"similarity matrix must be 2-D (candidates, training), got shape {arr.shape}")
    return torch.from_numpy(fn(arr))


def counts_at(ssim: Tensor, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> dict[float, int]:
    """Number of entries strictly above each threshold (NaN counts as below).

    Returns:
        ``{threshold: count}`` in the order given.
    """
    s = torch.nan_to_num(torch.as_tensor(ssim, dtype=torch.float64), nan=-np.inf)
    return {float(t): int((s > t).sum()) for t in thresholds}


@dataclass(frozen=True)
class HaimResult:
    """Per-training-image result of the Haim protocol.

    Attributes:
        candidate_index: ``(N,)`` int64 matched candidate per training image (-1: none).
        ncc: ``(N,)`` NCC of the match on downsampled images (NaN if none).
        ssim: ``(N,)`` SSIM of the min-max rescaled candidate vs the training image (NaN if none).
        sorted_ssim: ``(N,)`` ``ssim`` in decreasing order (NaN last).
        counts: ``{threshold: number of training images with SSIM > threshold}``.
        assignment: Duplicate handling used.
        window: SSIM window name.
        window_size: Effective window side for these images.
    """

    candidate_index: Tensor
    ncc: Tensor
    ssim: Tensor
    sorted_ssim: Tensor
    counts: dict[float, int]
    assignment: str
    window: str
    window_size: int
    thresholds: tuple[float, ...] = field(default=DEFAULT_THRESHOLDS)


@dataclass(frozen=True)
class HaimSettings:
    """Settings of :func:`haim_protocol` (Haim et al. 2022, section 5); the data arrive at call time.

    Attributes:
        assignment: ``"greedy"`` (default; a candidate counts once), ``"hungarian"`` (one-to-one,
            max total NCC) or ``"independent"`` (see :data:`ASSIGNMENTS`).
        allow_duplicates: Shortcut for ``assignment="independent"`` (the reference behaviour).
        downsample: Match on 2x-downsampled images (the protocol); False matches at full resolution.
        rescale: Min-max rescale candidates per image before SSIM.
        window: SSIM window name (state it when reporting).
        thresholds: SSIM thresholds for the counts.
        chunk: Pairs per SSIM chunk.
    """

    assignment: str = "greedy"
    allow_duplicates: bool = False
    downsample: bool = True
    rescale: bool = True
    window: str = "gaussian"
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS
    chunk: int = DEFAULT_CHUNK


def haim_protocol(candidates: Tensor, train: Tensor, settings: HaimSettings = HaimSettings()) -> HaimResult:
    """Best candidate per training image (NCC), then SSIM after min-max rescale.

    Args:
        candidates: ``(M, C, H, W)`` reconstructions in display space (the
            caller adds the training mean back); any range, they are
            min-max rescaled per image when ``settings.rescale``.
        train: ``(N, C, H, W)`` training images in display space ``[0, 1]``.
        settings: :class:`HaimSettings` (duplicate policy, downsampling, rescaling, SSIM window,
            thresholds, chunk size; default: the protocol with greedy matching and a Gaussian window).

    Returns:
        :class:`HaimResult`.

    References:
        Haim et al. (2022), section 5; follow-ups count SSIM > 0.4 as good.
    """
    candidates, train = check_image_pair(candidates, train, ("candidates", "training images"))
    assignment = "independent" if settings.allow_duplicates else settings.assignment
    ASSIGNMENTS.get(assignment)
    if settings.downsample:
        sim = ncc_matrix(downsample2x(candidates), downsample2x(train))
    else:
        sim = ncc_matrix(candidates, train)
    idx = assign(sim, assignment=assignment)
    n = train.shape[0]
    ncc = torch.full((n,), float("nan"), dtype=torch.float64)
    ssim = torch.full((n,), float("nan"), dtype=torch.float64)
    ok = idx >= 0
    if bool(ok.any()):
        cand = minmax_rescale(candidates) if settings.rescale else candidates
        jj = torch.nonzero(ok).view(-1)
        ii = idx[ok]
        ncc[jj] = sim[ii, jj].double()
        ssim[jj] = ssim_index_pairs(cand, train, (ii, jj), window=settings.window, data_range=1.0,
                                    chunk=settings.chunk).double()
    sorted_ssim = torch.sort(torch.nan_to_num(ssim, nan=-np.inf), descending=True).values
    sorted_ssim = torch.where(torch.isinf(sorted_ssim), torch.nan, sorted_ssim)
    h, w = train.shape[-2:]
    window, thresholds = settings.window, settings.thresholds
    return HaimResult(
        candidate_index=idx, ncc=ncc, ssim=ssim, sorted_ssim=sorted_ssim,
        counts=counts_at(ssim, thresholds), assignment=assignment,
        window=window if isinstance(window, str) else repr(window),
        window_size=effective_window_size(window, h, w), thresholds=tuple(float(t) for t in thresholds),
    )


def init_similarity(candidates: Tensor, init: Tensor, *, rescale: bool = True, window: str = "gaussian",
                    chunk: int = DEFAULT_CHUNK) -> Tensor:
    """SSIM of each candidate to its own initial image, measured as :func:`haim_protocol` measures it.

    Args:
        candidates: ``(M, C, H, W)`` reconstructions in display space (any range; min-max rescaled
            per image when ``rescale``, as in the protocol).
        init: ``(M, C, H, W)`` the initial image x₀ of each candidate in display space (clamped to
            ``[0, 1]``).
        rescale: Min-max rescale the candidates first (the protocol's choice).
        window: SSIM window name.
        chunk: Pairs per SSIM chunk.

    Returns:
        ``(M,)`` float64 SSIM of candidate ``j`` to ``init[j]``.

    Raises:
        DataReconError: shapes differ.
    """
    candidates, init = check_image_pair(candidates, init, ("candidates", "initial images"))
    if candidates.shape[0] != init.shape[0]:
        raise DataReconError(f"{candidates.shape[0]} candidates but {init.shape[0]} initial images")
    cand = minmax_rescale(candidates) if rescale else candidates
    idx = torch.arange(cand.shape[0])
    return ssim_index_pairs(cand, init.clamp(0.0, 1.0), (idx, idx), window=window, data_range=1.0,
                            chunk=chunk).double()


@dataclass(frozen=True)
class Collapse:
    """Near-duplicate candidates (attack collapse).

    Attributes:
        fraction_pairs: Fraction of unordered candidate pairs that are near-duplicates.
        fraction_candidates: Fraction of candidates with at least one near-duplicate.
        n_pairs: Number of unordered pairs ``M (M - 1) / 2``.
        n_close: Number of near-duplicate pairs.
        metric: ``"ssim"`` (pair close if SSIM >= threshold) or ``"l2"``
            (close if distance <= threshold).
        threshold: The threshold used.
        nearest_other: ``(M,)`` each candidate's similarity (SSIM) or distance (L2) to its nearest
            other candidate (NaN with fewer than two candidates).
        cluster: ``(M,)`` int64 collapse cluster of each candidate: candidates joined by chains of
            near-duplicate pairs share an id (0, 1, ... by decreasing size); -1 for a candidate
            with no near-duplicate.
    """

    fraction_pairs: float
    fraction_candidates: float
    n_pairs: int
    n_close: int
    metric: str
    threshold: float
    nearest_other: Tensor = field(default_factory=lambda: torch.empty(0))
    cluster: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))

    def cluster_sizes(self) -> list[int]:
        """Sizes of the collapse clusters (at least two candidates each), largest first."""
        if self.cluster.numel() == 0:
            return []
        ids = self.cluster[self.cluster >= 0]
        return sorted(torch.bincount(ids).tolist(), reverse=True) if ids.numel() else []


def collapse(candidates: Tensor, *, metric: str = "ssim", threshold: float | None = None,
             window: str = "gaussian", chunk: int = DEFAULT_CHUNK) -> Collapse:
    """Detect collapse: how many candidate pairs are near-duplicates.

    Args:
        candidates: ``(M, C, H, W)`` display-space candidates in ``[0, 1]``.
        metric: ``"ssim"`` or ``"l2"``.
        threshold: SSIM at or above which (default 0.9), or L2 distance at or
            below which (default ``0.05 * sqrt(C*H*W)``, i.e. RMS pixel error
            0.05), two candidates count as duplicates.

    Returns:
        :class:`Collapse` (fractions are NaN with fewer than two candidates).
    """
    candidates = check_images(candidates, "candidates")
    m = candidates.shape[0]
    if metric == "ssim":
        thr = 0.9 if threshold is None else float(threshold)
        mat = ssim_matrix(candidates, candidates, window=window, chunk=chunk)
        close = mat >= thr
    elif metric == "l2":
        d = int(np.prod(candidates.shape[1:]))
        thr = 0.05 * d**0.5 if threshold is None else float(threshold)
        mat = l2_matrix(candidates, candidates)
        close = mat <= thr
    else:
        raise DataReconError(f"unknown collapse metric {metric!r}; valid names: l2, ssim")
    n_pairs = m * (m - 1) // 2
    if n_pairs == 0:
        return Collapse(float("nan"), float("nan"), 0, 0, metric, thr, torch.full((m,), float("nan")),
                        torch.full((m,), -1, dtype=torch.int64))
    off = ~torch.eye(m, dtype=torch.bool)
    close = close & off
    n_close = int(torch.triu(close, diagonal=1).sum())
    has = close.any(dim=1)
    fill = -torch.inf if metric == "ssim" else torch.inf
    others = mat.double().masked_fill(~off, fill)
    nearest = others.max(dim=1).values if metric == "ssim" else others.min(dim=1).values
    return Collapse(n_close / n_pairs, int(has.sum()) / m, n_pairs, n_close, metric, thr, nearest,
                    collapse_clusters(close))


def collapse_clusters(close: Tensor) -> Tensor:
    """Connected components of a near-duplicate graph.

    Args:
        close: ``(M, M)`` bool, symmetric, True where two candidates are near-duplicates (diagonal ignored).

    Returns:
        ``(M,)`` int64 cluster id per candidate, 0 for the largest cluster of at least two, 1 for the
        next (ties by lowest candidate index), -1 for a candidate with no near-duplicate.
    """
    # lazy: scipy.sparse.csgraph is slow to import and only the near-duplicate collapse uses it
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    m = close.shape[0]
    adj = close.clone()
    adj.fill_diagonal_(False)
    _, labels = connected_components(csr_matrix(adj.cpu().numpy()), directed=False)
    labels = torch.from_numpy(labels.astype(np.int64))
    sizes = torch.bincount(labels, minlength=int(labels.max()) + 1 if m else 0)
    out = torch.full((m,), -1, dtype=torch.int64)
    big = [int(c) for c in torch.nonzero(sizes >= 2).view(-1)]
    first = {c: int(torch.nonzero(labels == c)[0]) for c in big}
    for new_id, c in enumerate(sorted(big, key=lambda c: (-int(sizes[c]), first[c]))):
        out[labels == c] = new_id
    return out


def param_distance(theta_star: Mapping[str, Tensor], theta: Mapping[str, Tensor]) -> float:
    """Squared parameter distance ``Σ_p ‖θ*_p − θ_p‖²`` (computed in float64).

    Args:
        theta_star: Trained parameters by name.
        theta: Parameters of the same names and shapes (e.g. the bilevel inner solution).

    Returns:
        The distance as a Python float.

    Raises:
        DataReconError: different names or shapes.

    References:
        Runkel et al. (2024), eq. 2, l(θ*, θ(x)) = ‖θ* − θ(x)‖²; Table 1.
    """
    a, b = set(theta_star), set(theta)
    if a != b:
        raise DataReconError(
            f"parameter names differ (only in theta_star: {sorted(a - b)}, only in theta: {sorted(b - a)}); "
            "pass parameters of the same model"
        )
    total = 0.0
    for k in sorted(a):
        x, y = theta_star[k], theta[k]
        if tuple(x.shape) != tuple(y.shape):
            raise DataReconError(f"parameter {k!r} has shapes {tuple(x.shape)} and {tuple(y.shape)}; pass matching models")
        total += float((x.detach().double() - y.detach().double().to(x.device)).pow(2).sum())
    return total
