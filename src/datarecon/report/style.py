"""One naming and colour scheme for every report and figure.

A series (the attack's reconstructions, held-out images used as a null, noise, ...) has one
name and one colour everywhere: in the sorted-SSIM curves, the interpolation curves, the
headline panel and the tables. Column names of the reproduction tables (CSV, snake_case) are
shown with readable labels; figure files get captions that say what they show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Series", "SERIES", "series", "column_label", "figure_caption", "COLUMN_LABELS"]


@dataclass(frozen=True)
class Series:
    """How one set of images is named and drawn.

    Attributes:
        label: Name in legends, tables and text.
        color: Matplotlib colour (also used in the HTML panel).
        dashed: Drawn dashed (the null baselines), else solid.
    """

    label: str
    color: str
    dashed: bool = False


#: Canonical series (tableau colours; nulls dashed).
SERIES: dict[str, Series] = {
    "reconstructions": Series("reconstructions", "#1f77b4"),
    "heldout": Series("held-out images (null)", "#ff7f0e", dashed=True),
    "noise": Series("uniform noise (null)", "#7f7f7f", dashed=True),
    "train": Series("training images", "#d62728"),
    "partition": Series("partition images", "#2ca02c"),
}
_ALIASES = {"real": "reconstructions", "candidates": "reconstructions", "attack": "reconstructions",
            "held-out": "heldout", "ground truth": "train", "ground-truth": "train"}


def series(key: str) -> Series:
    """The :class:`Series` of ``key`` (aliases such as ``real`` map to ``reconstructions``);
    an unknown key gets its own name and matplotlib's next colour (``color=""``)."""
    k = _ALIASES.get(key, key)
    return SERIES.get(k, Series(key.replace("_", " "), ""))


#: Readable labels of table columns (anything else: underscores become spaces).
COLUMN_LABELS: dict[str, str] = {
    "n_train": "n", "train_epochs": "epochs", "train_accuracy": "train acc", "train_loss": "train loss",
    "normalised_margin": "normalised margin", "kkt_regime_score": "KKT-regime score",
    "pooled_runs": "runs pooled", "m_pooled": "candidates pooled", "ssim_window": "SSIM window",
    "count_ssim_gt_0.4": "SSIM > 0.4: reconstructions", "count_heldout_gt_0.4": "SSIM > 0.4: held-out (null)",
    "count_noise_gt_0.4": "SSIM > 0.4: noise (null)", "mean_ssim": "mean SSIM", "n_real": "closer to a training image",
    "n_fake": "not closer", "auc": "ROC AUC", "auc_ci_low": "AUC 95% CI low", "auc_ci_high": "AUC 95% CI high",
    "count": "reconstructed", "count_heldout": "held-out null", "count_noise": "noise null",
    "threshold": "threshold max(0.4, t)", "null_threshold": "t (held-out null)",
    "excluded_by_init_rule": "excluded: stayed at start", "retained": "retained (ground-truth start)",
    "mean_ssim_to_start": "mean SSIM to start", "mean_ssim_to_train_match": "mean SSIM to training match", "tpr_at_fpr_0.01": "TPR @ 1% FPR", "tpr_at_fpr_0.001": "TPR @ 0.1% FPR",
}


def column_label(name: str) -> str:
    """Readable label of a table column (see :data:`COLUMN_LABELS`)."""
    return COLUMN_LABELS.get(name, name.replace("_", " ") if re.fullmatch(r"[a-z0-9_.]+", name) else name)


_FIXED_CAPTIONS = {
    "sorted_ssim": "Best SSIM per training image, sorted: the attack's reconstructions against held-out images "
                   "and uniform noise used as candidates (the null baselines).",
    "ssim_vs_margin": "Each training image's best-reconstruction SSIM against its output margin "
                      "(images on the margin are the ones the KKT attack can recover).",
    "reconstructions": "Best-matched reconstructions (left of each pair) beside their nearest training image, "
                       "with the SSIM; a repeated training image is marked ×k.",
}


def figure_caption(file_name: str) -> str:
    """A caption that says what a reproduction figure file shows (from its name).

    ``fig03b_affine_vs_partition.png`` → "Fig. 3b (affine target): each reconstruction beside its
    nearest partition image (SSIM)."; known stems (``sorted_ssim``) get a fixed sentence.
    """
    stem = file_name.rsplit(".", 1)[0]
    if stem in _FIXED_CAPTIONS:
        return _FIXED_CAPTIONS[stem]
    m = re.fullmatch(r"fig(\d\d)(?:-(\d\d))?([a-z]*?)(i{1,2})?(?:_(.*))?", stem)
    if not m:
        return stem.replace("_", " ")
    num, num2, letter, sub, rest = m.groups()
    fig = f"Fig. {int(num)}" + (f"/{int(num2)}" if num2 else "") + (letter or "") + (f".{sub}" if sub else "")
    rest = rest or ""
    vs = re.search(r"vs_(\w+)$", rest)
    model = re.sub(r"_?vs_\w+$", "", rest).replace("_", " ").strip()
    head = f"{fig}" + (f" ({model})" if model else "")
    if vs:
        return f"{head}: each reconstruction beside its nearest {series(vs.group(1)).label.rstrip('s')} (SSIM)."
    if int(num) == 10:
        return f"{head}: mean L2 distance to the nearest image over the mixture weights (λ₁, λ₂)."
    if num2 or int(num) in (11, 12):
        return f"{head}: mean L2 to the nearest image along ground truth ↔ partition and ground truth ↔ noise."
    if int(num) in (6, 7):
        return f"{head}: training-set rank of each candidate's nearest image (* = within the top ranks)."
    return f"{head}: reconstructions beside their nearest training image (SSIM)."
