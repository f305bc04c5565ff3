"""The pieces of an evaluation as pure reports, each with its settings and named seeds.

:func:`datarecon.evaluation.evaluation_of` (tensors in) and :func:`datarecon.evaluation.run_metrics`
(a run directory in) assemble these; nothing here reads or writes files.

* :func:`neighbour_report`: nearest image of each reference set per candidate (primary metric
  and L2), the sorted-similarity summaries, the rank of each candidate's best training match.
* :func:`protocol_report`: the Haim et al. (2022) protocol against the training set, three
  duplicate policies (greedy, Hungarian, independent).
* :func:`baseline_report`: held-out and uniform-noise images as null candidates, and the
  run's headline (counts beside those nulls).
* :func:`privacy_section`: real/fake labels (nearest train vs nearest held-out, above a noise
  floor) and ROC AUC / TPR at low FPR of each attacker-side score.
* :func:`collapse_report`: near-duplicate candidates.

Randomness is explicit and named in :class:`EvaluationConfig`: ``noise_seed`` (the noise
reference set of :func:`~datarecon.evaluation.evaluation_of`), ``baseline_seed`` (noise candidates of
the Haim-SSIM null; ``baseline_seed + 1`` for the nearest-similarity null), ``floor_seed`` (the
noise images that set the real/fake floor) and ``bootstrap_seed`` (the AUC confidence interval).

References:
    Haim et al. (2022) section 5; Runkel et al. (2024) sections 4-5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from datarecon.errors import DataReconError
from datarecon.evaluation.baselines import (
    HEADLINE_RULES,
    INIT_MARGIN,
    NULL_RATE,
    PAPER_THRESHOLD,
    Baselines,
    best_similarity_to,
    haim_ssim_against,
    noise_images,
    null_baselines,
    init_rule_mask,
    null_calibrated,
    retention,
    summarise,
)
from datarecon.evaluation.neighbours import EXACT_UP_TO, METRICS, NeighbourSearch, Neighbours, is_exact, nearest_neighbours
from datarecon.evaluation.privacy import (
    LOW_FPRS,
    MIN_CLASS_SIZE,
    NEGATIVE,
    POSITIVE,
    PrivacyScore,
    bootstrap_auc_ci,
    privacy_report,
    real_labels,
)
from datarecon.evaluation.protocol import DEFAULT_THRESHOLDS, HaimResult, HaimSettings, collapse, haim_protocol
from datarecon.kernel.engine import track
from datarecon.config import MAX_SEED

#: duplicate policies of the Haim protocol that every evaluation reports
HAIM_ASSIGNMENTS = ("greedy", "hungarian", "independent")

REAL_RULE = (
    "a candidate is a positive iff its nearest training image (by {metric}) is closer than every "
    "held-out image (best-train similarity > best-held-out similarity; ties are negatives) and "
    "its best-train similarity beats the floor (if any)"
)


class EvaluationConfig(BaseModel):
    """Settings of an evaluation (one-to-one with a YAML/TOML mapping).

    Attributes:
        metric: primary metric (``METRICS`` key) of the neighbours and the real/fake rule.
        prefilter, top_k, exact_up_to, window: nearest-neighbour search (see
            :func:`~datarecon.evaluation.neighbours.nearest_neighbours`): exhaustive up to
            ``exact_up_to`` candidate-reference pairs, else the best of a ``top_k`` shortlist.
        thresholds: SSIM thresholds of the Haim counts.
        assignment: duplicate policy of the main Haim result (all three are reported).
        collapse_metric: ``l2`` (cheap) or ``ssim`` (M² SSIMs).
        real_floor: floor of the real/fake rule: ``noise`` (the best similarity to the training set
            reached by any of ``n_floor_noise`` uniform-noise images), a number, or None.
        n_floor_noise: noise images of the ``noise`` floor.
        min_class_size: fewest real and fake candidates for a measurable ROC.
        baselines: compute the held-out and noise null baselines.
        noise_seed: seed of the uniform-noise reference set built by ``evaluation_of(noise=N)``.
        baseline_seed: seed of the noise candidates of the Haim-SSIM null (+1: nearest-similarity null).
        floor_seed: seed of the noise images of the real/fake floor.
        bootstrap_seed: seed of the AUC bootstrap.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    metric: str = "ssim"
    prefilter: str | None = "lncc"
    top_k: int = Field(default=32, ge=1)
    exact_up_to: int = Field(default=EXACT_UP_TO, ge=0)
    window: str = "gaussian"
    thresholds: tuple[float, ...] = tuple(DEFAULT_THRESHOLDS)
    assignment: str = "greedy"
    collapse_metric: Literal["l2", "ssim"] = "l2"
    real_floor: float | Literal["noise"] | None = "noise"
    n_floor_noise: int = Field(default=1000, ge=0)
    min_class_size: int = Field(default=MIN_CLASS_SIZE, ge=1)
    baselines: bool = True
    noise_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    baseline_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    floor_seed: int = Field(default=12345, ge=0, le=MAX_SEED)
    bootstrap_seed: int = Field(default=0, ge=0, le=MAX_SEED)

    def search(self) -> NeighbourSearch:
        """The nearest-neighbour search these settings describe (the SSIM window is :attr:`window`)."""
        return NeighbourSearch(prefilter=self.prefilter, top_k=self.top_k, exact_up_to=self.exact_up_to)


