"""Evaluate reconstructions: where ground truth enters, and only here.

:func:`evaluate` is the tensor-level entry point: display-space candidates plus the training,
held-out and noise images in, an :class:`Evaluation` out (nothing written, no model directory
needed; a user's own model evaluates this way). It assembles the pure reports of
:mod:`datarecon.evaluation.reports` (neighbours, Haim protocol, null baselines, privacy,
collapse) under one :class:`~datarecon.evaluation.reports.EvaluationConfig`; what the attack
recorded beside the candidates (labels, scores, λ, initial images) travels in a :class:`RunRecord`.
:func:`evaluate_candidates` is the same with the reference sets in one mapping.
:func:`evaluate_run` is a thin wrapper for a run directory (``docs/dev/CONTRACTS.md``) under
:class:`RunEvaluationSettings`: it reads ``candidates.safetensors`` and ``run.json``, loads the
model directory and the task data it names, calls :func:`evaluate`, and writes

* ``RUN/metrics.json``: summary (Haim counts at thresholds for greedy /
  Hungarian / independent matching, sorted SSIM curves with held-out and
  noise baselines, mean similarity and L2 to the nearest image of each
  reference set, privacy AUC / TPR per attacker score, collapse, the
  parameter distance when ``run.json`` has ``extra.param_distance``);
* ``RUN/candidates.csv``: one row per candidate (nearest index and value per
  reference set and metric, rank, scores, real/fake label);
* ``RUN/neighbours.safetensors``: the best-matched candidates with their
  nearest training / partition images, for the report's grids.

Candidates are mapped to display space (training mean added back) and, for
the nearest-neighbour searches, clamped to ``[0, 1]`` (SSIM assumes data range
1); the Haim protocol instead min-max rescales them per image.

References:
    Haim et al. (2022) section 5; Runkel et al. (2024) sections 4-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, field_validator
from torch import Tensor

from datarecon.attacks.base import ATTACKS, DEFAULT_DIVERGENCE_HINT, convergence_of
from datarecon.attacks.convergence import Convergence, assess_convergence
from datarecon.attacks.labels import label_accuracy
from datarecon.attacks.run_directory import INIT_FILE
from datarecon.config import build_config, build_record
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.data.selection import check_fingerprint
from datarecon.errors import CheckpointError, DataReconError
from datarecon.evaluation.baselines import headline_rule, noise_images
from datarecon.evaluation.membership import candidate_roc
from datarecon.evaluation.neighbours import Neighbours
from datarecon.evaluation.privacy import PrivacyScore
from datarecon.evaluation.protocol import HaimResult, init_similarity
from datarecon.evaluation.records import read_run_fields
from datarecon.evaluation.reports import (
    PAPER_THRESHOLD,
    REAL_RULE,
    EvaluationConfig,
    baseline_report,
    collapse_report,
    finite_or_none,
    headline,
    neighbour_report,
    privacy_section,
    protocol_report,
    real_floor,
)
from datarecon.evaluation.similarity import check_images, effective_window_size
from datarecon.kernel.files import (
    CANDIDATES,
    CANDIDATES_CSV,
    HISTORY,
    METRICS_FILE,
    MODEL_JSON,
    NEIGHBOURS_FILE,
    RUN_JSON,
    TASK_FILE,
)
from datarecon.kernel.losses import margins
from datarecon.kernel.status import EVALUABLE as STATUS_EVALUABLE
from datarecon.kernel.status import Status
from datarecon.models.checkpoint import load_model_dir
from datarecon.utils.io import atomic_write_json, load_tensors, read_json, read_json_lines, save_tensors, write_csv
from datarecon.utils.lock import check_free, hold

__all__ = [
    "Evaluation",
    "EvaluationConfig",
    "RunEvaluationSettings",
    "RunRecord",
    "evaluate",
    "evaluate_candidates",
    "evaluate_run",
    "write_evaluation",
    "headline",
    "PAPER_THRESHOLD",
    "REAL_RULE",
    "METRICS_FILE",
    "CANDIDATES_CSV",
    "NEIGHBOURS_FILE",
]

#: run statuses evaluated without ``allow_incomplete``: finished, by its step budget or its own early stop
EVALUABLE = STATUS_EVALUABLE  # complete, stopped-early (datarecon.kernel.status)
#: candidates kept for the report's neighbour grids
GRID_MAX = 64


@dataclass(frozen=True)
class Evaluation:
    """Everything :func:`evaluate` computes.

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


