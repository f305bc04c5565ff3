"""The defence-audit figure: one defence axis, four panels (count with its null band and the
DP-SGD bound, mean best SSIM with the held-out null, held-out accuracy, membership: the strongest
signal's TPR at 1 % FPR beside the loss threshold's). Plotting only: the numbers come from the
audit's table rows (:func:`datarecon.experiments.audit.row_for`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from datarecon.report.style import series
from datarecon.utils.io import as_float


def axis_positions(rows: Sequence[Mapping[str, Any]], *, axis: str) -> list[tuple[str, str, float]]:
    """(setting, tick label, sort key) of each setting of ``axis`` plus the baseline, in plot order.

    The baseline is placed where it belongs on the axis: weight decay 0 first, its epochs among the
    epochs, ε = ∞ (no DP) last.
    """
    seen: dict[str, tuple[str, float]] = {}
    for r in rows:
        s = r["setting"]
        if s in seen:
            continue
        if axis == "dp":
            eps = math.inf if r["axis"] == "baseline" else as_float(r.get("dp_epsilon"))
            if r["axis"] == "baseline":
                label = "∞ (no DP)"
            elif math.isfinite(eps):
                label = f"{eps:.3g}"
            else:
                label = "∞ (clip only)"
            key = eps if math.isfinite(eps) else (math.inf if r["axis"] == "baseline" else 1e300)
        elif axis == "weight_decay":
            key = as_float(r.get("weight_decay"))
            label = f"{key:g}"
        else:
            key = as_float(r.get("epochs"))
            label = f"{key:g}"
        seen[s] = (label, key)
    return sorted(((s, lab, k) for s, (lab, k) in seen.items()), key=lambda t: t[2])


def defence_figure(rows: Sequence[Mapping[str, Any]], *, axis: str, xlabel: str, log_x: bool = True) -> Figure:
    """Count, mean best SSIM, held-out accuracy and membership against one defence axis.

    Args:
        rows: table rows of this axis and of the baseline (keys of ``row_for``), one per (setting, seed).
        axis: ``dp`` | ``weight_decay`` | ``epochs``.
        xlabel: axis title.
        log_x: unused for the categorical layout (kept for a numeric axis later).

    Returns:
        A matplotlib figure (not yet saved).
    """
    order = axis_positions(rows, axis=axis)
    xs = {s: i for i, (s, _, _) in enumerate(order)}
    fig = Figure(figsize=(17, 3.8))
    axes = fig.subplots(1, 4)
    rec, held, noise = series("reconstructions"), series("heldout"), series("noise")

    def by_setting(key: str) -> list[list[float]]:
        vals: list[list[float]] = [[] for _ in order]
        for r in rows:
            vals[xs[r["setting"]]].append(as_float(r.get(key)))
        return vals

    def mean(v: list[float]) -> float:
        f = [x for x in v if math.isfinite(x)]
        return sum(f) / len(f) if f else math.nan

    x = list(range(len(order)))
    panels = ((axes[0], "count", "training images reconstructed", "count_heldout", "count_noise"),
              (axes[1], "mean_best_ssim", "mean best SSIM per training image", "mean_best_ssim_heldout", None),
              (axes[2], "heldout_accuracy", "held-out accuracy", None, None),
              (axes[3], "membership_tpr_1pct", "membership: TPR at 1% FPR", "membership_loss_tpr_1pct", None))
    for ax, key, title, null_key, noise_key in panels:
        vals = by_setting(key)
        for i, v in enumerate(vals):
            ax.scatter([i] * len(v), v, color=rec.color, alpha=0.5, s=18)
        label = {"heldout_accuracy": "target", "membership_tpr_1pct": "strongest signal"}.get(key, rec.label)
        ax.plot(x, [mean(v) for v in vals], color=rec.color, label=label)
        if key == "membership_tpr_1pct":
            ax.plot(x, [mean(v) for v in by_setting(null_key)], color=held.color, linestyle="--", label="loss threshold")
            ax.set_ylim(-0.02, 1.02)
        elif null_key:
            hv = [mean(v) for v in by_setting(null_key)]
            ax.plot(x, hv, color=held.color, linestyle="--", label=held.label)
            if noise_key:  # the null band: between the noise and the held-out counts
                lo = [mean(v) for v in by_setting(noise_key)]
                ax.fill_between(x, [min(a, b) for a, b in zip(lo, hv)], [max(a, b) for a, b in zip(lo, hv)],
                                color=held.color, alpha=0.15)
                ax.plot(x, lo, color=noise.color, linestyle="--", label=noise.label)
        if key == "count" and axis == "dp":
            bound = [mean(v) for v in by_setting("bound_count")]
            if any(math.isfinite(b) for b in bound):
                ax.plot(x, bound, color="black", linestyle=":", marker="x", label="DP-SGD bound n·κ₊")
        ax.set_xticks(x, [lab for _, lab, _ in order], rotation=30, fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        if key == "count":
            n = max((as_float(r.get("n_train")) for r in rows), default=math.nan)
            if math.isfinite(n):
                ax.set_ylim(-0.5, n + 0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def target_line(r: Mapping[str, Any]) -> str:
    """One target of an audit's table in one line: its defence, the reconstruction count beside its held-out and
    noise nulls, and the strongest membership signal beside the loss threshold."""
    eps = f", DP epsilon {r['dp_epsilon']:.3g}" if isinstance(r.get("dp_epsilon"), float) and math.isfinite(
        r["dp_epsilon"]) else ""
    member = (f"; membership {r.get('membership_signal')} AUC {_num(r.get('membership_auc'))}, TPR at 1% FPR "
              f"{_num(r.get('membership_tpr_1pct'))} (loss threshold AUC {_num(r.get('membership_loss_auc'))})"
              if r.get("membership_signal") else "")
    return (f"  {r['setting']} seed {r['seed']}{eps}: {r.get('count')} of {r.get('n_train')} reconstructed "
            f"(held-out null {r.get('count_heldout')}, noise {r.get('count_noise')}){member}")


def _num(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) and math.isfinite(v) else "n/a"


def figure_caption(f: str) -> str:
    """The caption of the audit's figure file ``f`` (``dp.png``, ``weight_decay.png``, ``epochs.png``)."""
    axis = f.removesuffix(".png")
    what = {"dp": "DP-SGD ε", "weight_decay": "weight decay", "epochs": "training epochs"}.get(axis, axis)
    return (f"Reconstruction count (null band: held-out and noise counts at the same threshold), mean best SSIM, "
            f"held-out accuracy and membership (the strongest signal's TPR at 1% FPR, the loss threshold's dashed) "
            f"against {what}; points are seeds, lines their mean"
            + ("; dotted: the DP-SGD bound n·κ₊" if axis == "dp" else ""))


def table_cell(v: Any) -> Any:
    """A table row's value as the report shows it (n/a for None and non-finite numbers)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "n/a"
    return "n/a" if v is None else v