def finite_or_none(x: float | None) -> float | None:
    """NaN → None (JSON ``null``: undefined)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def sorted_curve(t: Tensor | None) -> list[float | None] | None:
    """Values sorted descending, NaN last as None (the sorted-SSIM curves)."""
    if t is None:
        return None
    s = torch.sort(torch.nan_to_num(t.double(), nan=-math.inf), descending=True).values
    return [None if math.isinf(v) else float(v) for v in s.tolist()]


@dataclass(frozen=True)
class NeighbourReport:
    """Result of :func:`neighbour_report`.

    Attributes:
        neighbours: ``{(set, metric): Neighbours}``, the primary metric first, then SSIM / L2.
        summary: ``{"nearest": {set: {metric: stats}}, "mean_l2_to_nearest": {set: float}}``.
        columns: per-candidate columns (``<set>_<metric>``, ``<set>_<metric>_index``, ``train_rank``).
        approximate: notes on searches that were not exhaustive.
    """

    neighbours: dict[tuple[str, str], Neighbours]
    summary: dict[str, Any]
    columns: dict[str, list[Any]]
    approximate: list[str] = field(default_factory=list)


def neighbour_report(cands: Tensor, refs: Mapping[str, Tensor], config: EvaluationConfig, *,
                     train_key: str = "train", progress: bool = False) -> NeighbourReport:
    """Nearest image of each reference set per candidate, by the primary metric and by L2.

    Args:
        cands: ``(M, C, H, W)`` display-space candidates clamped to ``[0, 1]``.
        refs: ``{name: (R, C, H, W)}`` non-empty reference sets in ``[0, 1]``.
        config: the search settings.
        train_key: the training set's name (its ranks become ``train_rank``).
        progress: show a progress bar.
    """
    primary = METRICS.get(config.metric)
    m = cands.shape[0]
    metrics = [primary.name] + [x for x in ("ssim", "l2") if x != primary.name]
    nbrs: dict[tuple[str, str], Neighbours] = {}
    nearest: dict[str, dict[str, Any]] = {}
    columns: dict[str, list[Any]] = {}
    approximate: list[str] = []
    jobs = [(s, mm) for s in refs for mm in metrics]
    for s, mm in track(jobs, desc="nearest neighbours", unit="search", mode=progress):
        nb = nearest_neighbours(cands, refs[s], metric=mm, search=config.search(), window=config.window)
        nbrs[(s, mm)] = nb
        nearest.setdefault(s, {})[mm] = {**summarise(nb.score, config.thresholds if mm == "ssim" else ()),
                                         "exact": nb.exact}
        if not nb.exact:
            approximate.append(f"nearest.{s}.{mm}: best of a top-{nb.top_k} {nb.prefilter} shortlist "
                               f"({m} x {refs[s].shape[0]} pairs > exact_up_to)")
        columns[f"{s}_{mm}_index"] = nb.index.tolist()
        columns[f"{s}_{mm}"] = nb.score.tolist()
    if (train_key, primary.name) in nbrs:  # rank of each candidate's best training similarity
        sc = nbrs[(train_key, primary.name)].score.double()
        order = torch.sort(-sc if primary.higher_is_better else sc, stable=True).indices
        rank = torch.empty(m, dtype=torch.int64)
        rank[order] = torch.arange(1, m + 1)
        columns["train_rank"] = rank.tolist()
    # landscape quantity (Runkel Fig. 10-12): mean L2 to the nearest image of each set
    summary = {"nearest": nearest, "mean_l2_to_nearest": {s: nearest[s]["l2"]["mean"] for s in nearest}}
    return NeighbourReport(neighbours=nbrs, summary=summary, columns=columns, approximate=approximate)


def protocol_report(raw: Tensor, train: Tensor, config: EvaluationConfig, *,
                    margins: Tensor | None = None) -> tuple[HaimResult, dict[str, Any], list[int]]:
    """The Haim protocol against the training set, under every duplicate policy.

    Args:
        raw: ``(M, C, H, W)`` display-space candidates (any range; min-max rescaled per image).
        train: ``(N, C, H, W)`` training images in ``[0, 1]``.
        config: thresholds, window and the main ``assignment``.
        margins: ``(N,)`` output margin of each training image (recorded per image), or None.

    Returns:
        (main result, the ``haim`` summary, per candidate the training image assigned to it or −1).

    Raises:
        DataReconError: ``margins`` of the wrong length.
    """
    def settings(assignment: str) -> HaimSettings:
        return HaimSettings(assignment=assignment, window=config.window, thresholds=config.thresholds)

    variants = {a: haim_protocol(raw, train, settings(a)) for a in HAIM_ASSIGNMENTS}
    haim = variants.get(config.assignment) or haim_protocol(raw, train, settings(config.assignment))
    assigned = torch.full((raw.shape[0],), -1, dtype=torch.int64)
    ok = haim.candidate_index >= 0
    assigned[haim.candidate_index[ok]] = torch.nonzero(ok).view(-1)
    per_train: dict[str, Any] = {"candidate_index": haim.candidate_index.tolist(),
                                 "ssim": [finite_or_none(v) for v in haim.ssim.tolist()],
                                 "ncc": [finite_or_none(v) for v in haim.ncc.tolist()]}
    if margins is not None:
        mg = torch.as_tensor(margins, dtype=torch.float64).reshape(-1)
        if mg.shape[0] != train.shape[0]:
            raise DataReconError(f"margins has {mg.shape[0]} values for {train.shape[0]} training images")
        per_train["margin"] = mg.tolist()
    summary = {
        "assignment": haim.assignment,
        "counts": {str(k): v for k, v in haim.counts.items()},
        "counts_by_assignment": {a: {str(k): v for k, v in r.counts.items()} for a, r in variants.items()},
        "mean_ssim": finite_or_none(float(torch.nanmean(haim.ssim))) if haim.ssim.numel() else None,
        "sorted_ssim": sorted_curve(haim.ssim),
        "per_train": per_train,
    }
    return haim, summary, assigned.tolist()


def baseline_report(raw: Tensor, cands: Tensor, train: Tensor, heldout: Tensor | None,
                    config: EvaluationConfig, *, haim: HaimResult | None = None, rule: str = "standard",
                    init_ssim: Tensor | None = None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Held-out images and uniform noise as null candidates, and the headline beside them.

    Args:
        raw: ``(M, C, H, W)`` display-space candidates (for the Haim-SSIM statistic).
        cands: the same clamped to ``[0, 1]`` (for the nearest-similarity statistic).
        train: ``(N, C, H, W)`` training images.
        heldout: ``(K, C, H, W)`` held-out images, or None; with K > M a seeded draw of M of them
            (``baseline_seed`` + 2) is the null, so that it attacks with as many candidates as the run.
        config: search settings, thresholds and ``baseline_seed``.
        haim: the protocol result of the candidates (its matches feed the init rule), or None.
        rule: the headline rule (:func:`~datarecon.evaluation.baselines.headline_rule`).
        init_ssim: ``(M,)`` each candidate's SSIM to its own initial image (rules ``init-shift`` and
            ``retention``), or None.

    Returns:
        (the ``baselines`` summary, the ``headline``, notes on approximate searches).
    """
    primary = METRICS.get(config.metric)
    m = raw.shape[0]
    n_available = 0 if heldout is None else int(heldout.shape[0])
    if heldout is not None and n_available > m:  # the null attacks with as many candidates as the attack
        pick = torch.randperm(n_available, generator=torch.Generator().manual_seed(config.baseline_seed + 2))[:m]
        heldout = heldout[pick.sort().values]
    b1 = null_baselines(haim_ssim_against(train, HaimSettings(assignment=config.assignment, window=config.window)),
                        raw, heldout=heldout, generator=torch.Generator().manual_seed(config.baseline_seed),
                        name="haim_ssim")
    b2 = null_baselines(best_similarity_to(train, metric=primary.name, search=config.search(), window=config.window),
                        cands, heldout=heldout,
                        generator=torch.Generator().manual_seed(config.baseline_seed + 1),
                        name=f"best_{primary.name}_to_train")
    approximate = []
    n_held = 0 if heldout is None else int(heldout.shape[0])
    for who, n in (("candidates", m), ("heldout", n_held), ("noise", m)):
        if n and not is_exact(n, train.shape[0], metric=primary.name, search=config.search()):
            approximate.append(f"baselines.best_{primary.name}_to_train ({who}): best of a top-{config.top_k} "
                               f"{config.prefilter} shortlist")
    summary = {
        "haim_ssim": {**b1.summary(config.thresholds),
                      "curves": {"real": sorted_curve(b1.real), "heldout": sorted_curve(b1.heldout),
                                 "noise": sorted_curve(b1.noise)}},
        f"best_{primary.name}_to_train": b2.summary(config.thresholds),
    }
    head = headline(b1, n_candidates=m, n_heldout=n_held, rule=rule, init_ssim=init_ssim,
                    candidate_index=None if haim is None else haim.candidate_index,
                    settings=HeadlineSettings(paper_threshold=PAPER_THRESHOLD))
    head["n_heldout_available"] = n_available
    head["reference_scoring"] = reference_scoring(raw, train, heldout, seed=config.baseline_seed + 3)
    if n_available > m:
        head.setdefault("notes", []).append(f"the held-out null uses {m} of the {n_available} held-out images "
                                            "(a seeded draw), as many as the attack's candidates")
    return summary, head, approximate


