"""Schemas of the evaluation files read back (``metrics.json``, ``membership.json``), so that a damaged or
tampered file is refused in one line before anything renders it (a run's own files, ``run.json``,
``history.jsonl`` and the report's grid: :mod:`datarecon.evaluation.run_records`; ``model.json``:
:mod:`datarecon.models.records`).

``datarecon report`` and ``datarecon evaluate`` read these files from disk, and files are untrusted
input: unchecked, ``"count": "NaN"`` would end in a TypeError inside the report, and ``"count": 1e308``
would be rendered as "1e+308 of 10 training images reconstructed". Every field a report or a printed
headline uses is typed here (numbers finite, counts whole and at most the number of training
images, SSIM thresholds in [-1, 1], AUCs in [0, 1]); other fields are kept as they are, so a
file written by an earlier version, with fewer fields, still reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from datarecon.errors import CheckpointError
from datarecon.kernel.status import LEGACY, Status
from datarecon.utils.io import read_json

#: the strings earlier versions wrote for an undefined number (JSON ``null`` now)
LEGACY_UNDEFINED = ("nan", "inf", "-inf")


def _undefined(value: Any) -> Any:
    """An undefined number as earlier versions wrote it (``"nan"``) reads as None."""
    return None if isinstance(value, str) and value in LEGACY_UNDEFINED else value


def status_word(value: Any) -> Any:
    """A run's status word (the legacy training words included); another word is damage."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in {s.value for s in Status} | set(LEGACY):
        raise ValueError(f"unknown status; one of {', '.join(s.value for s in Status)}")
    return value


#: a count of images or candidates
Count = Annotated[int, Field(ge=0)]
#: an SSIM value or threshold, or undefined
Similarity = Annotated[Annotated[float, Field(ge=-1, le=1)] | None, BeforeValidator(_undefined)]
#: a probability, rate, AUC or TPR, or undefined
Unit = Annotated[Annotated[float, Field(ge=0, le=1)] | None, BeforeValidator(_undefined)]
#: a confidence interval [low, high] of a rate
Interval = Annotated[list[Unit], Field(min_length=2, max_length=2)]
#: any finite number, or undefined
Number = Annotated[float | None, BeforeValidator(_undefined)]


class Record(BaseModel):
    """A section of a file read back: the typed fields are checked, others are kept as they are."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)


class PaperCount(Record):
    """``headline.paper``: the papers' fixed-threshold count with its nulls."""

    threshold: Similarity = None
    count: Count | None = None
    heldout: Count | None = None
    noise: Count | None = None


class Calibration(Record):
    """``headline.calibrated``: the null-calibrated threshold and the counts there."""

    threshold: Similarity = None
    null_threshold: Similarity = None
    floor: Similarity = None
    rate: Unit = None
    allowed: Count | None = None
    count: Count | None = None
    heldout: Count | None = None
    noise: Count | None = None
    excluded: Count | None = None


class Retention(Record):
    """``headline.retention``: ground-truth starts, how many stayed at their image."""

    count: Count
    of: Count
    threshold: Similarity


class ReferenceScoring(Record):
    """``headline.reference_scoring``: the count as the papers' code scores it."""

    count: Count | None = None
    threshold: Similarity = None
    heldout: Count | None = None
    noise: Count | None = None
    mean_ssim: Similarity = None


class Headline(Record):
    """``headline``: the one count every report leads with (docs/dev/CONTRACTS.md)."""

    rule: str = "standard"
    rule_text: str | None = None
    threshold: Similarity = None
    count: Count | None = None
    heldout: Count | None = None
    noise: Count | None = None
    n_train: Count | None = None
    n_candidates: Count | None = None
    n_heldout_candidates: Count | None = None
    n_heldout_available: Count | None = None
    notes: list[str] = []
    paper: PaperCount | None = None
    calibrated: Calibration | None = None
    retention: Retention | None = None
    reference_scoring: ReferenceScoring | None = None

    @model_validator(mode="after")
    def _at_most_n(self) -> Headline:
        if self.n_train is None:
            return self
        for where, value in (("count", self.count), ("heldout", self.heldout), ("noise", self.noise),
                             ("paper.count", self.paper.count if self.paper else None)):
            if value is not None and value > self.n_train:
                raise ValueError(f"{where} {value} exceeds the {self.n_train} training images")
        return self


