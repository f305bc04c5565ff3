"""Figures from evaluation results (matplotlib, Agg backend; plotting only).

Every function takes results already computed by :mod:`datarecon.evaluation`
(tensors, arrays or the ``metrics.json`` summary) and returns a
:class:`matplotlib.figure.Figure`; nothing is computed from ground truth
here. :func:`figure_png` and :func:`save_figure` turn a figure into PNG bytes
or a file (atomic write).

References:
    Haim et al. (2022) Fig. 3-5 (neighbour grids, sorted SSIM curve, SSIM vs
    margin); Runkel et al. (2024) Fig. 10-12 (landscape over the mixture
    initialisation x = λ₂(λ₁ x_GT + (1 − λ₁) x_part) + (1 − λ₂) x_rnd).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.stats import rankdata

from datarecon.errors import DataReconError
from datarecon.report.style import series
from datarecon.utils.io import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "figure_png",
    "save_figure",
    "neighbour_grid",
    "sorted_ssim_curve",
    "convergence_curve",
    "ssim_vs_margin",
    "roc_curves",
    "scree_plot",
    "membership_roc_figure",
    "histogram_axis",
    "score_histograms",
    "image_strip",
    "landscape_heatmaps",
    "interpolation_curves",
    "LANDSCAPE_SETS",
    "SET_TITLES",
]

#: Reference sets shown in the landscape figures (Runkel Fig. 10-12).
LANDSCAPE_SETS: tuple[str, ...] = ("train", "partition", "noise")
#: How a figure or a report names each reference set.
SET_TITLES = {"train": "training", "partition": "partition", "noise": "noise", "heldout": "held-out",
              "init": "start"}


def _pyplot() -> Any:
    """matplotlib's pyplot (Agg backend), imported at the first figure: a measured start-up cost (about 0.2 s
    that every command paid before it drew anything; docs/PERFORMANCE.md, "Start-up")."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig: Figure, *, dpi: int = 100, close: bool = True) -> bytes:
    """Render ``fig`` to PNG bytes (and close it unless ``close=False``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    if close:
        _pyplot().close(fig)
    return buf.getvalue()


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int = 100, close: bool = True) -> None:
    """Write ``fig`` as a PNG file atomically."""
    atomic_write_bytes(path, figure_png(fig, dpi=dpi, close=close))


def _img(x: Any) -> np.ndarray:
    """(C, H, W) tensor/array in [0, 1] -> (H, W[, 3]) for imshow."""
    a = x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=float)
    a = np.clip(a, 0.0, 1.0)
    if a.ndim == 3:
        a = a[0] if a.shape[0] == 1 else np.transpose(a, (1, 2, 0))
    return a


def neighbour_grid(candidates: torch.Tensor, matches: Mapping[str, torch.Tensor], *,
                   scores: Mapping[str, Sequence[float]] | None = None, max_items: int = 24,
                   groups_per_row: int = 4, title: str | None = None,
                   indices: Mapping[str, Sequence[int]] | None = None, total: int | None = None,
                   sorted_by: str | None = None) -> Figure:
    """Each candidate beside its nearest image in each reference set.

    Args:
        candidates: ``(K, C, H, W)`` display-space candidates, already in the
            order to show (e.g. sorted by similarity to the training set).
        matches: ``{set name: (K, C, H, W)}`` their nearest images (e.g.
            ``train``, ``partition``), same order.
        scores: ``{set name: (K,)}`` similarity values written under the
            matched images, optional.
        max_items: Show at most this many candidates.
        groups_per_row: Candidate groups (candidate + matches) per figure row.
        title: Figure title.
        indices: ``{set name: (K,)}`` index of each matched image in its set, optional: a
            matched image shown for several candidates is labelled ``×k`` and the title says how
            many candidates share an image (so a repeated image is not read as several matches).
            Not used for ``init`` (each candidate's own start).
        total: How many candidates there are in all; the title says "k of total shown" (and
            ``sorted_by``) so a cap on the figure is never silent.
        sorted_by: What the shown candidates are sorted by (e.g. "SSIM to their nearest training image").

    Returns:
        Figure.
    """
    k = min(int(candidates.shape[0]), max_items)
    repeats: dict[str, dict[int, int]] = {}
    for name, idx in (indices or {}).items():
        if name == "init":
            continue
        shown = [int(v) for v in list(idx)[:k]]
        repeats[name] = {v: shown.count(v) for v in shown}
    if k == 0:
        raise DataReconError("no candidates to show in the neighbour grid")
    names = list(matches)
    width = 1 + len(names)
    gpr = max(1, min(groups_per_row, k))
    rows = math.ceil(k / gpr)
    header = (1 if title else 0) + len(indices or {}) + (1 if total is not None or sorted_by else 0)
    fig, axes = _pyplot().subplots(rows, gpr * width, figsize=(1.1 * gpr * width, 1.5 * rows + 0.2 * header), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i in range(k):
        r, g = divmod(i, gpr)
        ax = axes[r, g * width]
        ax.imshow(_img(candidates[i]), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"#{i + 1}", fontsize=7)
        for j, name in enumerate(names):
            ax = axes[r, g * width + 1 + j]
            ax.imshow(_img(matches[name][i]), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            label = SET_TITLES.get(name, name)
            if scores is not None and name in scores:
                label = f"{label} {float(scores[name][i]):.2f}"
            if name in repeats:
                j = int(list(indices[name])[i])
                label = f"#{j} {label}" + (f" ×{repeats[name][j]}" if repeats[name][j] > 1 else "")
            ax.set_title(label, fontsize=6)
    shared = {name: sum(c for c in r.values() if c > 1) for name, r in repeats.items()}
    notes = [f"{n} of {k} candidates share a {SET_TITLES.get(name, name)} image with another (×k)"
             for name, n in shared.items() if n]
    if total is not None or sorted_by:
        shown = f"{k} of {total} candidates shown" if total is not None else f"{k} candidates shown"
        notes.insert(0, shown + (f", sorted by {sorted_by}" if sorted_by else ""))
    if title or notes:
        fig.suptitle("\n".join(([title] if title else []) + notes), fontsize=9)
    fig.tight_layout(h_pad=0.6)
    return fig


def _clean(values: Sequence[float | None] | None) -> np.ndarray:
    if values is None:
        return np.zeros(0)
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def sorted_ssim_curve(curves: Mapping[str, Sequence[float | None]], *, threshold: float | None = 0.4,
                      calibrated: float | None = None, window: str | None = None,
                      title: str | None = None) -> Figure:
    """Sorted per-training-image SSIM (Haim protocol) with baseline curves.

    Args:
        curves: ``{series key: SSIM values}``, e.g. ``reconstructions`` (or ``real``),
            ``heldout``, ``noise`` (sorted here in decreasing order; None/NaN dropped); names
            and colours from :data:`datarecon.report.style.SERIES`.
        threshold: The papers' fixed "good reconstruction" line (None: none).
        calibrated: The headline threshold max(0.4, t) (drawn in the held-out colour), or None.
        window: SSIM window named in the axis label (it changes the values).
        title: Axes title.
    """
    fig, ax = _pyplot().subplots(figsize=(5, 3.4))
    n = 0
    for key, vals in sorted(curves.items(), key=lambda kv: series(kv[0]).dashed):  # the attack first
        v = _clean(vals)
        v = np.sort(v[~np.isnan(v)])[::-1]
        n = max(n, v.size)
        if v.size:
            st = series(key)
            ax.plot(np.arange(1, v.size + 1), v, label=st.label, color=st.color or None,
                    lw=1.2 if st.dashed else 2, ls="--" if st.dashed else "-")
    if threshold is not None:
        ax.axhline(threshold, color="gray", lw=0.8, ls=":", label=f"papers' threshold {threshold:g}")
    if calibrated is not None:
        ax.axhline(calibrated, color=series("heldout").color, lw=0.9, ls="-.",
                   label=f"headline threshold {calibrated:.3f}")
    ax.set_xlabel(f"training images ({n}), sorted by SSIM")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("SSIM" + (f" ({window} window)" if window else ""))
    ax.set_ylim(min(-0.1, ax.get_ylim()[0]), 1.02)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title(title or "Best SSIM per training image, sorted", fontsize=9)
    fig.tight_layout()
    return fig


def convergence_curve(steps: Sequence[int], values: Sequence[float], *, key: str, tol: float | None = None,
                      converged: bool | None = None, title: str | None = None, label: str | None = None) -> Figure:
    """The attack's convergence signal over its steps (log scale), with the tolerance line.

    Args:
        steps: ``(T,)`` logged steps.
        values: ``(T,)`` the judged metric (the attack's convergence metric); non-positive or NaN values skipped.
        key: Metric name for the axis label.
        tol: Tolerance line (e.g. :data:`datarecon.attacks.convergence.RESIDUAL_TOL`), or None.
        converged: The verdict written in the title, or None.
        title: Axes title.
        label: What the metric is called on the axis and in the title (default: ``key``).
    """
    name = label or key.replace("_", " ")
    fig, ax = _pyplot().subplots(figsize=(5, 3.0))
    st, v = np.asarray(steps, dtype=float), _clean(values)
    ok = ~np.isnan(v) & (v > 0)
    ax.plot(st[ok], v[ok], color=series("reconstructions").color, lw=1.6, marker="." if ok.sum() < 20 else None)
    if ok.any():
        ax.set_yscale("log")
    if tol is not None:
        ax.axhline(tol, color="gray", lw=0.8, ls=":", label=f"converged below {tol:g}")
        ax.legend(fontsize=7)
    ax.set_xlabel("attack step")
    ax.set_ylabel(name)
    verdict = "" if converged is None else (" — converged" if converged else " — NOT converged")
    ax.set_title((title or f"Attack convergence: {name}") + verdict, fontsize=9)
    fig.tight_layout()
    return fig


def ssim_vs_margin(ssim: Sequence[float | None], margin: Sequence[float], *,
                   threshold: float | None = 0.4, title: str | None = None) -> Figure:
    """Scatter of each training image's reconstruction SSIM against its output margin.

    Args:
        ssim: ``(N,)`` Haim-protocol SSIM per training image (None/NaN skipped).
        margin: ``(N,)`` output margin ``y Φ(x)`` (or multiclass margin) per training image.
    """
    s, m = _clean(ssim), _clean(margin)
    if s.shape != m.shape:
        raise DataReconError(f"ssim ({s.size}) and margin ({m.size}) have different lengths")
    ok = ~(np.isnan(s) | np.isnan(m))
    fig, ax = _pyplot().subplots(figsize=(4.5, 3.4))
    ax.scatter(m[ok], s[ok], s=8, alpha=0.7)
    if threshold is not None:
        ax.axhline(threshold, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("output margin of the training image")
    ax.set_ylabel("SSIM of its best reconstruction")
    ax.set_title(title or "SSIM vs margin", fontsize=9)
    fig.tight_layout()
    return fig


def scree_plot(values: Sequence[float], *, n_hat: int | None = None, interval: Sequence[int] | None = None,
               k: int | None = None, n_known: int | None = None, noise_edge: float | None = None,
               title: str | None = None) -> Figure:
    """Singular values of the first dense layer (log scale) with the estimate of n and the subspace used.

    Args:
        values: ``(q,)`` singular values, descending (``subspace.safetensors`` ``values``).
        n_hat, interval: the elbow estimate of n and the range n is expected in.
        k: the subspace dimension the attack used.
        n_known: the attacker's prior n, if any.
        noise_edge: the initialisation's noise edge (weights only), if known.
        title: Axes title.
    """
    v = _clean(values)
    fig, ax = _pyplot().subplots(figsize=(5, 3.0))
    idx = np.arange(1, v.size + 1)
    ok = ~np.isnan(v) & (v > 0)
    ax.plot(idx[ok], v[ok], color=series("reconstructions").color, lw=1.4)
    if ok.any():
        ax.set_yscale("log")
    if interval is not None and len(interval) == 2:
        ax.axvspan(interval[0], interval[1], color="gray", alpha=0.15, label=f"n expected in {interval[0]}-{interval[1]}")
    if n_hat is not None:
        ax.axvline(n_hat, color="gray", lw=0.9, ls="--", label=f"elbow n̂ = {n_hat}")
    if k is not None:
        ax.axvline(k, color=series("heldout").color, lw=0.9, ls=":", label=f"subspace k = {k}")
    if n_known is not None:
        ax.axvline(n_known, color="black", lw=0.8, ls="-.", label=f"known n = {n_known}")
    if noise_edge is not None and noise_edge > 0:
        ax.axhline(noise_edge, color="gray", lw=0.8, ls=":", label="initialisation's noise edge")
    ax.set_xlabel("index of the singular value")
    ax.set_ylabel("singular value")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title(title or "First dense layer: singular values (scree plot)", fontsize=9)
    fig.tight_layout()
    return fig


def roc_curves(rocs: Mapping[str, tuple[Sequence[float], Sequence[float], float]], *,
               title: str | None = None, log: bool = False) -> Figure:
    """ROC curves of attacker-side scores: candidates closer to a training image than to any held-out
    image (positives) against the others.

    Args:
        rocs: ``{score name: (fpr, tpr, auc)}``; ``auc`` None or NaN is shown as "n/a".
        log: Log-scaled axes (to read TPR at low FPR).
    """
    fig, ax = _pyplot().subplots(figsize=(4.2, 4))
    for name, (fpr, tpr, auc) in rocs.items():
        f, t = _clean(fpr), _clean(tpr)
        if f.size and not np.isnan(f).any():
            defined = isinstance(auc, (int, float)) and math.isfinite(auc)
            ax.plot(f, t, label=f"{name} (AUC {auc:.2f})" if defined else f"{name} (AUC n/a)")
    ax.plot([0, 1], [0, 1], color="gray", lw=0.8, ls=":")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-3, 1)
        ax.set_ylim(1e-3, 1)
    ax.set_xlabel("false-positive rate (not closer, called closer)")
    ax.set_ylabel("true-positive rate (closer to a training image)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title or "Can the attacker tell which candidates match training images?", fontsize=9)
    fig.tight_layout()
    return fig


def membership_roc_figure(rocs: Mapping[str, tuple[Sequence[float], Sequence[float], float]], *,
                          n_members: int, n_nonmembers: int, strongest: str | None = None) -> Figure:
    """ROC curves of membership signals on log-log axes, as Carlini et al. (2022) plot LiRA's.

    Args:
        rocs: ``{signal: (fpr, tpr, auc)}`` on the same members and non-members.
        n_members, n_nonmembers: the class sizes (the title; the x axis starts at 1 / n_nonmembers,
            the lowest false-positive rate the non-members resolve).
        strongest: the signal chosen on the calibration part (drawn thicker, named in the legend).
    """
    fig, ax = _pyplot().subplots(figsize=(4.8, 4.4))
    floor = 1.0 / max(n_nonmembers, 1)
    tfloor = 0.5 / max(n_members, 1)  # below one member in the TPR
    for name, (fpr, tpr, auc) in rocs.items():
        f, t = _clean(fpr), _clean(tpr)
        if not f.size or np.isnan(f).any():
            continue
        label = f"{name} (AUC {auc:.3f})" if isinstance(auc, (int, float)) and math.isfinite(auc) else f"{name}"
        strong = name == strongest
        ax.plot(np.maximum(f, floor), np.maximum(t, tfloor), lw=2.2 if strong else 1.0,
                label=label + (", strongest" if strong else ""))
    ax.plot([floor, 1], [floor, 1], color="gray", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(tfloor, 1.05)
    for f in (0.01, 0.001):
        if f >= floor:
            ax.axvline(f, color="gray", lw=0.5, ls="--")
    ax.set_xlabel("false-positive rate (non-members called members)")
    ax.set_ylabel("true-positive rate (members called members)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6.5, loc="lower right")
    ax.set_title(f"Membership: {n_members} members against {n_nonmembers} non-members", fontsize=9)
    fig.tight_layout()
    return fig


#: a score panel whose fullest bin would hold more than this fraction of the scores is drawn on the percentile axis
CROWDED_BIN = 0.25


def histogram_axis(members: Sequence[float], nonmembers: Sequence[float], *,
                   bins: int = 30) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Where a membership panel draws its scores: ``(member x, non-member x, bin edges, axis label)``.

    The score itself, from the 1st percentile of both classes' scores to their maximum (the long tail below
    gathered in the first bin), unless its fullest bin would then hold more than :data:`CROWDED_BIN` of the scores
    (a loss-type score piled up next to its bound, or a few far outliers): then each score's percentile among both
    classes' scores (ties share their mean rank), which spreads them over equal-count bins and keeps the order
    that the ROC reads. Non-finite scores are dropped.

    Args:
        members, nonmembers: scores (higher = member).
        bins: bins over the axis.
    """
    m, n = np.asarray(members, dtype=float), np.asarray(nonmembers, dtype=float)
    m, n = m[np.isfinite(m)], n[np.isfinite(n)]
    both = np.r_[m, n]
    if not both.size:
        return m, n, np.linspace(0.0, 1.0, bins + 1), "score"
    lo, hi = float(np.percentile(both, 1)), float(both.max())
    hi = hi if hi > lo else lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    m_lin, n_lin = np.clip(m, lo, hi), np.clip(n, lo, hi)
    counts, _ = np.histogram(np.r_[m_lin, n_lin], bins=edges)
    if counts.max() <= CROWDED_BIN * both.size:
        return m_lin, n_lin, edges, "score"
    pct = 100.0 * (rankdata(both, method="average") - 0.5) / both.size  # ranks 1..N, ties share their mean
    return pct[:m.size], pct[m.size:], np.linspace(0.0, 100.0, bins + 1), "percentile among all scores"


def score_histograms(panels: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, bins: int = 30,
                     columns: int = 4) -> Figure:
    """Members' and non-members' score distributions of each membership signal, one panel each (density, so that
    classes of very different sizes compare; the counts are in the legend), on the axis :func:`histogram_axis`
    chooses: the score from its 1st percentile to its maximum, or, where that would crowd the scores into one bin,
    their percentile among both classes' scores (the panel's x label says which).

    Args:
        panels: ``{signal: (member scores, non-member scores)}`` (higher = member).
        bins: histogram bins over the axis.
        columns: panels per row.
    """
    if not panels:
        raise DataReconError("no membership scores to draw")
    cols = max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / cols)
    fig, axes = _pyplot().subplots(rows, cols, figsize=(3.1 * cols, 2.5 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (name, (mem, non)) in zip(axes.flat, panels.items()):
        m, n, edges, label = histogram_axis(mem, non, bins=bins)
        if not m.size + n.size:
            continue
        ax.axis("on")
        ax.hist(n, bins=edges, density=True, alpha=0.55, color=series("heldout").color, label=f"non-members ({n.size})")
        ax.hist(m, bins=edges, density=True, alpha=0.55, color=series("reconstructions").color,
                label=f"members ({m.size})")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel(label, fontsize=6)
        ax.tick_params(labelsize=6)
        ax.set_yticks([])
        ax.legend(fontsize=5.5, loc="upper left")
    fig.tight_layout()
    return fig


def image_strip(images: torch.Tensor, titles: Sequence[str], *, columns: int = 8) -> Figure:
    """Images in rows of ``columns``, each with its title (e.g. the most exposed training images, ranked).

    Args:
        images: (k, C, H, W) in [0, 1] (values outside are clipped; a user's model's inputs are scaled to their
            range first by the caller).
        titles: one per image.
    """
    k = int(images.shape[0])
    if k == 0:
        raise DataReconError("no images to show")
    cols = max(1, min(columns, k))
    rows = math.ceil(k / cols)
    fig, axes = _pyplot().subplots(rows, cols, figsize=(1.15 * cols, 1.35 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, ax in zip(range(k), axes.flat):
        ax.imshow(_img(images[i]), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(titles[i], fontsize=6)
    fig.tight_layout(h_pad=0.4)
    return fig


def _landscape_value(metrics: Mapping[str, Any], name: str, key: str) -> float:
    if key in metrics and isinstance(metrics[key], Mapping):
        v = metrics[key].get(name)
    else:
        v = metrics.get(name)
    return float("nan") if v is None else float(v)


def _grid(results: Mapping[tuple[float, float], Mapping[str, Any]]):
    if not results:
        raise DataReconError("no results for the landscape; pass {(lambda1, lambda2): metrics}")
    l1 = sorted({float(k[0]) for k in results})
    l2 = sorted({float(k[1]) for k in results})
    return l1, l2


def landscape_heatmaps(results: Mapping[tuple[float, float], Mapping[str, Any]], *,
                       sets: Sequence[str] = LANDSCAPE_SETS, key: str = "mean_l2_to_nearest",
                       title: str | None = None) -> Figure:
    """Heatmaps of the mean L2 distance to the nearest image of each set over (λ₁, λ₂).

    Args:
        results: ``{(λ₁, λ₂): metrics}``; ``metrics[key][set]`` (e.g. a
            ``metrics.json`` summary) or ``metrics[set]`` holds the value.
        sets: Reference sets, one heatmap each.
        key: Summary key holding ``{set: value}``.

    Returns:
        Figure with one heatmap per set (λ₁ on x, λ₂ on y); missing cells blank.
    """
    l1, l2 = _grid(results)
    fig, axes = _pyplot().subplots(1, len(sets), figsize=(3.6 * len(sets), 3.2), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=True):
        grid = np.full((len(l2), len(l1)), np.nan)
        for (a, b), met in results.items():
            grid[l2.index(float(b)), l1.index(float(a))] = _landscape_value(met, name, key)
        im = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(l1)), [f"{v:g}" for v in l1])
        ax.set_yticks(range(len(l2)), [f"{v:g}" for v in l2])
        ax.set_xlabel("λ₁ (ground truth ↔ partition)")
        ax.set_ylabel("λ₂ (image ↔ noise)")
        ax.set_title(f"mean L2 to nearest {SET_TITLES.get(name, name)}", fontsize=9)
        for (yy, xx), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(xx, yy, f"{v:.2g}", ha="center", va="center", fontsize=6, color="w")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def interpolation_curves(results: Mapping[Any, Any], *, sets: Sequence[str] = LANDSCAPE_SETS,
                         key: str = "mean_l2_to_nearest", title: str | None = None) -> Figure:
    """The two interpolation curves of the landscape (Runkel Fig. 11-12).

    Left: λ₂ = 1, ground truth ↔ partition over λ₁. Right: λ₁ = 1, ground
    truth ↔ noise over λ₂. One line per (method, reference set).

    Args:
        results: ``{(λ₁, λ₂): metrics}`` for one method, or
            ``{method: {(λ₁, λ₂): metrics}}`` to compare methods.
        sets, key: See :func:`landscape_heatmaps`.
    """
    if results and all(isinstance(k, tuple) for k in results):
        by_method = {"": results}
    else:
        by_method = dict(results)
    fig, axes = _pyplot().subplots(1, 2, figsize=(9, 3.4))
    styles = ["-", "--", ":", "-."]
    for mi, (method, res) in enumerate(by_method.items()):
        _grid(res)
        for name in sets:
            for ax, fixed_axis in ((axes[0], 1), (axes[1], 0)):
                pts = sorted((float(k[1 - fixed_axis]), _landscape_value(v, name, key))
                             for k, v in res.items() if abs(float(k[fixed_axis]) - 1.0) < 1e-9)
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    lbl = f"{method} {SET_TITLES.get(name, name)}".strip()
                    ax.plot(xs, ys, marker="o", ms=3, ls=styles[mi % len(styles)], label=lbl,
                            color=series(name).color or None)
    axes[0].set_xlabel("λ₁ (λ₂ = 1): partition → ground truth")
    axes[1].set_xlabel("λ₂ (λ₁ = 1): noise → ground truth")
    for ax in axes:
        ax.set_ylabel("mean L2 to nearest")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title or "Interpolation curves", fontsize=10)
    fig.tight_layout()
    return fig