#: The reference code's scoring (Haim et al. 2022; Buzaglo et al. 2023): its SSIM window and matching.
REFERENCE_WINDOW, REFERENCE_ASSIGNMENT = "box3", "independent"


def reference_scoring(raw: Tensor, train: Tensor, heldout: Tensor | None, *, seed: int) -> dict[str, Any]:
    """The count as the papers' code scores it, beside the same scoring of the held-out and noise nulls.

    Each training image's best candidate by NCC on 2× downsampled images (a candidate may be the best of several
    training images), the candidate min-max scaled, SSIM with a uniform 3×3 window, "reconstructed" above the
    papers' 0.4 — so that a count compares with the papers' tables; the headline's own rule is stricter
    (one-to-one matching, the Gaussian window, a threshold the held-out null sets).

    Args:
        raw: (M, C, H, W) display-space candidates (a pooled run's are the pool of its runs).
        train: (N, C, H, W) training images; heldout: the held-out null's candidates, or None.
        seed: seed of the noise null.
    """
    b = null_baselines(haim_ssim_against(train, HaimSettings(assignment=REFERENCE_ASSIGNMENT, window=REFERENCE_WINDOW)),
                       raw, heldout=heldout, generator=torch.Generator().manual_seed(seed), name="reference_ssim")
    return {"window": REFERENCE_WINDOW, "assignment": REFERENCE_ASSIGNMENT, "threshold": PAPER_THRESHOLD,
            "count": _fixed_count(b.real, PAPER_THRESHOLD), "heldout": _fixed_count(b.heldout, PAPER_THRESHOLD),
            "noise": _fixed_count(b.noise, PAPER_THRESHOLD),
            "mean_ssim": finite_or_none(float(torch.nanmean(torch.as_tensor(b.real, dtype=torch.float64))))}