class PerTrain(Record):
    """``haim.per_train``: each training image's matched candidate (−1: none), its SSIM, NCC and margin."""

    candidate_index: list[int] | None = None
    ssim: list[Similarity] | None = None
    ncc: list[Similarity] | None = None
    margin: list[Number] | None = None

    @model_validator(mode="after")
    def _one_per_training_image(self) -> PerTrain:
        lengths = {k: len(v) for k, v in (("candidate_index", self.candidate_index), ("ssim", self.ssim),
                                          ("ncc", self.ncc), ("margin", self.margin)) if v is not None}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"one value per training image expected in each list; lengths {lengths}")
        return self


class Haim(Record):
    """``haim``: the Haim-protocol counts per threshold, the sorted SSIM curve and each training image's match."""

    counts: dict[str, Count] | None = None
    counts_by_assignment: dict[str, dict[str, Count]] | None = None
    sorted_ssim: list[Similarity] | None = None
    mean_ssim: Similarity = None
    per_train: PerTrain | None = None


class BaselineStats(Record):
    """One null of ``baselines.<statistic>``: counts per threshold and summary statistics."""

    counts: dict[str, Count] | None = None
    n: Count | None = None
    max: Number = None
    mean: Number = None
    median: Number = None
    min: Number = None


class Baseline(Record):
    """``baselines.<statistic>``: the nulls and their curves."""

    curves: dict[str, list[Number]] | None = None
    heldout: BaselineStats | None = None
    noise: BaselineStats | None = None
    real: BaselineStats | None = None


class Score(Record):
    """``privacy.scores.<signal>``: one attacker-side signal's ROC summary."""

    auc: Unit = None
    auc_ci_95: tuple[Unit, Unit] | None = None
    measurable: bool | None = None
    tpr_at_fpr: dict[str, Unit] | None = None
    tpr_estimable: dict[str, bool] | None = None
    negatives_needed: dict[str, Count] | None = None


class Shared(Record):
    """``privacy.largest_shared``: the training image most candidates match."""

    count: Count
    train_index: Count


class Curve(Record):
    """``privacy.roc.<signal>``: an ROC curve."""

    fpr: list[Unit]
    tpr: list[Unit]


class Privacy(Record):
    """``privacy``: the rule's classes and each signal's ROC."""

    fprs: list[Unit] | None = None
    n_real: Count | None = None
    n_fake: Count | None = None
    note: str | None = None
    scores: dict[str, Score] | None = None
    roc: dict[str, Curve] | None = None
    n_real_distinct_train: Count | None = None
    largest_shared: Shared | None = None


class Signal(Record):
    """``candidate_roc.signals.<signal>``."""

    auc: Unit = None
    auc_ci: tuple[Unit, Unit] | None = None


class CandidateRoc(Record):
    """``candidate_roc``: reconstructing candidates told apart by attacker-side signals."""

    best: str | None = None
    note: str | None = None
    threshold: Similarity = None
    positives: Count | None = None
    negatives: Count | None = None
    signals: dict[str, Signal] | None = None


class Collapse(Record):
    """``collapse``: near-duplicate candidates."""

    clusters: list[Count] = []
    fraction_candidates: Unit = None
    fraction_pairs: Unit = None
    median_nearest_other: Number = None
    n_candidates: Count | None = None
    n_close: Count | None = None
    n_pairs: Count | None = None
    n_with_duplicate: Count | None = None
    metric: str | None = None
    threshold: Number = None


class NearestStats(Record):
    """``nearest.<set>.<metric>``: the similarity of each candidate's nearest image of a reference set."""

    counts: dict[str, Count] | None = None
    exact: bool | None = None
    max: Number = None
    mean: Number = None
    median: Number = None
    min: Number = None


class InitSummary(Record):
    """``init``: where the candidates started, and the headline rule that start picks."""

    name: str | None = None
    rule: str | None = None
    recorded: bool | None = None
    mean_ssim_to_init: Similarity = None


class LabelsSummary(Record):
    """``labels``: restored labels beside the training set's (``--known-labels restored``)."""

    source: str | None = None
    counts: list[Count]
    true_counts: list[Count]
    accuracy: Unit = None


