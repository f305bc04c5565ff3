"""Schemas of the evaluation files read back (``metrics.json``, the fields of ``run.json`` a report
reads), so that a damaged or tampered file is refused in one line before anything renders it.

``datarecon report`` and ``datarecon evaluate`` read these files from disk, and files are untrusted
input: unchecked, ``"count": "NaN"`` would end in a TypeError inside the report, and ``"count": 1e308``
would be rendered as "1e+308 of 10 training images reconstructed". Every field a report or a printed
headline uses is typed here (numbers finite, counts whole and at most the number of training
images, SSIM thresholds in [-1, 1], AUCs in [0, 1]); other fields are kept as they are, so a
file written by an earlier version, with fewer fields, still reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from datarecon.errors import CheckpointError
from datarecon.kernel.status import LEGACY, Status
from datarecon.utils.io import read_json

#: the strings earlier versions wrote for an undefined number (JSON ``null`` now)
_LEGACY_UNDEFINED = ("nan", "inf", "-inf")


def _undefined(value: Any) -> Any:
    """An undefined number as earlier versions wrote it (``"nan"``) reads as None."""
    return None if isinstance(value, str) and value in _LEGACY_UNDEFINED else value


#: a count of images or candidates
Count = Annotated[int, Field(ge=0)]
#: an SSIM value or threshold, or undefined
Similarity = Annotated[Annotated[float, Field(ge=-1, le=1)] | None, BeforeValidator(_undefined)]
#: a probability, rate, AUC or TPR, or undefined
Unit = Annotated[Annotated[float, Field(ge=0, le=1)] | None, BeforeValidator(_undefined)]
#: any finite number, or undefined
Number = Annotated[float | None, BeforeValidator(_undefined)]


class _Record(BaseModel):
    """A section of a file read back: the typed fields are checked, others are kept as they are."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)


class PaperCount(_Record):
    """``headline.paper``: the papers' fixed-threshold count with its nulls."""

    threshold: Similarity = None
    count: Count | None = None
    heldout: Count | None = None
    noise: Count | None = None


class Calibration(_Record):
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


class Retention(_Record):
    """``headline.retention``: ground-truth starts, how many stayed at their image."""

    count: Count
    of: Count
    threshold: Similarity


class Headline(_Record):
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

    @model_validator(mode="after")
    def _at_most_n(self) -> Headline:
        if self.n_train is None:
            return self
        for where, value in (("count", self.count), ("heldout", self.heldout), ("noise", self.noise),
                             ("paper.count", self.paper.count if self.paper else None)):
            if value is not None and value > self.n_train:
                raise ValueError(f"{where} {value} exceeds the {self.n_train} training images")
        return self


class Haim(_Record):
    """``haim``: the Haim-protocol counts per threshold and the sorted SSIM curve."""

    counts: dict[str, Count] | None = None
    counts_by_assignment: dict[str, dict[str, Count]] | None = None
    sorted_ssim: list[Similarity] | None = None


class BaselineStats(_Record):
    """One null of ``baselines.<statistic>``: counts per threshold and summary statistics."""

    counts: dict[str, Count] | None = None
    n: Count | None = None
    max: Number = None
    mean: Number = None
    median: Number = None
    min: Number = None


class Baseline(_Record):
    """``baselines.<statistic>``: the nulls and their curves."""

    curves: dict[str, list[Number]] | None = None
    heldout: BaselineStats | None = None
    noise: BaselineStats | None = None
    real: BaselineStats | None = None


class Score(_Record):
    """``privacy.scores.<signal>``: one attacker-side signal's ROC summary."""

    auc: Unit = None
    auc_ci_95: tuple[Unit, Unit] | None = None
    measurable: bool | None = None
    tpr_at_fpr: dict[str, Unit] | None = None
    tpr_estimable: dict[str, bool] | None = None


class Curve(_Record):
    """``privacy.roc.<signal>``: an ROC curve."""

    fpr: list[Unit]
    tpr: list[Unit]