@dataclass(frozen=True)
class HeadlineSettings:
    """The numbers of the headline rule (:func:`headline`).

    Attributes:
        paper_threshold: The papers' fixed SSIM threshold, the floor of the headline threshold.
        rate: Fraction of the training images the held-out null may pass (see
            :func:`~datarecon.evaluation.baselines.null_calibrated`), in ``[0, 1)``.
        margin: SSIM margin of the ``init-shift`` rule (see
            :data:`~datarecon.evaluation.baselines.INIT_MARGIN`).
    """

    paper_threshold: float = PAPER_THRESHOLD
    rate: float = NULL_RATE
    margin: float = INIT_MARGIN


def headline(b: Baselines, *, n_candidates: int, n_heldout: int, rule: str = "standard",
             init_ssim: Tensor | None = None, candidate_index: Tensor | None = None,
             settings: HeadlineSettings = HeadlineSettings()) -> dict[str, Any]:
    """The run's headline: training images reconstructed, beside the null baselines (one rule for every report).

    A training image counts when the Haim-protocol SSIM of its matched candidate exceeds
    ``max(paper_threshold, t)``, ``t`` the threshold that held-out images used as the candidates
    (as many as the attack's m) pass for at most ``rate`` of the training images
    (:func:`~datarecon.evaluation.baselines.null_calibrated`); the held-out and noise counts at the
    same threshold stand beside it. By ``rule``
    (:func:`~datarecon.evaluation.baselines.headline_rule`):

    * ``standard``: that count;
    * ``init-shift`` (partition and mixture starts): only matches whose SSIM exceeds their
      candidate's SSIM to its own initial image by ``margin`` count
      (:func:`~datarecon.evaluation.baselines.init_rule_mask`), also in the fixed-threshold count;
    * ``retention`` (ground-truth starts): no count (``count`` None); ``retention`` says how many
      candidates stay at their initial training image (SSIM to it above the threshold).

    Args:
        b: The Haim-SSIM baselines (``real``, ``heldout``, ``noise`` per training image).
        n_candidates: The attack's candidate count ``m``.
        n_heldout: Held-out images used as null candidates (0: none).
        rule: ``standard``, ``init-shift`` or ``retention`` (:data:`~datarecon.evaluation.baselines.HEADLINE_RULES`).
        init_ssim: ``(M,)`` each candidate's SSIM to its own initial image (needed by ``init-shift``
            and ``retention``; without it those rules give no count and say why).
        candidate_index: ``(N,)`` the matched candidate of each training image (``init-shift``).
        settings: :class:`HeadlineSettings` (``paper_threshold``, ``rate``, ``margin``).

    Returns:
        JSON-ready dict: ``rule``, ``rule_text``, ``threshold`` (applied), ``count`` (None: no count
        under this rule or without a null), ``heldout``, ``noise`` (null counts at ``threshold``),
        ``retention``, ``n_train``, ``n_candidates``, ``n_heldout_candidates``, ``paper``
        (``threshold``, ``count``, ``heldout``, ``noise``), ``calibrated`` (``threshold``,
        ``null_threshold``, ``floor``, ``rate``, ``allowed``, ``count``, ``heldout``, ``noise``,
        ``excluded``; None without held-out images) and ``notes``.

    Raises:
        DataReconError: an unknown ``rule``.
    """
    if rule not in HEADLINE_RULES:
        raise DataReconError(f"unknown headline rule {rule!r}; valid rules: {', '.join(HEADLINE_RULES)}")
    paper_threshold = settings.paper_threshold
    others = {"noise": b.noise} if b.noise is not None else {}
    eligible, notes = _init_shift_eligible(b.real, rule, init_ssim, candidate_index, margin=settings.margin)
    unmeasurable = rule == "init-shift" and eligible is None
    out: dict[str, Any] = {
        "statistic": "Haim-protocol SSIM per training image", "rule": rule,
        "rule_text": HEADLINE_RULES[rule].format(margin=settings.margin), "n_train": int(b.real.numel()),
        "n_candidates": int(n_candidates), "n_heldout_candidates": int(n_heldout),
        "threshold": None, "count": None, "heldout": None, "noise": None, "retention": None,
        "paper": {"threshold": float(paper_threshold),
                  "count": None if unmeasurable else _fixed_count(b.real, paper_threshold, eligible),
                  "heldout": _fixed_count(b.heldout, paper_threshold), "noise": _fixed_count(b.noise, paper_threshold)},
        "calibrated": None, "notes": notes,
    }
    if b.heldout is None:
        notes.append("no held-out images: no null beside the count, so no count is given (the papers' fixed "
                     f"SSIM > {paper_threshold:g} count is shown without its null)")
    else:
        c = null_calibrated(b.real, b.heldout, others=others, rate=settings.rate, floor=paper_threshold,
                            eligible=eligible)
        out["calibrated"] = {"threshold": c.threshold, "null_threshold": c.null_threshold, "floor": c.floor,
                             "rate": c.rate, "allowed": c.allowed, "count": None if unmeasurable else c.count,
                             "heldout": c.null, "noise": c.others.get("noise"), "excluded": c.excluded}
        out.update(threshold=c.threshold, heldout=c.null, noise=c.others.get("noise"))
        if rule != "retention" and not unmeasurable:
            out["count"] = c.count
        if 0 < n_heldout < n_candidates:
            notes.append(f"the held-out null has {n_heldout} candidates, the attack {n_candidates}: "
                         "fewer null candidates lower the threshold and flatter the attack")
    if rule == "retention":
        thr = out["threshold"] if out["threshold"] is not None else float(paper_threshold)
        out["retention"], more = _retention_summary(init_ssim, thr)
        notes.extend(more)
    return out