def evaluate(candidates: Tensor, *, train: Tensor | None, heldout: Tensor | None = None,
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
    return _evaluate(raw, refs, record=record or RunRecord(), config=cfg, progress=progress)


def evaluate_candidates(candidates: Tensor, *, references: Mapping[str, Tensor], train_key: str = "train",
                        heldout_key: str = "heldout", record: RunRecord | None = None,
                        config: EvaluationConfig | Mapping[str, Any] | None = None,
                        progress: bool = False) -> Evaluation:
    """:func:`evaluate` with the reference sets in one mapping.

    Args:
        candidates, record, config, progress: see :func:`evaluate` (the noise null candidates are
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
    return _evaluate(raw, references, record=record or RunRecord(), config=cfg, progress=progress,
                     train_key=train_key, heldout_key=heldout_key)


def _evaluate(raw: Tensor, references: Mapping[str, Tensor], *, record: RunRecord, config: EvaluationConfig,
              progress: bool, train_key: str = "train", heldout_key: str = "heldout") -> Evaluation:
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
    grid = _neighbour_grid(nb.neighbours, cands, refs, metric=config.metric, train_key=train_key,
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


def _neighbour_grid(neighbours: Mapping[tuple[str, str], Neighbours], cands: Tensor, refs: Mapping[str, Tensor], *,
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


def init_name_of(meta: Mapping[str, Any]) -> str | None:
    """The initialisation name a ``run.json`` records (None for pooled or older runs without one)."""
    init = meta.get("init")
    return str(init.get("name")) if isinstance(init, Mapping) and init.get("name") else None


def read_init(run_dir: str | Path, *, m: int) -> Tensor | None:
    """The initial candidates x₀ ``(m, C, H, W)`` (model input space) a data-initialised run recorded in
    ``init.safetensors``, or None (a run from a random start, or from an earlier version).

    Raises:
        CheckpointError: the file holds no ``x0`` of ``m`` candidates.
    """
    path = Path(run_dir) / INIT_FILE
    if not path.is_file():
        return None
    t = load_tensors(path)
    if "x0" not in t or t["x0"].shape[0] != m:
        raise CheckpointError(f"{path} does not hold the {m} initial candidates of this run (tensor 'x0'); "
                              "re-create the run")
    return t["x0"].detach()


def _resolve_model_dir(run_dir: Path, model_dir: str | None) -> Path:
    if not model_dir:
        raise CheckpointError(f"{run_dir / 'run.json'} has no model_dir; re-create the run with `datarecon reconstruct`")
    p = Path(model_dir)
    for cand in ([p] if p.is_absolute() else [run_dir / p, p, run_dir.parent / p]):
        if cand.is_dir():
            return cand
    raise CheckpointError(
        f"model directory {model_dir} named in {run_dir / 'run.json'} not found; restore it or fix model_dir"
    )


def _margins(bundle, x_model: Tensor, y: Tensor) -> Tensor | None:
    try:
        with torch.no_grad():
            out = bundle.model(x_model.to(next(bundle.model.parameters()).dtype))
    except Exception:  # margins are optional decoration; never fail the evaluation on them
        return None
    multiclass = not (out.ndim == 1 or out.shape[-1] == 1)
    return margins(out, y.reshape(-1), multiclass=multiclass).double()


def run_convergence(run_dir: str | Path) -> list[tuple[str, Convergence]]:
    """Whether the attack of ``run_dir`` converged (:func:`~datarecon.attacks.convergence.assess_convergence`,
    the verdict the report's attack card shows): one ``(name, verdict)``, or one per source run of a
    pool (``reconstruct --runs K``, ``sweep pool``); source runs no longer on disk are left out.

    Raises:
        CheckpointError: a run.json that is not one datarecon wrote.
    """
    run_dir = Path(run_dir)
    meta = read_run_fields(run_dir / RUN_JSON)
    if meta.get("method") != "pool":
        return [(run_dir.name, _verdict(run_dir, meta))]
    out = []
    for source in (meta.get("extra") or {}).get("sources") or []:
        rel = str(source.get("run_dir") or "") if isinstance(source, Mapping) else ""
        found = next((d for d in (run_dir / rel, run_dir.parent.parent / rel) if rel and (d / RUN_JSON).is_file()),
                     None)
        if found is not None:
            out.append((str(source.get("key") or rel), _verdict(found, read_run_fields(found / RUN_JSON))))
    return out


def _verdict(run_dir: Path, meta: Mapping[str, Any]) -> Convergence:
    """:func:`assess_convergence` of one run from its history and record (as the report judges it)."""
    return assess_convergence(read_json_lines(run_dir / HISTORY), convergence_of(meta.get("method")),
                              status=str(meta.get("status") or Status.COMPLETE), record=meta)


def how_to_finish(run_dir: Path, meta: Mapping[str, Any]) -> str:
    """How to finish the run in ``run_dir``: the command its ``run.json`` recorded, else by who wrote it."""
    command = meta.get("resume_command")
    if command:
        return f"finish it with `{command}`"
    if (run_dir / TASK_FILE).is_file():
        return "finish it by rerunning its sweep (`datarecon sweep` with the same --config and --out)"
    return "finish it (`datarecon reconstruct` with its original options and --resume)"


def _divergence_hint(method: Any) -> str:
    """What the attack ``method`` of a diverged run tells the user to change (its ``divergence_hint``; a
    method this installation does not know: the default step's)."""
    return ATTACKS.get(method).divergence_hint if isinstance(method, str) and method in ATTACKS \
        else DEFAULT_DIVERGENCE_HINT


def _incomplete(run_dir: Path, missing: str) -> str:
    """Why ``run_dir`` cannot be evaluated yet (``missing`` is absent) and exactly how to continue."""
    batch = sorted((p for p in run_dir.glob("run[0-9]*") if p.is_dir()), key=lambda p: int(p.name[3:] or 0)) \
        if missing == RUN_JSON else []
    metas = []
    for p in batch:
        try:
            metas.append((p, read_json(p / RUN_JSON)))
        except DataReconError:
            metas.append((p, {}))
    if metas:
        unfinished = [p.name for p, m in metas if m.get("status") in (None, Status.RUNNING)]
        command = next((m.get("resume_command") for _, m in metas if m.get("resume_command")), None)
        how = f"`{command}`" if command else "the same `datarecon reconstruct ... --runs` command with --resume"
        state = (f"{len(unfinished)} of its {len(metas)} runs are unfinished ({', '.join(unfinished)})" if unfinished
                 else f"its {len(metas)} runs finished but were not pooled yet")
        return f"it holds the runs of `reconstruct --runs`, and {state}; continue with {how}"
    meta: dict[str, Any] = {}
    if (run_dir / RUN_JSON).is_file():
        try:
            meta = read_json(run_dir / RUN_JSON)
        except DataReconError:
            meta = {}
    return f"{missing} is missing; {how_to_finish(run_dir, meta)}, or evaluate another run directory"


_DEFAULTS = EvaluationConfig.model_fields

#: the reference sets a run is evaluated against (``against``; ``datarecon evaluate --against``)
REFERENCE_SETS: tuple[str, ...] = ("train", "partition", "noise", "heldout")


def check_reference_sets(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` when each is a reference set (:data:`REFERENCE_SETS`) named once; one set given twice
    would be evaluated and reported twice.

    Raises:
        ValueError: an unknown name, a repeated one, or none.
    """
    bad = [a for a in names if a not in REFERENCE_SETS]
    if bad or not names:
        raise ValueError(f"unknown reference set(s) {bad or list(names)}; valid names: {', '.join(sorted(REFERENCE_SETS))}")
    twice = sorted({a for a in names if names.count(a) > 1})
    if twice:
        raise ValueError(f"reference set(s) {', '.join(twice)} given more than once; name each set once")
    return tuple(names)


class RunEvaluationSettings(BaseModel):
    """How :func:`evaluate_run` evaluates a run directory (one-to-one with the options of
    ``datarecon evaluate``); :meth:`evaluation` gives the :class:`EvaluationConfig` it runs under.

    Attributes:
        against: Reference sets (comma-separated on the command line): any of ``train``,
            ``partition``, ``heldout`` (from the model's data spec) and ``noise`` (uniform images in
            ``[0, 1]``, as many as training images, seeded by ``seed``).
        metric: Nearest-neighbour metric: ssim, l2, ncc, lncc.
        prefilter: Cheap metric of the nearest-neighbour shortlist (lncc, l2, ncc), or None: exhaustive.
        top_k: Prefilter shortlist size before exact SSIM (searches of more than ``exact_up_to`` pairs
            only; labelled approximate).
        exact_up_to: Compare every candidate with every reference (exact) up to this many pairs per search.
        window: SSIM window: gaussian (sigma 1.5, like scikit-image) or box3.
        thresholds: SSIM thresholds of the Haim counts.
        assignment: Haim protocol matching: greedy, hungarian, independent.
        seed: Seed of the noise reference set and baselines.
        allow_incomplete: Evaluate runs that did not finish (status other than ``complete`` or
            ``stopped-early``: ``running``, ``diverged``).
        grid_max: Candidates stored for the report's neighbour grids.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    against: tuple[str, ...] = REFERENCE_SETS
    # the evaluation's own settings default to EvaluationConfig's (one set of defaults)
    metric: str = _DEFAULTS["metric"].default
    prefilter: str | None = _DEFAULTS["prefilter"].default
    top_k: int = _DEFAULTS["top_k"].default
    exact_up_to: int = _DEFAULTS["exact_up_to"].default
    window: str = _DEFAULTS["window"].default
    thresholds: tuple[float, ...] = _DEFAULTS["thresholds"].default
    assignment: str = _DEFAULTS["assignment"].default
    seed: int = _DEFAULTS["noise_seed"].default
    allow_incomplete: bool = False
    grid_max: int = GRID_MAX

    @field_validator("against")
    @classmethod
    def _known_sets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return check_reference_sets(v)
        except ValueError as exc:  # the one line of the Python API and the command line alike
            raise DataReconError(str(exc)) from None

    def evaluation(self) -> EvaluationConfig:
        """The evaluation settings (``seed`` seeds both the noise reference set and the noise baselines).

        Raises:
            DataReconError: a setting :class:`EvaluationConfig` refuses.
        """
        return build_config(EvaluationConfig, {
            "metric": self.metric, "prefilter": self.prefilter, "top_k": self.top_k, "exact_up_to": self.exact_up_to,
            "window": self.window, "thresholds": tuple(float(t) for t in self.thresholds),
            "assignment": self.assignment, "noise_seed": self.seed, "baseline_seed": self.seed,
        }, where="evaluation settings")


@dataclass(frozen=True)
class _Run:
    """A run directory's files as :func:`evaluate_run` reads them.

    Attributes:
        dir: the run directory.
        meta: its ``run.json``.
        status: its status (``complete`` when not recorded).
        tensors: its ``candidates.safetensors``: ``x`` ``(M, C, H, W)`` in model input space, and
            ``labels``, ``multipliers`` ``(M,)`` when recorded.
        scores: ``{name: (M,)}`` the attacker-side scores (tensors ``score_<name>``).
    """

    dir: Path
    meta: Mapping[str, Any]
    status: str
    tensors: Mapping[str, Tensor]
    scores: Mapping[str, Tensor]


def evaluate_run(run_dir: str | Path, settings: RunEvaluationSettings | Mapping[str, Any] | None = None, *,
                 data_dir: str | Path | None = None, write: bool = True, progress: bool = True,
                 train: Tensor | None = None, heldout: Tensor | None = None) -> dict[str, Any]:
    """Evaluate a run directory against the ground truth; write metrics and a table.

    Args:
        run_dir: Run directory (``candidates.safetensors``, ``run.json``).
        settings: :class:`RunEvaluationSettings` or its fields: reference sets (``against``), search
            and protocol settings, ``seed`` of the noise reference set and baselines,
            ``allow_incomplete`` (evaluate runs that did not finish) and ``grid_max``; None: defaults.
        data_dir: Data folder for :func:`datarecon.data.load_task`.
        write: Write ``metrics.json``, ``candidates.csv`` and ``neighbours.safetensors``.
        progress: Show progress bars.
        train, heldout: For a run of a user's own model (``run.json`` has ``own_model``, no model
            directory): its training and held-out inputs ``(N, C, H, W)`` in the model's input space;
            candidates and these are mapped to images by the recorded ``value_range``
            ((x − lo) / (hi − lo)). ``train`` is required for such a run; ``partition`` is not available.

    Returns:
        The summary dict (the content of ``metrics.json``).

    Raises:
        CheckpointError: missing run files or model directory.
        DataReconError: unknown reference set name, shape mismatch, run not complete, bad settings, or
            the run directory in use by another process (an attack or evaluation writing it).
    """
    s = settings if isinstance(settings, RunEvaluationSettings) else build_config(
        RunEvaluationSettings, dict(settings or {}), where="evaluation settings")
    check_run(run_dir, s)
    with hold(run_dir, what="run directory") if write else nullcontext():  # one writer of its metrics at a time
        run = _read_run(Path(run_dir), s)
        if run.meta.get("own_model") and not run.meta.get("model_dir"):
            return _evaluate_own_run(run, s, train=train, heldout=heldout, write=write, progress=progress)
        if train is not None or heldout is not None:
            raise DataReconError(f"{run.dir} attacked a model directory; its training and held-out images come from "
                                 "there: drop train/heldout (--train/--heldout)")
        return _evaluate_model_run(run, s, data_dir=data_dir, write=write, progress=progress)


def check_run(run_dir: str | Path, settings: RunEvaluationSettings) -> dict[str, Any]:
    """The checks :func:`evaluate_run` makes before it reads any tensor, so a command given several
    runs refuses a bad one before it writes anything: the run folder exists, is a run directory
    that no other process is writing, holds its files and may be evaluated.

    Returns:
        The run's ``run.json`` (its fields checked, :func:`~datarecon.evaluation.records.read_run_fields`).

    Raises:
        CheckpointError: missing run files (saying how to finish the run), a model directory, a bad run.json.
        DataReconError: the run is in use by another process, or not complete (without ``allow_incomplete``).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} not found; run an attack with `datarecon reconstruct`")
    if (run_dir / MODEL_JSON).is_file() and not (run_dir / RUN_JSON).is_file():
        raise CheckpointError(f"{run_dir} is a model directory, not a run directory; attack it with `datarecon "
                              f"reconstruct --model {run_dir} --out RUN` and evaluate RUN")
    check_free(run_dir, what="run directory")  # an attack or an evaluation still writing it: say so first
    for name in (RUN_JSON, CANDIDATES):
        if not (run_dir / name).is_file():
            raise CheckpointError(f"{run_dir} is incomplete: {_incomplete(run_dir, name)}")
    meta = read_run_fields(run_dir / RUN_JSON)
    status = meta.get("status", Status.COMPLETE)
    if status == Status.DIVERGED and not settings.allow_incomplete:  # a resume would diverge again
        raise DataReconError(f"run {run_dir} diverged (it kept its last finite state); evaluate that state with "
                             "--allow-incomplete (allow_incomplete=True in Python), or rerun the attack: "
                             f"{_divergence_hint(meta.get('method'))}")
    if status not in EVALUABLE and not settings.allow_incomplete:
        raise DataReconError(f"run {run_dir} has status {status!r}; {how_to_finish(run_dir, meta)}, or pass "
                             "--allow-incomplete (allow_incomplete=True in Python)")
    return meta


def _read_run(run_dir: Path, s: RunEvaluationSettings) -> _Run:
    """Check the run directory (:func:`check_run`) and read its record and candidates.

    Raises:
        CheckpointError: missing run files (saying how to finish the run), a model directory, bad tensors.
        DataReconError: run in use or not complete (without ``allow_incomplete``).
    """
    meta = check_run(run_dir, s)
    status = meta.get("status", Status.COMPLETE)
    tensors = load_tensors(run_dir / CANDIDATES)
    if "x" not in tensors:
        raise CheckpointError(f"{run_dir / 'candidates.safetensors'} has no 'x' tensor; re-create the run")
    m = tensors["x"].shape[0]
    for k in ("labels", "multipliers"):
        if k in tensors and tensors[k].reshape(-1).shape[0] != m:
            raise CheckpointError(f"{run_dir / 'candidates.safetensors'}: {k} has {tensors[k].numel()} values for {m} candidates")
    scores = {k[len("score_"):]: v.reshape(-1) for k, v in tensors.items() if k.startswith("score_")}
    return _Run(dir=run_dir, meta=meta, status=status, tensors=tensors, scores=scores)


def _load_target(run: _Run, data_dir: str | Path | None):
    """The model directory a run attacked, its bundle, the task its data spec names and its normalisation.

    Raises:
        CheckpointError: the model directory is missing, or its training indices are stale.
    """
    model_dir = _resolve_model_dir(run.dir, run.meta.get("model_dir"))
    bundle = load_model_dir(model_dir)
    where = f"data spec of {Path(model_dir) / MODEL_JSON}"
    spec = build_record(DataSpec, bundle.data, where=where).checked(where)
    task = load_task(spec, data_dir=data_dir)
    check_fingerprint(task, bundle.meta.get("data_fingerprint"), where=str(model_dir))
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    if "train" in bundle.indices and not torch.equal(bundle.indices["train"].long(), task.train.indices.long()):
        raise CheckpointError(f"training indices of {model_dir} differ from the data spec's selection; stale model or data")
    return model_dir, bundle, task, norm


def _evaluate_model_run(run: _Run, s: RunEvaluationSettings, *, data_dir: str | Path | None, write: bool,
                        progress: bool) -> dict[str, Any]:
    """:func:`evaluate_run` for a run of a model directory: references from the model's data spec."""
    model_dir, bundle, task, norm = _load_target(run, data_dir)
    x = run.tensors["x"].detach()
    if tuple(x.shape[1:]) != tuple(task.input_shape):
        raise DataReconError(f"candidates have shape {tuple(x.shape[1:])}, the model expects {tuple(task.input_shape)}")
    display = norm.to_display(x.float())

    sets = {a: getattr(task, a).x for a in ("train", "partition", "heldout") if a in s.against}
    margins = _margins(bundle, norm.to_model(task.train.x), task.train.y) if "train" in sets else None
    x0 = read_init(run.dir, m=x.shape[0])
    init = None if x0 is None else norm.to_display(x0.float())
    record = RunRecord(labels=run.tensors.get("labels"), scores=run.scores, multipliers=run.tensors.get("multipliers"),
                       margins=margins, init=init, init_name=init_name_of(run.meta))
    ev = evaluate(display, train=sets.get("train"), heldout=sets.get("heldout"), partition=sets.get("partition"),
                  noise=len(task.train) if "noise" in s.against else None, record=record, config=s.evaluation(),
                  progress=progress)
    summary = dict(ev.summary)
    extra = run.meta.get("extra") or {}
    summary["param_distance"] = extra.get("param_distance")
    restored = ((run.meta.get("knowledge") or {}).get("labels"))
    if restored is not None:
        summary["labels"] = restored_label_accuracy(restored, task.train.y, bundle.arch.num_outputs)
    summary["run"] = {"run_dir": str(run.dir), "model_dir": str(model_dir), "method": run.meta.get("method"),
                      "status": run.status, "steps_done": run.meta.get("steps_done"), "seed": run.meta.get("seed"),
                      "config": run.meta.get("config"), "data": bundle.data, "arch": bundle.arch.model_dump(mode="json")}
    if write:
        init_ssim = torch.tensor([r["init_ssim"] for r in ev.rows]) if x0 is not None else None
        grid = ev.grid if s.grid_max == GRID_MAX else _neighbour_grid(
            ev.neighbours, display.clamp(0, 1), sets, metric=s.metric, train_key="train", grid_max=s.grid_max,
            init=None if init is None else init.clamp(0, 1), init_ssim=init_ssim)
        write_evaluation(run.dir, replace(ev, summary=summary, grid=grid))
    return summary


def restored_label_accuracy(restored: Mapping[str, Any], truth: Tensor, num_classes: int) -> dict[str, Any]:
    """The restored labels' record (run.json ``knowledge.labels``) beside the training set's: the share of the
    true label multiset they hold (:func:`datarecon.attacks.labels.label_accuracy`) and both counts."""
    counts = torch.tensor([int(c) for c in restored["counts"]], dtype=torch.int64)
    labels = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    true_counts = torch.bincount(truth.long().reshape(-1), minlength=num_classes)
    return {"source": restored.get("source", "restored"), "counts": counts.tolist(),
            "true_counts": true_counts.tolist(), "accuracy": label_accuracy(labels, truth, num_classes)}


def _evaluate_own_run(run: _Run, s: RunEvaluationSettings, *, train: Tensor | None, heldout: Tensor | None,
                      write: bool, progress: bool) -> dict[str, Any]:
    """:func:`evaluate_run` for a run of a user's own model: references given as tensors."""
    own = run.meta["own_model"]
    if train is None:
        raise DataReconError(f"{run.dir} attacked your own model ({own.get('factory', 'from Python')}); pass its "
                             "training inputs: --train FILE.safetensors (tensor 'x', model input space)")
    against = [a for a in s.against if a != "partition"]  # no partition without a data spec
    lo, hi = (float(v) for v in own.get("value_range", (0.0, 1.0)))
    x = run.tensors["x"].detach().double()
    for name, t in (("train", train), ("heldout", heldout)):
        if t is not None and tuple(t.shape[1:]) != tuple(x.shape[1:]):
            raise DataReconError(f"{name} images have shape {tuple(t.shape[1:])}, the candidates {tuple(x.shape[1:])}")

    def display(t: Tensor) -> Tensor:
        return ((t.double() - lo) / (hi - lo)).float()

    record = RunRecord(labels=run.tensors.get("labels"), scores=run.scores, multipliers=run.tensors.get("multipliers"))
    ev = evaluate(display(x), train=display(train) if "train" in against else None,
                  heldout=display(heldout) if heldout is not None and "heldout" in against else None,
                  noise=int(train.shape[0]) if "noise" in against else None, record=record, config=s.evaluation(),
                  progress=progress)
    summary = dict(ev.summary)
    summary["param_distance"] = (run.meta.get("extra") or {}).get("param_distance")
    summary["run"] = {"run_dir": str(run.dir), "model_dir": None, "own_model": dict(own),
                      "method": run.meta.get("method"), "status": run.status, "steps_done": run.meta.get("steps_done"),
                      "seed": run.meta.get("seed"), "config": run.meta.get("config")}
    if write:
        grid = ev.grid if s.grid_max == GRID_MAX else _neighbour_grid(
            ev.neighbours, display(x).clamp(0, 1), {"train": display(train)}, metric=s.metric,
            train_key="train", grid_max=s.grid_max)
        write_evaluation(run.dir, replace(ev, summary=summary, grid=grid))
    return summary


def write_evaluation(folder: str | Path, ev: Evaluation) -> Path:
    """Write ``ev`` as ``metrics.json``, ``candidates.csv`` and ``neighbours.safetensors`` in ``folder``.

    The files ``datarecon report`` reads; each is replaced atomically. ``folder`` is created.

    Returns:
        ``folder``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / METRICS_FILE, ev.summary)
    write_csv(folder / CANDIDATES_CSV, ev.rows)
    save_tensors(folder / NEIGHBOURS_FILE, ev.grid, metadata={"metric": str(ev.summary.get("metric", "ssim"))})
    return folder