class ObjectiveFit(Record):
    """``identifiability.objectives.<name>.sets.<set>``: the set's relative residual with optimal multipliers."""

    relative_residual: Number = None


class Objective(Record):
    """``identifiability.objectives.<name>``: one objective's fits and verdict, or why it was not measured."""

    sets: dict[str, ObjectiveFit] | None = None
    identifies: bool | None = None
    gap: Number = None
    note: str | None = None


class Identifiability(Record):
    """``identifiability``: which attack objective the training set minimises."""

    objectives: dict[str, Objective] | None = None
    weight_decay_note: str | None = None


class OwnModel(Record):
    """``own_model`` (run.json, and metrics.json ``run``): the user's model an attack ran on."""

    factory: str | None = None
    loss: str | None = None
    input_shape: list[Annotated[int, Field(ge=1)]] | None = None
    value_range: tuple[float, float] = (0.0, 1.0)
    homogeneous_measured: bool | str | None = None

    @model_validator(mode="after")
    def _increasing(self) -> OwnModel:
        if not self.value_range[0] < self.value_range[1]:
            raise ValueError(f"value_range {list(self.value_range)} is not an interval lo < hi")
        return self


class RunSummary(Record):
    """``run``: the run an evaluation measured (its folder, model, method, status)."""

    run_dir: str | None = None
    model_dir: str | None = None
    method: str | None = None
    status: Annotated[str | None, BeforeValidator(status_word)] = None
    steps_done: Count | None = None
    seed: Count | None = None
    config: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    arch: dict[str, Any] | None = None
    own_model: OwnModel | None = None


class EmbeddedSignal(Record):
    """``membership.signals.<name>`` of metrics.json: one membership signal, flattened for the report."""

    kind: str | None = None
    applicable: bool | None = None
    note: str | None = None
    scope: str | None = None
    auc: Unit = None
    auc_ci: Interval | None = None
    tpr_ci: dict[str, Interval | None] | None = None
    tpr_at_fpr: dict[str, Unit] | None = None
    n_members: Count | None = None
    n_nonmembers: Count | None = None
    line: str | None = None


class Strongest(Record):
    """``strongest``: the headline membership signal and how it was chosen."""

    name: str
    chosen: str | None = None
    rule: str | None = None
    demoted: str | None = None
    line: str | None = None
    baseline_same: str | None = None


class InModels(Record):
    """``references.in_models``: how many reference models each half-in candidate trained."""

    mean: Number = None
    min: Number = None
    max: Number = None
    models: Count | None = None


class References(Record):
    """``references``: the reference models of LiRA and RMIA (or why none were trained)."""

    count: Count | None = None
    trained: Count | None = None
    reused: Count | None = None
    in_models: InModels | None = None
    auto: dict[str, Any] | None = None


class Epsilon(Record):
    """``epsilon``: the empirical ε lower bound."""

    lower: Annotated[float, Field(ge=0)] | None = None
    estimate: Number = None
    fpr: Unit = None
    tpr: Unit = None
    delta: Unit = None
    confidence: Unit = None
    members: Count | None = None
    nonmembers: Count | None = None
    line: str | None = None
    note: str | None = None
    signal: str | None = None


class Group(Record):
    """``candidates.<group>``: how many members, non-members or population images, and where from."""

    count: Count | None = None
    source: str | None = None


class Candidates(Record):
    """``candidates``: the members, non-members, half-in pool and population of a membership evaluation."""

    members: Group | None = None
    nonmembers: Group | None = None
    half_in: Group | None = None
    population: Group | None = None


class EmbeddedMembership(Record):
    """``membership`` of metrics.json: the compact record of the model's membership its report shows."""

    signals: dict[str, EmbeddedSignal] = {}
    strongest: Strongest | None = None
    baseline: BaselineLine | None = None
    candidates: Candidates | None = None
    references: References | None = None
    epsilon: Epsilon | None = None
    knowledge: str | None = None