def _init_shift_eligible(real: Tensor, rule: str, init_ssim: Tensor | None, candidate_index: Tensor | None, *,
                         margin: float) -> tuple[Tensor | None, list[str]]:
    """The training images the ``init-shift`` rule lets count (``(N,)`` bool; None under another rule or
    without the initial images) and the notes on why no count can be given."""
    if rule != "init-shift":
        return None, []
    if init_ssim is None or candidate_index is None:
        return None, ["the initial images of this data-initialised run were not recorded: its candidates cannot "
                      "be told apart from their starting images, so no count is given; rerun the attack"]
    return init_rule_mask(real, init_ssim, candidate_index, margin=margin), []


def _fixed_count(v: Tensor | None, threshold: float, ok: Tensor | None = None) -> int | None:
    """How many of ``v`` exceed the fixed ``threshold`` (NaN: not), only among ``ok`` when given; None without ``v``."""
    if v is None:
        return None
    s = torch.nan_to_num(torch.as_tensor(v, dtype=torch.float64), nan=-math.inf) > threshold
    return int((s & ok).sum()) if ok is not None else int(s.sum())


def _retention_summary(init_ssim: Tensor | None, threshold: float) -> tuple[dict[str, Any] | None, list[str]]:
    """The ``retention`` entry of a ground-truth-initialised run (None without its initial images) and notes."""
    if init_ssim is None:
        return None, ["the initial images of this ground-truth-initialised run were not recorded: retention "
                      "cannot be measured; rerun the attack"]
    return {"count": retention(init_ssim, threshold), "of": int(torch.as_tensor(init_ssim).numel()),
            "threshold": threshold}, []


