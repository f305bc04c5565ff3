"""Evaluate candidate images against reference images: tensors in, an :class:`Evaluation` out.

Ground truth enters here, and only here. :func:`evaluation_of` takes display-space candidates with the
training, held-out, partition and noise images as keyword arguments; :func:`evaluation_against` takes the
reference sets in one mapping (any names, the training and held-out ones named by key). Both assemble the
pure reports of :mod:`datarecon.evaluation.reports` (neighbours, Haim protocol, null baselines, privacy,
collapse) under one :class:`~datarecon.evaluation.reports.EvaluationConfig`; what the attack recorded
beside the candidates (labels, scores, λ, initial images) travels in a :class:`RunRecord`. Nothing is
written and no model directory is needed: a user's own model evaluates this way, and
:func:`datarecon.evaluation.run_eval.run_metrics` calls :func:`evaluation_of` for a run directory.

Candidates are clamped to ``[0, 1]`` for the nearest-neighbour searches (SSIM assumes data range 1);
the Haim protocol instead min-max rescales them per image.

References:
    Haim et al. (2022) section 5; Runkel et al. (2024) sections 4-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.evaluation.baselines import headline_rule, noise_images
from datarecon.evaluation.membership import candidate_roc
from datarecon.evaluation.neighbours import Neighbours
from datarecon.evaluation.privacy import PrivacyScore
from datarecon.evaluation.protocol import HaimResult, init_similarity
from datarecon.evaluation.reports import (
    EvaluationConfig,
    baseline_report,
    collapse_report,
    finite_or_none,
    neighbour_report,
    privacy_section,
    protocol_report,
    real_floor,
)
from datarecon.evaluation.similarity import check_images, effective_window_size

__all__ = ["GRID_MAX", "Evaluation", "RunRecord", "evaluation_against", "evaluation_of", "neighbour_grid"]

#: candidates kept for the report's neighbour grids
GRID_MAX = 64


@dataclass(frozen=True)
class Evaluation:
    """Everything :func:`evaluation_of` and :func:`evaluation_against` compute.

    Attributes:
        summary: JSON-ready dict (what ``metrics.json`` holds).
        rows: One dict per candidate (what ``candidates.csv`` holds), in candidate order.
        neighbours: ``{(set, metric): Neighbours}`` for metric in ``("ssim", "l2")``
            (the primary metric first).
        haim: Haim protocol result against the training set (None without one).
        privacy: ``{score name: PrivacyScore}`` (empty without held-out images or scores).
        real: ``(M,)`` bool labels, or None.
        grid: the best-matched candidates beside their nearest training / partition images, for
            the report's neighbour grid (what ``neighbours.safetensors`` holds).
    """

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    neighbours: dict[tuple[str, str], Neighbours]
    haim: HaimResult | None = None
    privacy: dict[str, PrivacyScore] = field(default_factory=dict)
    real: Tensor | None = None
    grid: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """What is known beside the candidates, all optional: what the attack recorded per candidate and the
    target's margin on each training image. Recorded in the rows and the summary; the scores also give
    the privacy ROC, the initial images and their name pick the headline rule.

    Attributes:
        labels: ``(M,)`` per-candidate labels, recorded in the rows.
        scores: ``{name: (M,)}`` attacker-side scores, higher = more likely real.
        multipliers: ``(M,)`` per-candidate λ, recorded in the rows.
        margins: ``(N,)`` output margin of each training image (for the SSIM-vs-margin plot).
        init: ``(M, C, H, W)`` each candidate's initial image x₀ in display space, or None. Needed
            for data-initialised runs: their headline rule compares each candidate's SSIM to its
            training match with its SSIM to its own start.
        init_name: the initialisation's name (``datarecon.attacks.init.INITS``); it picks the
            headline rule (:func:`~datarecon.evaluation.baselines.headline_rule`: ``ground-truth``
            reports retention instead of a count, ``partition`` and ``mix`` the init rule).
    """

    labels: Tensor | None = None
    scores: Mapping[str, Tensor] | None = None
    multipliers: Tensor | None = None
    margins: Tensor | None = None
    init: Tensor | None = None
    init_name: str | None = None


def evaluation_of(candidates: Tensor, *, train: Tensor | None, heldout: Tensor | None = None,
                  noise: Tensor | int | None = None, partition: Tensor | None = None, record: RunRecord | None = None,
                  config: EvaluationConfig | Mapping[str, Any] | None = None, progress: bool = False) -> Evaluation:
    """Evaluate display-space candidates against the training set and the nulls, without a model directory.

    Computes what ``datarecon evaluate`` writes for a run directory: nearest neighbours in each set,
    the Haim protocol (three duplicate policies), the held-out and noise null baselines with the
    headline, real/fake labels with the privacy ROC of each attacker-side score, and collapse.

    Args:
        candidates: ``(M, C, H, W)`` reconstructions in display space (any range: clamped to
            ``[0, 1]`` for the searches, min-max rescaled for the Haim protocol).
        train: ``(N, C, H, W)`` the training images in ``[0, 1]`` (ground truth: evaluation only);
            None evaluates against the other sets only (no protocol, baselines or privacy).
        heldout: ``(K, C, H, W)`` images of the same distribution not trained on, or None (then no
            null-calibrated count and no real/fake labels).
        noise: a uniform-noise reference set: images, a count (drawn with ``config.noise_seed``),
            or None.
        partition: ``(P, C, H, W)`` the attacker's partition images, or None.
        record: :class:`RunRecord`: per-candidate labels, scores, λ and initial images (with the
            initialisation's name), and the training margins; None: nothing recorded.
        config: :class:`~datarecon.evaluation.reports.EvaluationConfig` or its fields.
        progress: show progress bars.

    Returns:
        :class:`Evaluation` (``datarecon.report.render_report`` accepts it).

    Raises:
        DataReconError: mismatched shapes or lengths, bad settings.

    References:
        Haim et al. (2022) section 5; Runkel et al. (2024) sections 4-5.
    """
    cfg = config if isinstance(config, EvaluationConfig) else build_config(
        EvaluationConfig, dict(config or {}), where="evaluation settings")
    raw = check_images(candidates, "candidates").detach()
    if isinstance(noise, int):
        noise = noise_images(noise, tuple(raw.shape[1:]), generator=torch.Generator().manual_seed(cfg.noise_seed))
    refs = {k: v for k, v in (("train", train), ("partition", partition), ("heldout", heldout), ("noise", noise))
            if v is not None}
    return _assembled_evaluation(raw, refs, record=record or RunRecord(), config=cfg, progress=progress)


def evaluation_against(candidates: Tensor, *, references: Mapping[str, Tensor], train_key: str = "train",
                       heldout_key: str = "heldout", record: RunRecord | None = None,
                       config: EvaluationConfig | Mapping[str, Any] | None = None,
                       progress: bool = False) -> Evaluation:
    """:func:`evaluation_of` with the reference sets in one mapping (any names; ``train_key`` and
    ``heldout_key`` say which are the training and held-out sets).

    Args:
        candidates, record, config, progress: see :func:`evaluation_of` (the noise null candidates are
            drawn with ``config.baseline_seed``).
        references: ``{name: (R, C, H, W)}`` display-space images in ``[0, 1]``, e.g. ``train``,
            ``partition``, ``heldout``, ``noise``. Empty sets are skipped.
        train_key, heldout_key: which references are the training and held-out sets.

    Returns:
        :class:`Evaluation`.

    Raises:
        DataReconError: mismatched shapes or lengths, bad settings.
    """
    cfg = config if isinstance(config, EvaluationConfig) else build_config(
        EvaluationConfig, dict(config or {}), where="evaluation settings")
    raw = check_images(candidates, "candidates").detach()
    return _assembled_evaluation(raw, references, record=record or RunRecord(), config=cfg, progress=progress,
                                 train_key=train_key, heldout_key=heldout_key)


def _assembled_evaluation(raw: Tensor, references: Mapping[str, Tensor], *, record: RunRecord,
                          config: EvaluationConfig, progress: bool, train_key: str = "train",
                          heldout_key: str = "heldout") -> Evaluation:
    """Check the inputs, run the reports, assemble summary and rows."""
    m = raw.shape[0]
    cands = raw.clamp(0.0, 1.0)
    init, init_ssim = _initial_images(raw, record.init, window=config.window)
    rule = headline_rule(record.init_name)
    scores = dict(record.scores or {})
    _check_lengths(m, record, scores)
    refs = _checked_references(references, raw, dtype=cands.dtype)
    summary = _settings_summary(raw, refs, config)
    summary["init"] = {"name": record.init_name, "rule": rule, "recorded": init is not None,
                       "mean_ssim_to_init": None if init_ssim is None else finite_or_none(float(torch.nanmean(init_ssim)))}
    columns = _record_columns(record, init_ssim)

    nb = neighbour_report(cands, refs, config, train_key=train_key, progress=progress)
    summary.update(nb.summary)
    columns.update(nb.columns)
    approximate = list(nb.approximate)

    haim = None
    train = refs.get(train_key)
    if train is not None:
        haim, summary["haim"], columns["haim_train_index"] = protocol_report(raw, train, config, margins=record.margins)
        if config.baselines:
            summary["baselines"], summary["headline"], notes = baseline_report(
                raw, cands, train, refs.get(heldout_key), config, haim=haim, rule=rule, init_ssim=init_ssim)
            approximate += notes

    floor, notes = real_floor(train, config, image_shape=raw.shape[1:], dtype=cands.dtype)
    approximate += notes
    primary = nb.neighbours.get((train_key, config.metric)), nb.neighbours.get((heldout_key, config.metric))
    real, priv, summary["privacy"] = _privacy(primary, scores, config, floor=floor, keys=(train_key, heldout_key))
    if real is not None:
        columns["real"] = [int(v) for v in real.tolist()]
    if primary[0] is not None and scores and config.metric == "ssim" and summary.get("headline"):
        summary["candidate_roc"] = _candidate_roc(primary[0], summary["headline"], scores)
    for k, v in scores.items():
        columns[f"score_{k}"] = torch.as_tensor(v).reshape(-1).tolist()
    summary["approximate"] = approximate
    summary["collapse"] = collapse_report(cands, config, columns=columns)
    rows = [{"candidate": i, **{c: vals[i] for c, vals in columns.items()}} for i in range(m)]
    grid = neighbour_grid(nb.neighbours, cands, refs, metric=config.metric, train_key=train_key,
                           init=None if init is None else init.clamp(0.0, 1.0), init_ssim=init_ssim)
    return Evaluation(summary=summary, rows=rows, neighbours=nb.neighbours, haim=haim, privacy=priv, real=real,
                      grid=grid)


def _initial_images(raw: Tensor, init: Tensor | None, *, window: str) -> tuple[Tensor | None, Tensor | None]:
    """The checked initial images ``(M, C, H, W)`` and each candidate's SSIM ``(M,)`` to its own (Haim
    protocol's rescaling), or ``(None, None)`` without them.

    Raises:
        DataReconError: non-finite initial images, or a shape other than the candidates'.
    """
    if init is None:
        return None, None
    init = check_images(init, "initial images").detach()
    if tuple(init.shape) != tuple(raw.shape):
        raise DataReconError(f"initial images have shape {tuple(init.shape)}, the candidates {tuple(raw.shape)}")
    return init, init_similarity(raw, init.to(raw.dtype), window=window)


def _check_lengths(m: int, record: RunRecord, scores: Mapping[str, Tensor]) -> None:
    """Refuse per-candidate labels, multipliers or scores with other than ``m`` values."""
    for k, v in (("labels", record.labels), ("multipliers", record.multipliers)):
        if v is not None and torch.as_tensor(v).reshape(-1).shape[0] != m:
            raise DataReconError(f"{k} has {torch.as_tensor(v).numel()} values for {m} candidates")
    for k, v in scores.items():
        if torch.as_tensor(v).reshape(-1).shape[0] != m:
            raise DataReconError(f"score {k!r} has {torch.as_tensor(v).numel()} values for {m} candidates")


def _checked_references(references: Mapping[str, Tensor], raw: Tensor, *, dtype: torch.dtype) -> dict[str, Tensor]:
    """The non-empty reference sets in ``dtype``, each checked to hold images of the candidates' shape."""
    refs = {}
    for k, v in references.items():
        v = check_images(v, f"reference set {k!r}")
        if v.shape[1:] != raw.shape[1:]:
            raise DataReconError(f"reference set {k!r} has images {tuple(v.shape[1:])}, candidates {tuple(raw.shape[1:])}")
        if v.shape[0]:
            refs[k] = v.to(dtype)
    return refs


def _settings_summary(raw: Tensor, refs: Mapping[str, Tensor], config: EvaluationConfig) -> dict[str, Any]:
    """The head of the summary: what was evaluated, against what, under which search settings."""
    h, w = raw.shape[-2:]
    return {
        "n_candidates": raw.shape[0], "image_shape": list(raw.shape[1:]), "metric": config.metric,
        "window": config.window, "window_size": effective_window_size(config.window, h, w),
        "prefilter": config.prefilter, "top_k": config.top_k, "exact_up_to": config.exact_up_to,
        "thresholds": [float(t) for t in config.thresholds],
        "reference_sizes": {k: int(v.shape[0]) for k, v in refs.items()},
    }


def _record_columns(record: RunRecord, init_ssim: Tensor | None) -> dict[str, list[Any]]:
    """The per-candidate columns of what the attack recorded (``label``, ``init_ssim``, ``multiplier``)."""
    columns: dict[str, list[Any]] = {}
    if record.labels is not None:
        columns["label"] = torch.as_tensor(record.labels).reshape(-1).tolist()
    if init_ssim is not None:
        columns["init_ssim"] = init_ssim.tolist()
    if record.multipliers is not None:
        columns["multiplier"] = torch.as_tensor(record.multipliers).reshape(-1).tolist()
    return columns


def _privacy(primary: tuple[Neighbours | None, Neighbours | None], scores: Mapping[str, Tensor],
             config: EvaluationConfig, *, floor: float | None,
             keys: tuple[str, str]) -> tuple[Tensor | None, dict[str, PrivacyScore], dict[str, Any]]:
    """Real/fake labels and the privacy section from the nearest training and held-out images (primary
    metric), or a note saying which set (``keys``: training, held-out name) is missing."""
    if primary[0] is not None and primary[1] is not None:
        return privacy_section(primary[0], primary[1], scores, config, floor=floor)
    missing = " and ".join(repr(k) for k, nb in zip(keys, primary, strict=True) if nb is None)
    return None, {}, {"note": f"not measured: no {missing} reference set (the rule compares each candidate with the "
                              "nearest training and the nearest held-out image)"}


def _candidate_roc(train_nb: Neighbours, head: Mapping[str, Any], scores: Mapping[str, Tensor]) -> dict[str, Any]:
    """:func:`~datarecon.evaluation.membership.candidate_roc` of the scores at the headline's threshold."""
    threshold = float(head["threshold"] if head.get("threshold") is not None else head["paper"]["threshold"])
    return candidate_roc(train_nb.score, threshold, {k: torch.as_tensor(v).reshape(-1) for k, v in scores.items()})


def neighbour_grid(neighbours: Mapping[tuple[str, str], Neighbours], cands: Tensor, refs: Mapping[str, Tensor], *,
                   metric: str, train_key: str, grid_max: int = GRID_MAX, init: Tensor | None = None,
                   init_ssim: Tensor | None = None) -> dict[str, Tensor]:
    """The ``grid_max`` best-matched candidates with their nearest train/partition images (and their own
    initial image with its SSIM, when given); ``n_candidates`` records how many there were in all."""
    key = (train_key, metric)
    if key in neighbours:
        nb = neighbours[key]
        s = nb.score.double()
        order = torch.sort(-s if nb.higher_is_better else s, stable=True).indices[:grid_max]
    else:
        order = torch.arange(min(grid_max, cands.shape[0]))
    out: dict[str, Tensor] = {"order": order, "candidates": cands[order].float(),
                              "n_candidates": torch.tensor([cands.shape[0]], dtype=torch.int64)}
    for name in (train_key, "partition"):
        if (name, metric) in neighbours:
            nb = neighbours[(name, metric)]
            out[f"{name}_index"] = nb.index[order]
            out[f"{name}_score"] = nb.score[order].float()
            out[name] = refs[name][nb.index[order]].float()
    if init is not None and init_ssim is not None:
        out["init"] = init[order].float()
        out["init_score"] = init_ssim[order].float()
        out["init_index"] = order.clone()
    return out


