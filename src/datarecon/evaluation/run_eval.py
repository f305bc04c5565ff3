"""Evaluate an attack run: where ground truth enters, and only here.

:func:`evaluate_candidates` is the pure core: display-space candidates plus
reference image sets in, a :class:`Evaluation` out (nothing written).
:func:`evaluate_run` wraps it for a run directory (``docs/dev/CONTRACTS.md``):
it reads ``candidates.safetensors`` and ``run.json``, loads the model
directory and the task data it names, and writes

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from datarecon.status import EVALUABLE as STATUS_EVALUABLE
from datarecon.errors import CheckpointError, DataReconError
from datarecon.evaluation.baselines import (
    NULL_RATE,
    Baselines,
    best_similarity_to,
    haim_ssim_against,
    noise_images,
    null_baselines,
    null_calibrated,
    summarise,
)
from datarecon.evaluation.neighbours import EXACT_UP_TO, METRICS, Neighbours, is_exact, nearest_neighbours
from datarecon.evaluation.privacy import (
    LOW_FPRS,
    MIN_CLASS_SIZE,
    PrivacyScore,
    bootstrap_auc_ci,
    privacy_report,
    real_labels,
)
from datarecon.evaluation.protocol import (
    DEFAULT_THRESHOLDS,
    HaimResult,
    collapse,
    counts_at,
    haim_protocol,
)
from datarecon.evaluation.similarity import check_images, effective_window_size
from datarecon.training.engine import track
from datarecon.utils.io import atomic_write_json, load_tensors, read_json, save_tensors, write_csv

__all__ = [
    "Evaluation",
    "evaluate_candidates",
    "evaluate_run",
    "headline",
    "PAPER_THRESHOLD",
    "REAL_RULE",
    "METRICS_FILE",
    "CANDIDATES_CSV",
    "NEIGHBOURS_FILE",
]

#: run statuses evaluated without ``allow_incomplete``: finished, by its step budget or its own early stop
EVALUABLE = STATUS_EVALUABLE  # complete, stopped-early (datarecon.status)
METRICS_FILE = "metrics.json"
#: The fixed "good reconstruction" SSIM threshold of the papers (Haim et al. 2022; Buzaglo et al. 2023).
PAPER_THRESHOLD = 0.4
CANDIDATES_CSV = "candidates.csv"
NEIGHBOURS_FILE = "neighbours.safetensors"

REAL_RULE = (
    "a candidate is real iff its nearest training image (by {metric}) is closer than every "
    "held-out image (best-train similarity > best-held-out similarity; ties are fake) and "
    "its best-train similarity beats the floor (if any)"
)


@dataclass(frozen=True)
class Evaluation:
    """Everything :func:`evaluate_candidates` computes.

    Attributes:
        summary: JSON-ready dict (what ``metrics.json`` holds).
        rows: One dict per candidate (what ``candidates.csv`` holds), in candidate order.
        neighbours: ``{(set, metric): Neighbours}`` for metric in ``("ssim", "l2")``
            (the primary metric first).
        haim: Haim protocol result against the training set (None without one).
        privacy: ``{score name: PrivacyScore}`` (empty without held-out images or scores).
        real: ``(M,)`` bool labels, or None.
    """

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    neighbours: dict[tuple[str, str], Neighbours]
    haim: HaimResult | None = None
    privacy: dict[str, PrivacyScore] = field(default_factory=dict)
    real: Tensor | None = None


def _finite(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _curve(t: Tensor | None) -> list[float | None] | None:
    if t is None:
        return None
    s = torch.sort(torch.nan_to_num(t.double(), nan=-math.inf), descending=True).values
    return [None if math.isinf(v) else float(v) for v in s.tolist()]


def evaluate_candidates(candidates: Tensor, labels: Tensor | None = None,
                        scores: Mapping[str, Tensor] | None = None, *,
                        references: Mapping[str, Tensor], train_key: str = "train",
                        heldout_key: str = "heldout", metric: str = "ssim", prefilter: str | None = "lncc",
                        top_k: int = 32, exact_up_to: int = EXACT_UP_TO, window: str = "gaussian",
                        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                        assignment: str = "greedy", multipliers: Tensor | None = None,
                        margins: Tensor | None = None, collapse_metric: str = "l2",
                        real_floor: float | str | None = "noise", n_floor_noise: int = 1000,
                        min_class_size: int = MIN_CLASS_SIZE,
                        baselines: bool = True, generator: torch.Generator | None = None,
                        progress: bool = False) -> Evaluation:
    """Evaluate display-space candidates against named reference sets.

    Args:
        candidates: ``(M, C, H, W)`` reconstructions in display space (training
            mean added back; any range: clamped to ``[0, 1]`` for the searches,
            min-max rescaled for the Haim protocol).
        labels: ``(M,)`` candidate labels (recorded in the rows), or None.
        scores: ``{name: (M,)}`` attacker-side scores, higher = more likely real.
        references: ``{name: (R, C, H, W)}`` display-space images in ``[0, 1]``,
            e.g. ``train``, ``partition``, ``heldout``, ``noise``. Empty sets are skipped.
        train_key, heldout_key: Which references are the training and held-out sets.
        metric: Primary metric for neighbours and the real/fake rule.
        prefilter, top_k, exact_up_to, window: Nearest-neighbour search (see
            :func:`~datarecon.evaluation.neighbours.nearest_neighbours`): exhaustive up to
            ``exact_up_to`` candidate-reference pairs, else the best of a ``top_k`` shortlist;
            the summary labels every approximate search (``nearest.<set>.<metric>.exact``
            and the list ``approximate``).
        thresholds: SSIM thresholds for the Haim counts.
        assignment: Duplicate handling of the main Haim result (the other
            two variants are always reported too).
        multipliers: ``(M,)`` λ, recorded in the rows.
        margins: ``(N,)`` output margin of each training image (for the
            SSIM-vs-margin plot), or None.
        collapse_metric: ``"l2"`` (cheap, default) or ``"ssim"`` (``M²`` SSIMs).
        real_floor: Floor of the real/fake rule (see
            :func:`~datarecon.evaluation.privacy.real_labels`): ``"noise"``
            (default) = the best similarity to the training set reached by
            any of ``n_floor_noise`` uniform-noise images (seeded); a number;
            or None for no floor.
        n_floor_noise: Noise images used for the ``"noise"`` floor.
        min_class_size: Fewest real and fake candidates for a measurable ROC (see
            :func:`~datarecon.evaluation.privacy.score_privacy`).
        baselines: Compute held-out and noise baselines.
        generator: Seeded generator for noise baselines (default seed 0).
        progress: Show progress bars.

    Returns:
        :class:`Evaluation`.

    Raises:
        DataReconError: mismatched shapes or lengths.
    """
    raw = check_images(candidates, "candidates").detach()
    m = raw.shape[0]
    cands = raw.clamp(0.0, 1.0)
    scores = dict(scores or {})
    for k, v in scores.items():
        if torch.as_tensor(v).reshape(-1).shape[0] != m:
            raise DataReconError(f"score {k!r} has {torch.as_tensor(v).numel()} values for {m} candidates")
    refs = {}
    for k, v in references.items():
        v = check_images(v, f"reference set {k!r}")
        if v.shape[1:] != raw.shape[1:]:
            raise DataReconError(f"reference set {k!r} has images {tuple(v.shape[1:])}, candidates {tuple(raw.shape[1:])}")
        if v.shape[0]:
            refs[k] = v.to(cands.dtype)
    primary = METRICS.get(metric)
    h, w = raw.shape[-2:]
    summary: dict[str, Any] = {
        "n_candidates": m, "image_shape": list(raw.shape[1:]), "metric": primary.name,
        "window": window, "window_size": effective_window_size(window, h, w),
        "prefilter": prefilter, "top_k": top_k, "exact_up_to": exact_up_to,
        "thresholds": [float(t) for t in thresholds],
        "reference_sizes": {k: int(v.shape[0]) for k, v in refs.items()},
    }
    rows: list[dict[str, Any]] = [{"candidate": i} for i in range(m)]
    if labels is not None:
        for r, y in zip(rows, torch.as_tensor(labels).reshape(-1).tolist(), strict=True):
            r["label"] = y
    if multipliers is not None:
        for r, lam in zip(rows, torch.as_tensor(multipliers).reshape(-1).tolist(), strict=True):
            r["multiplier"] = lam

    # nearest neighbours per reference set, primary metric and L2
    nbrs: dict[tuple[str, str], Neighbours] = {}
    metrics = [primary.name] + [x for x in ("ssim", "l2") if x != primary.name]
    jobs = [(s, mm) for s in refs for mm in metrics]
    nearest: dict[str, dict[str, Any]] = {}
    approximate: list[str] = []
    search = {"prefilter": prefilter, "top_k": top_k, "window": window, "exact_up_to": exact_up_to}
    for s, mm in track(jobs, desc="nearest neighbours", unit="search", mode=progress):
        nb = nearest_neighbours(cands, refs[s], metric=mm, prefilter=prefilter, top_k=top_k,
                                exact_up_to=exact_up_to, window=window)
        nbrs[(s, mm)] = nb
        stats = {**summarise(nb.score, thresholds if mm == "ssim" else ()), "exact": nb.exact}
        if not nb.exact:
            approximate.append(f"nearest.{s}.{mm}: best of a top-{nb.top_k} {nb.prefilter} shortlist "
                               f"({m} x {refs[s].shape[0]} pairs > exact_up_to)")
        nearest.setdefault(s, {})[mm] = stats
        for r, j, v in zip(rows, nb.index.tolist(), nb.score.tolist(), strict=True):
            r[f"{s}_{mm}_index"] = j
            r[f"{s}_{mm}"] = v
    summary["nearest"] = nearest
    # landscape quantity (Runkel Fig. 10-12): mean L2 to the nearest image of each set
    summary["mean_l2_to_nearest"] = {s: nearest[s]["l2"]["mean"] for s in nearest}

    # rank of each candidate's best training similarity among all candidates
    if (train_key, primary.name) in nbrs:
        sc = nbrs[(train_key, primary.name)].score.double()
        key = -sc if primary.higher_is_better else sc
        order = torch.sort(key, stable=True).indices
        rank = torch.empty(m, dtype=torch.int64)
        rank[order] = torch.arange(1, m + 1)
        for r, v in zip(rows, rank.tolist(), strict=True):
            r["train_rank"] = v

    # Haim protocol against the training set, three duplicate policies
    haim = None
    if train_key in refs:
        train = refs[train_key]
        variants = {}
        for a in ("greedy", "hungarian", "independent"):
            variants[a] = haim_protocol(raw, train, assignment=a, window=window, thresholds=thresholds)
        haim = variants[assignment] if assignment in variants else haim_protocol(
            raw, train, assignment=assignment, window=window, thresholds=thresholds)
        assigned = torch.full((m,), -1, dtype=torch.int64)
        ok = haim.candidate_index >= 0
        assigned[haim.candidate_index[ok]] = torch.nonzero(ok).view(-1)
        for r, v in zip(rows, assigned.tolist(), strict=True):
            r["haim_train_index"] = v
        per_train = {"candidate_index": haim.candidate_index.tolist(),
                     "ssim": [_finite(v) for v in haim.ssim.tolist()],
                     "ncc": [_finite(v) for v in haim.ncc.tolist()]}
        if margins is not None:
            mg = torch.as_tensor(margins, dtype=torch.float64).reshape(-1)
            if mg.shape[0] != train.shape[0]:
                raise DataReconError(f"margins has {mg.shape[0]} values for {train.shape[0]} training images")
            per_train["margin"] = mg.tolist()
        summary["haim"] = {
            "assignment": haim.assignment,
            "counts": {str(k): v for k, v in haim.counts.items()},
            "counts_by_assignment": {a: {str(k): v for k, v in r.counts.items()} for a, r in variants.items()},
            "mean_ssim": _finite(float(torch.nanmean(haim.ssim))) if haim.ssim.numel() else None,
            "sorted_ssim": _curve(haim.ssim),
            "per_train": per_train,
        }

    # null baselines
    if baselines and train_key in refs:
        held = refs.get(heldout_key)
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        b1 = null_baselines(haim_ssim_against(refs[train_key], assignment=assignment, window=window),
                            raw, heldout=held, generator=gen, name="haim_ssim")
        gen = generator if generator is not None else torch.Generator().manual_seed(1)
        b2 = null_baselines(best_similarity_to(refs[train_key], metric=primary.name, **search),
                            cands, heldout=held, generator=gen, name=f"best_{primary.name}_to_train")
        n_train = refs[train_key].shape[0]
        for who, n in (("candidates", m), ("heldout", 0 if held is None else held.shape[0]), ("noise", m)):
            if n and not is_exact(n, n_train, metric=primary.name, prefilter=prefilter, top_k=top_k,
                                  exact_up_to=exact_up_to):
                approximate.append(f"baselines.best_{primary.name}_to_train ({who}): best of a top-{top_k} "
                                   f"{prefilter} shortlist")
        summary["baselines"] = {
            "haim_ssim": {**b1.summary(thresholds),
                          "curves": {"real": _curve(b1.real), "heldout": _curve(b1.heldout),
                                     "noise": _curve(b1.noise)}},
            f"best_{primary.name}_to_train": b2.summary(thresholds),
        }
        summary["headline"] = headline(b1, n_candidates=m, n_heldout=0 if held is None else int(held.shape[0]),
                                       paper_threshold=PAPER_THRESHOLD)

    # privacy: real/fake ground truth and attacker-side scores
    real = None
    priv: dict[str, PrivacyScore] = {}
    if isinstance(real_floor, str):
        if real_floor != "noise":
            raise DataReconError(f"real_floor must be 'noise', a number or None, got {real_floor!r}")
        floor = None
        if train_key in refs and n_floor_noise > 0:
            stat = best_similarity_to(refs[train_key], metric=primary.name, **search)
            if not is_exact(n_floor_noise, refs[train_key].shape[0], metric=primary.name, prefilter=prefilter,
                            top_k=top_k, exact_up_to=exact_up_to):
                approximate.append(f"privacy.floor: best of a top-{top_k} {prefilter} shortlist")
            nz = stat(noise_images(n_floor_noise, raw.shape[1:], dtype=cands.dtype,
                                   generator=torch.Generator().manual_seed(12345)))
            floor = float(nz.max() if primary.higher_is_better else nz.min())
    else:
        floor = None if real_floor is None else float(real_floor)
    if (train_key, primary.name) in nbrs and (heldout_key, primary.name) in nbrs:
        real = real_labels(nbrs[(train_key, primary.name)].score, nbrs[(heldout_key, primary.name)].score,
                           higher_is_better=primary.higher_is_better, floor=floor)
        for r, v in zip(rows, real.tolist(), strict=True):
            r["real"] = int(v)
        priv = privacy_report(real, scores, min_class_size=min_class_size) if scores else {}
        summary["privacy"] = {
            "rule": REAL_RULE.format(metric=primary.name),
            "floor": floor, "floor_source": (f"best of {n_floor_noise} uniform-noise images" if real_floor == "noise"
                             else "given" if real_floor is not None else "none"),
            "n_real": int(real.sum()), "n_fake": int((~real).sum()),
            "fprs": list(LOW_FPRS),
            # the bootstrap CI only where the AUC itself is measurable (both classes >= min_class_size)
            "scores": {k: {**v.summary(),
                           "auc_ci_95": bootstrap_auc_ci(real, scores[k], generator=0) if v.measurable else None}
                       for k, v in priv.items()},
            "min_class_size": min_class_size,
            "roc": {k: {"fpr": v.fpr.tolist(), "tpr": v.tpr.tolist()} for k, v in priv.items() if v.measurable},
        }
    else:
        summary["privacy"] = {"note": f"no {heldout_key!r} or {train_key!r} reference set: real/fake labels not computed"}
    for k, v in scores.items():
        for r, s in zip(rows, torch.as_tensor(v).reshape(-1).tolist(), strict=True):
            r[f"score_{k}"] = s

    summary["approximate"] = approximate
    c = collapse(cands, metric=collapse_metric, window=window)
    summary["collapse"] = {"metric": c.metric, "threshold": c.threshold,
                           "fraction_pairs": _finite(c.fraction_pairs),
                           "fraction_candidates": _finite(c.fraction_candidates),
                           "n_pairs": c.n_pairs, "n_close": c.n_close}
    return Evaluation(summary=summary, rows=rows, neighbours=nbrs, haim=haim, privacy=priv, real=real)


def headline(b: Baselines, *, n_candidates: int, n_heldout: int, paper_threshold: float = 0.4,
             rate: float = NULL_RATE) -> dict[str, Any]:
    """The run's headline: training images reconstructed, beside the null baselines.

    Two criteria on the Haim-protocol SSIM per training image: the null-calibrated threshold
    (:func:`~datarecon.evaluation.baselines.null_calibrated`, held-out images as candidates)
    and the papers' fixed ``paper_threshold``; each with the held-out and noise counts.

    Args:
        b: The Haim-SSIM baselines (``real``, ``heldout``, ``noise`` per training image).
        n_candidates: The attack's candidate count ``m``.
        n_heldout: Held-out images used as null candidates (0: none).
        paper_threshold: The fixed SSIM threshold of the papers.
        rate: See :func:`~datarecon.evaluation.baselines.null_calibrated`.

    Returns:
        JSON-ready dict: ``n_train``, ``paper`` (``threshold``, ``count``, ``heldout``, ``noise``),
        ``calibrated`` (the same plus ``rate``, ``allowed``; None without held-out images) and
        ``notes``.
    """
    others = {"noise": b.noise} if b.noise is not None else {}

    def fixed(v: Tensor | None) -> int | None:
        return None if v is None else counts_at(v, (paper_threshold,))[float(paper_threshold)]

    out: dict[str, Any] = {
        "statistic": "Haim-protocol SSIM per training image", "n_train": int(b.real.numel()),
        "n_candidates": int(n_candidates), "n_heldout_candidates": int(n_heldout),
        "paper": {"threshold": float(paper_threshold), "count": fixed(b.real), "heldout": fixed(b.heldout),
                  "noise": fixed(b.noise)},
        "calibrated": None, "notes": [],
    }
    if b.heldout is None:
        out["notes"].append("no held-out images: the null-calibrated count is not measurable")
        return out
    c = null_calibrated(b.real, b.heldout, others=others, rate=rate)
    out["calibrated"] = {"threshold": c.threshold, "rate": c.rate, "allowed": c.allowed, "count": c.count,
                         "heldout": c.null, "noise": c.others.get("noise")}
    if 0 < n_heldout < n_candidates:
        out["notes"].append(f"the held-out null has {n_heldout} candidates, the attack {n_candidates}: "
                            "fewer null candidates lower the threshold and flatter the attack")
    return out


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
    if out.ndim == 1 or out.shape[-1] == 1:
        return out.reshape(-1).double() * y.double().reshape(-1)
    yi = y.long().reshape(-1)
    true = out.gather(1, yi.view(-1, 1)).squeeze(1)
    other = out.clone()
    other.scatter_(1, yi.view(-1, 1), -math.inf)
    return (true - other.max(dim=1).values).double()


def evaluate_run(run_dir: str | Path, *, against: Sequence[str] = ("train", "partition", "noise", "heldout"),
                 data_dir: str | Path | None = None, metric: str = "ssim", prefilter: str | None = "lncc",
                 top_k: int = 32, exact_up_to: int = EXACT_UP_TO, window: str = "gaussian",
                 thresholds: Sequence[float] = DEFAULT_THRESHOLDS, assignment: str = "greedy",
                 seed: int = 0, allow_incomplete: bool = False, write: bool = True,
                 grid_max: int = 64, progress: bool = True) -> dict[str, Any]:
    """Evaluate a run directory against the ground truth; write metrics and a table.

    Args:
        run_dir: Run directory (``candidates.safetensors``, ``run.json``).
        against: Reference sets: any of ``train``, ``partition``, ``heldout``
            (from the model's data spec) and ``noise`` (uniform images in
            ``[0, 1]``, as many as training images, seeded by ``seed``).
        data_dir: Data folder for :func:`datarecon.data.load_task`.
        metric, prefilter, top_k, exact_up_to, window, thresholds, assignment: See
            :func:`evaluate_candidates`.
        seed: Seed of the noise reference set and the noise baselines.
        allow_incomplete: Evaluate runs that did not finish (status other than ``complete`` or
            ``stopped-early``: ``running``, ``diverged``).
        write: Write ``metrics.json``, ``candidates.csv`` and ``neighbours.safetensors``.
        grid_max: Candidates stored for the report's neighbour grids.
        progress: Show progress bars.

    Returns:
        The summary dict (the content of ``metrics.json``).

    Raises:
        CheckpointError: missing run files or model directory.
        DataReconError: unknown reference set name, shape mismatch, run not complete.
    """
    from datarecon.data import DataSpec, Normalisation, load_task
    from datarecon.models.checkpoint import load_model_dir

    run_dir = Path(run_dir)
    valid = ("train", "partition", "heldout", "noise")
    bad = [a for a in against if a not in valid]
    if bad:
        raise DataReconError(f"unknown reference set(s) {bad}; valid names: {', '.join(valid)}")
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} not found; run an attack with `datarecon reconstruct`")
    if (run_dir / "model.json").is_file() and not (run_dir / "run.json").is_file():
        raise CheckpointError(f"{run_dir} is a model directory, not a run directory; attack it with `datarecon "
                              f"reconstruct --model {run_dir} --out RUN` and evaluate RUN")
    for name in ("run.json", "candidates.safetensors"):
        if not (run_dir / name).is_file():
            raise CheckpointError(f"{run_dir} is incomplete: {name} is missing; finish the run (`datarecon "
                                  "reconstruct ... --resume`) or evaluate another run directory")
    meta = read_json(run_dir / "run.json")
    status = meta.get("status", "complete")
    if status not in EVALUABLE and not allow_incomplete:
        raise DataReconError(f"run {run_dir} has status {status!r}; finish it (`datarecon reconstruct ... --resume`) "
                             "or pass --allow-incomplete (allow_incomplete=True in Python)")
    tensors = load_tensors(run_dir / "candidates.safetensors")
    if "x" not in tensors:
        raise CheckpointError(f"{run_dir / 'candidates.safetensors'} has no 'x' tensor; re-create the run")
    x = tensors["x"].detach()
    m = x.shape[0]
    for k in ("labels", "multipliers"):
        if k in tensors and tensors[k].reshape(-1).shape[0] != m:
            raise CheckpointError(f"{run_dir / 'candidates.safetensors'}: {k} has {tensors[k].numel()} values for {m} candidates")
    scores = {k[len("score_"):]: v.reshape(-1) for k, v in tensors.items() if k.startswith("score_")}

    model_dir = _resolve_model_dir(run_dir, meta.get("model_dir"))
    bundle = load_model_dir(model_dir)
    spec = DataSpec.model_validate(bundle.data)
    task = load_task(spec, data_dir=data_dir)
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    if "train" in bundle.indices and not torch.equal(bundle.indices["train"].long(), task.train.indices.long()):
        raise CheckpointError(f"training indices of {model_dir} differ from the data spec's selection; stale model or data")
    if tuple(x.shape[1:]) != tuple(task.input_shape):
        raise DataReconError(f"candidates have shape {tuple(x.shape[1:])}, the model expects {tuple(task.input_shape)}")
    display = norm.to_display(x.float())

    refs: dict[str, Tensor] = {}
    for a in against:
        if a == "noise":
            refs["noise"] = noise_images(len(task.train), task.input_shape,
                                         generator=torch.Generator().manual_seed(seed))
        else:
            refs[a] = getattr(task, a).x
    margins = _margins(bundle, norm.to_model(task.train.x), task.train.y) if "train" in refs else None
    ev = evaluate_candidates(
        display, tensors.get("labels"), scores, references=refs, metric=metric, prefilter=prefilter,
        top_k=top_k, exact_up_to=exact_up_to, window=window, thresholds=thresholds, assignment=assignment,
        multipliers=tensors.get("multipliers"), margins=margins,
        generator=torch.Generator().manual_seed(seed), progress=progress,
    )
    summary = dict(ev.summary)
    extra = meta.get("extra") or {}
    summary["param_distance"] = extra.get("param_distance")
    summary["run"] = {"run_dir": str(run_dir), "model_dir": str(model_dir), "method": meta.get("method"),
                      "status": status, "steps_done": meta.get("steps_done"), "seed": meta.get("seed"),
                      "config": meta.get("config"), "data": bundle.data, "arch": bundle.arch.model_dump(mode="json")}
    if write:
        atomic_write_json(run_dir / METRICS_FILE, summary)
        write_csv(run_dir / CANDIDATES_CSV, ev.rows)
        _write_neighbour_images(run_dir / NEIGHBOURS_FILE, ev, display.clamp(0, 1), refs, metric, grid_max)
    return summary


def _write_neighbour_images(path: Path, ev: Evaluation, cands: Tensor, refs: Mapping[str, Tensor],
                            metric: str, grid_max: int) -> None:
    """Save the ``grid_max`` best-matched candidates with their nearest train/partition images."""
    out: dict[str, Tensor] = {}
    key = ("train", metric)
    if key in ev.neighbours:
        nb = ev.neighbours[key]
        s = nb.score.double()
        order = torch.sort(-s if nb.higher_is_better else s, stable=True).indices[:grid_max]
    else:
        order = torch.arange(min(grid_max, cands.shape[0]))
    out["order"] = order
    out["candidates"] = cands[order].float()
    for name in ("train", "partition"):
        if (name, metric) in ev.neighbours:
            nb = ev.neighbours[(name, metric)]
            out[f"{name}_index"] = nb.index[order]
            out[f"{name}_score"] = nb.score[order].float()
            out[name] = refs[name][nb.index[order]].float()
    save_tensors(path, out, metadata={"metric": metric})