def real_floor(train: Tensor | None, config: EvaluationConfig, *, image_shape: Sequence[int],
               dtype: torch.dtype) -> tuple[float | None, list[str]]:
    """The floor of the real/fake rule and notes on an approximate search.

    ``noise``: the best primary-metric similarity to ``train`` reached by any of ``n_floor_noise``
    uniform-noise images drawn with ``floor_seed``; a number: itself; None: no floor.
    """
    if config.real_floor != "noise":
        return (None if config.real_floor is None else float(config.real_floor)), []
    if train is None or config.n_floor_noise <= 0:
        return None, []
    primary = METRICS.get(config.metric)
    stat = best_similarity_to(train, metric=primary.name, search=config.search(), window=config.window)
    notes = []
    if not is_exact(config.n_floor_noise, train.shape[0], metric=primary.name, search=config.search()):
        notes.append(f"privacy.floor: best of a top-{config.top_k} {config.prefilter} shortlist")
    nz = stat(noise_images(config.n_floor_noise, tuple(image_shape), dtype=dtype,
                           generator=torch.Generator().manual_seed(config.floor_seed)))
    return float(nz.max() if primary.higher_is_better else nz.min()), notes


def privacy_section(train_nb: Neighbours, heldout_nb: Neighbours, scores: Mapping[str, Tensor],
                    config: EvaluationConfig, *, floor: float | None) -> tuple[Tensor, dict[str, PrivacyScore],
                                                                              dict[str, Any]]:
    """Real/fake labels and how well each attacker-side score separates them.

    Args:
        train_nb, heldout_nb: the candidates' nearest training and held-out images (primary metric).
        scores: ``{name: (M,)}`` attacker-side scores, higher = more likely real.
        config: metric, ``min_class_size``, ``real_floor`` / ``n_floor_noise`` (recorded),
            ``bootstrap_seed``.
        floor: the floor from :func:`real_floor`.

    Returns:
        (``(M,)`` bool real labels, ``{score: PrivacyScore}``, the ``privacy`` summary).
    """
    primary = METRICS.get(config.metric)
    real = real_labels(train_nb.score, heldout_nb.score, higher_is_better=primary.higher_is_better, floor=floor)
    priv = privacy_report(real, scores, min_class_size=config.min_class_size) if scores else {}
    source = (f"best of {config.n_floor_noise} uniform-noise images" if config.real_floor == "noise"
              else "given" if config.real_floor is not None else "none")
    matched = train_nb.index[real]
    shared = torch.bincount(matched) if matched.numel() else torch.zeros(0, dtype=torch.int64)
    summary = {
        "rule": REAL_RULE.format(metric=primary.name), "floor": floor, "floor_source": source,
        "positive": POSITIVE, "negative": NEGATIVE,
        "n_real": int(real.sum()), "n_fake": int((~real).sum()), "fprs": list(LOW_FPRS),
        # many positives can be one blob near one training image: how many distinct images they match
        "n_real_distinct_train": int((shared > 0).sum()),
        "largest_shared": ({"train_index": int(shared.argmax()), "count": int(shared.max())}
                           if shared.numel() else None),
        # the bootstrap CI only where the AUC itself is measurable (both classes >= min_class_size)
        "scores": {k: {**v.summary(), "auc_ci_95": (bootstrap_auc_ci(real, scores[k], generator=config.bootstrap_seed)
                                                    if v.measurable else None)}
                   for k, v in priv.items()},
        "min_class_size": config.min_class_size,
        "roc": {k: {"fpr": v.fpr.tolist(), "tpr": v.tpr.tolist()} for k, v in priv.items() if v.measurable},
    }
    return real, priv, summary