class Privacy(_Record):
    """``privacy``: the rule's classes and each signal's ROC."""

    fprs: list[Unit] | None = None
    n_real: Count | None = None
    n_fake: Count | None = None
    note: str | None = None
    scores: dict[str, Score] | None = None
    roc: dict[str, Curve] | None = None


class Signal(_Record):
    """``candidate_roc.signals.<signal>``."""

    auc: Unit = None
    auc_ci: tuple[Unit, Unit] | None = None


class CandidateRoc(_Record):
    """``candidate_roc``: reconstructing candidates told apart by attacker-side signals."""

    best: str | None = None
    note: str | None = None
    threshold: Similarity = None
    positives: Count | None = None
    negatives: Count | None = None
    signals: dict[str, Signal] | None = None


class Collapse(_Record):
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


class Metrics(_Record):
    """``metrics.json`` as ``datarecon evaluate`` writes it (the fields reports and headlines read)."""

    nearest: dict[str, Any]
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
    init: dict[str, Any] | None = None
    run: dict[str, Any] | None = None


class MembershipReport(_Record):
    """A membership signal's ``report`` in ``membership.json``: its ROC summary."""

    auc: Unit = None
    auc_ci: list[Unit] | None = None
    tpr_at_fpr: dict[str, Unit] | None = None
    n_members: Count | None = None
    n_nonmembers: Count | None = None


class MembershipSignal(_Record):
    """One signal of ``membership.json``: whether it was measured and its report."""

    applicable: bool | None = None
    kind: str | None = None
    report: MembershipReport | None = None


class MembershipResult(_Record):
    """``membership.json`` as ``datarecon membership --evaluate`` writes it (the fields reports read)."""

    signals: dict[str, MembershipSignal]
    settings: dict[str, Any] | None = None
    strongest: dict[str, Any] | str | None = None


def _status(value: Any) -> Any:
    """A run's status word (the legacy training words included); another word is damage."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in {s.value for s in Status} | set(LEGACY):
        raise ValueError(f"unknown status; one of {', '.join(s.value for s in Status)}")
    return value


class RunFields(_Record):
    """The fields of ``run.json`` a report or an evaluation reads (the attack writes the file)."""

    status: Annotated[str | None, BeforeValidator(_status)] = None
    method: str | None = None
    model_dir: str | None = None
    steps_done: Count | None = None
    seed: Count | None = None
    wall_time_s: Number = None
    config: dict[str, Any] | None = None
    final: dict[str, Number] | None = None
    selection: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None
    knowledge: dict[str, Any] | None = None
    subspace: dict[str, Any] | None = None


def _problem(exc: ValidationError) -> str:
    """The first problem of a validation error, as ``location: message``."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(root)"
    return f"{loc}: {err['msg'].removeprefix('Value error, ')} (value {err.get('input')!r:.40})"


def check_record(data: Any, schema: type[BaseModel], *, path: str | Path, fix: str) -> dict[str, Any]:
    """``data`` (a file's content) checked against ``schema``; returned unchanged.

    Raises:
        CheckpointError: one line naming the file, the first bad field and ``fix``.
    """
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object; {fix}")
    try:
        schema.model_validate(data)
    except ValidationError as exc:
        raise CheckpointError(f"{path} is damaged or was changed by hand ({_problem(exc)}); {fix}") from None
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


def read_run_fields(path: str | Path) -> dict[str, Any]:
    """A ``run.json``, checked for the fields evaluations and reports read (:class:`RunFields`).

    Raises:
        CheckpointError: missing, not JSON, or a field of the wrong type (one line).
    """
    return check_record(read_json(path), RunFields, path=path, fix="re-create the run (it was not written so by "
                        "datarecon)")


__all__ = ["Headline", "MembershipResult", "Metrics", "RunFields", "check_record", "read_membership_result", "read_metrics",
           "read_run_fields"]