class Metrics(Record):
    """``metrics.json`` as ``datarecon evaluate`` writes it (the fields reports and headlines read)."""

    nearest: dict[str, dict[str, NearestStats]]
    metric: str
    headline: Headline | None = None
    haim: Haim | None = None
    baselines: dict[str, Baseline] | None = None
    privacy: Privacy | None = None
    candidate_roc: CandidateRoc | None = None
    collapse: Collapse | None = None
    n_candidates: Count | None = None
    param_distance: Number = None
    window: str | None = None
    window_size: Count | None = None
    image_shape: list[Count] | None = None
    reference_sizes: dict[str, Count] | None = None
    init: InitSummary | None = None
    run: RunSummary | None = None
    mean_l2_to_nearest: dict[str, Number] | None = None
    approximate: list[str] = []
    labels: LabelsSummary | None = None
    identifiability: Identifiability | None = None
    membership: EmbeddedMembership | None = None


class MembershipReport(Record):
    """A membership signal's ``report`` in ``membership.json``: its ROC summary."""

    auc: Unit = None
    auc_ci: Interval | None = None
    tpr_at_fpr: dict[str, Unit] | None = None
    tpr_ci: dict[str, Interval | None] | None = None
    n_members: Count | None = None
    n_nonmembers: Count | None = None


class MembershipSignal(Record):
    """One signal of ``membership.json``: its kind, whether it was measured, and its report."""

    applicable: bool
    kind: str
    scope: str | None = None
    note: str | None = None
    line: str | None = None
    report: MembershipReport | None = None


class BaselineLine(Record):
    """``baseline``: the loss threshold's line, beside which the headline stands."""

    name: str | None = None
    line: str | None = None


class MembershipResult(Record):
    """``membership.json`` as ``datarecon membership --evaluate`` writes it (the fields reports read)."""

    signals: dict[str, MembershipSignal]
    settings: dict[str, Any] | None = None
    strongest: Strongest
    baseline: BaselineLine
    candidates: Candidates | None = None
    references: References | None = None
    epsilon: Epsilon | None = None
    knowledge: dict[str, Any] | None = None


def problem(exc: ValidationError) -> str:
    """The first problem of a validation error, as ``location: message (value ...)`` (the location without the
    names of a union's alternatives; the value left out where it is a whole section)."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not _union_tag(p))
    text = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) or err["type"] == "missing" else f" (value {value!r:.40})"
    return f"{loc}: {text}{shown}" if loc else f"{text}{shown}"


def _union_tag(part: Any) -> bool:
    """Whether a location part names an alternative of a union (``InitRecord``, ``str``, ``function-before[...]``)
    rather than a key of the file."""
    return isinstance(part, str) and (part[:1].isupper() or part in ("str", "int", "float", "bool", "none")
                                      or "[" in part)


def check_record(data: Any, schema: type[BaseModel], *, path: str | Path, fix: str) -> dict[str, Any]:
    """``data`` (a file's content) checked against ``schema``; returned unchanged.

    Raises:
        CheckpointError: one line naming the file, the first bad field and ``fix``.
    """
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object; {fix}")
    try:  # strict, as JSON: a file datarecon wrote holds numbers as numbers ("count": "3" is damage)
        schema.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as exc:
        raise CheckpointError(f"{path} is damaged or was changed by hand ({problem(exc)}); {fix}") from None
    return data


def read_metrics(run_dir: str | Path) -> dict[str, Any]:
    """``RUN/metrics.json``, checked (:class:`Metrics`).

    Raises:
        CheckpointError: missing, not JSON, or a field of the wrong type or range (one line).
    """
    path = Path(run_dir) / "metrics.json"
    return check_record(read_json(path), Metrics, path=path, fix=f"rerun `datarecon evaluate {run_dir}` to rewrite it")


def read_membership_result(path: str | Path) -> dict[str, Any]:
    """A membership folder's ``membership.json``, checked (:class:`MembershipResult`).

    Raises:
        CheckpointError: missing, not JSON, or a field of the wrong type or range (one line).
    """
    fix = f"rerun `datarecon membership --model M --evaluate --out {Path(path).parent}` to rewrite it"
    return check_record(read_json(path), MembershipResult, path=path, fix=fix)




__all__ = ["LEGACY_UNDEFINED", "Count", "Headline", "MembershipResult", "Metrics", "Number", "OwnModel", "Record",
           "check_record", "problem", "read_membership_result", "read_metrics", "status_word"]