def collapse_report(cands: Tensor, config: EvaluationConfig, *,
                    columns: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """Near-duplicate candidates (:func:`~datarecon.evaluation.protocol.collapse`) as a JSON-ready dict.

    Args:
        cands: ``(M, C, H, W)`` display-space candidates in ``[0, 1]``.
        config: ``collapse_metric`` and ``window``.
        columns: if given, receives the per-candidate columns ``nearest_other_<metric>`` (distance,
            or SSIM, to the nearest other candidate) and ``collapse_cluster`` (-1: no near-duplicate).

    Returns:
        The ``collapse`` summary: fractions, counts, cluster sizes (largest first) and the median
        distance (or SSIM) of a candidate to its nearest other candidate.
    """
    c = collapse(cands, metric=config.collapse_metric, window=config.window)
    near = c.nearest_other.double()
    finite = near[torch.isfinite(near)]
    summary = {"metric": c.metric, "threshold": c.threshold, "fraction_pairs": finite_or_none(c.fraction_pairs),
               "fraction_candidates": finite_or_none(c.fraction_candidates), "n_pairs": c.n_pairs,
               "n_close": c.n_close, "n_candidates": int(cands.shape[0]),
               "n_with_duplicate": int((c.cluster >= 0).sum()), "clusters": c.cluster_sizes(),
               "median_nearest_other": float(finite.median()) if finite.numel() else None}
    if columns is not None:
        columns[f"nearest_other_{c.metric}"] = [finite_or_none(v) for v in near.tolist()]
        columns["collapse_cluster"] = c.cluster.tolist()
    return summary
