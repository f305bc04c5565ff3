"""The typed read-model of ``model.json``: every field a model directory records, checked when it is read.

``model.json`` is the one file of a model directory whose content no hash covers (it holds the hashes of
the two tensor files), so a damaged or hand-edited one reaches every reader: ``datarecon info`` prints it,
the report's target card shows it, membership rebuilds the training recipe from it. :class:`ModelMeta` is
the one definition of what may be in it, in the layer that reads it (:mod:`datarecon.models.checkpoint`
validates every file it loads, and :func:`~datarecon.models.checkpoint.save_model_dir` every file before
it writes it, so the reader accepts exactly what the writer writes):

* the fields loading relies on (format, architecture, loss, weight decay, normalisation, hashes) typed;
* the training record (:class:`TrainingFields`): the recipe's fields the model card prints, and the margin
  ascent's budget and window;
* the metrics (:class:`ModelMetrics`): numbers finite (or ``null``, the writer's "undefined"), counts whole
  and non-negative, rates in [0, 1], words where words are written, the status one of
  :class:`~datarecon.kernel.status.Status` (or an older version's word);
* the margin-ascent curve (:class:`AscentPoint`): points at strictly increasing steps within the ascent's
  steps, at most one per window plus the start and the end, each with a finite margin; the identifiability
  probe's values are numbers, or ``"nan"``/``"inf"``/``"-inf"`` (how the curve records an undefined value);
* the pretrained start of a fine-tuning (:class:`PretrainedRecord`).

Unknown top-level keys are refused (a foreign or hand-edited file); the training record and the metrics
keep keys they do not type (an earlier version's), so older model directories still load.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from datarecon.kernel.losses import LOSSES
from datarecon.kernel.status import LEGACY, Status
from datarecon.models.spec import ArchSpec

__all__ = ["AscentPoint", "ModelMeta", "ModelMetrics", "PretrainedRecord", "TrainingFields", "UNDEFINED_TEXT"]

#: how the margin-ascent curve records a value the probe could not define (NaN, ±inf)
UNDEFINED_TEXT = ("nan", "inf", "-inf")
#: the pretrained record's ``head``: the pretrained model's read-out kept, or a new one drawn from the seed
HEADS = ("pretrained", "new")


def _known_loss(name: str) -> str:
    LOSSES.get(name)  # unknown: DataReconError listing the registered losses
    return name


def _undefined_text(value: Any) -> Any:
    """A curve value recorded as ``"nan"``/``"inf"``/``"-inf"`` reads as None (undefined)."""
    return None if isinstance(value, str) and value in UNDEFINED_TEXT else value


def _status_word(value: Any) -> Any:
    if value is not None and value not in {s.value for s in Status} | set(LEGACY):
        raise ValueError(f"unknown status; one of {', '.join(s.value for s in Status)}")
    return value


#: a finite number
Finite = float
#: a finite number, or null (written for a value that was NaN or infinite)
Number = float | None
#: a count
Count = Annotated[int, Field(ge=0)]
#: a rate or accuracy in [0, 1]
Rate = Annotated[float, Field(ge=0, le=1)]
#: a status word (:class:`~datarecon.kernel.status.Status`, or an older version's word)
StatusWord = Annotated[str | None, AfterValidator(_status_word)]
#: a probe's value on the curve: a finite number, or undefined (recorded as text)
ProbeValue = Annotated[float | None, BeforeValidator(_undefined_text)]


class _Record(BaseModel):
    """A section of model.json: typed fields checked, finite numbers only; other keys kept."""

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)


class AscentPoint(BaseModel):
    """One point of the margin-ascent curve (``metrics.margin_ascent_curve``).

    Attributes:
        step: the ascent's step (0: its start).
        normalised_margin: min_i y_i Φ(x_i; θ) / ‖θ‖^L at that step.
        kkt_truth, kkt_best_fake, kkt_gap: the weights-only KKT objective's relative residual for the training
            set and its best fake, and the gap (best fake − truth), where the probe measured them; None where
            the curve recorded them as undefined.
        other keys: what another probe measured (numbers, or undefined as text).
    """

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)

    step: Count
    normalised_margin: Finite
    kkt_truth: ProbeValue = None
    kkt_best_fake: ProbeValue = None
    kkt_gap: ProbeValue = None

    @model_validator(mode="after")
    def _other_values_are_numbers(self) -> AscentPoint:
        for key, value in (self.model_extra or {}).items():
            if value in UNDEFINED_TEXT:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key} {value!r:.40} is not a number (a probe records numbers, or "
                                 f"{'/'.join(UNDEFINED_TEXT)} where undefined)")
        return self


class ModelMetrics(_Record):
    """``metrics``: what the training measured (the model card's status, metrics, ascent and privacy lines)."""

    status: StatusWord = None
    stop_reason: str | None = None
    epochs_done: Count | None = None
    wall_time_s: Annotated[float, Field(ge=0)] | None = None
    n_train: Count | None = None
    n_heldout: Count | None = None
    train_loss: Number = None
    train_energy: Number = None
    train_accuracy: Rate | None = None
    heldout_loss: Number = None
    heldout_accuracy: Rate | None = None
    min_margin: Number = None
    mean_margin: Number = None
    weight_norm: Annotated[float, Field(ge=0)] | None = None
    normalised_margin: Number = None
    homogeneous: bool | None = None
    homogeneity_degree: Count | None = None
    kkt_regime_score: Number = None
    kkt_num_active: Count | None = None
    margin_ascent_steps: Count | None = None
    margin_ascent_status: Annotated[str | None, AfterValidator(
        lambda v: v if v == "skipped" else _status_word(v))] = None
    margin_ascent_stop_reason: str | None = None
    margin_ascent_wall_time_s: Annotated[float, Field(ge=0)] | None = None
    normalised_margin_before_ascent: Number = None
    margin_ascent_curve: list[AscentPoint] | None = None
    dp_epsilon: Annotated[float, Field(ge=0)] | None = None
    dp_delta: Rate | None = None
    dp_noise_multiplier: Annotated[float, Field(ge=0)] | None = None
    dp_sample_rate: Rate | None = None
    dp_steps: Count | None = None
    dp_max_grad_norm: Annotated[float, Field(gt=0)] | None = None
    dp_batch_size: Count | None = None
    dp_mean_batch_size: Annotated[float, Field(ge=0)] | None = None
    dp_accountant: str | None = None
    dp_opacus: str | None = None

    @model_validator(mode="after")
    def _curve_within_the_ascent(self) -> ModelMetrics:
        curve = self.margin_ascent_curve
        if curve is None:
            return self
        if self.margin_ascent_steps is None:
            raise ValueError("margin_ascent_curve without margin_ascent_steps (a curve records an ascent)")
        steps = [p.step for p in curve]
        bad = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), None)
        if bad is not None:
            raise ValueError(f"margin_ascent_curve: point {bad} is at step {steps[bad]}, not after the step "
                             f"{steps[bad - 1]} before it (the curve's steps increase)")
        if steps and steps[-1] > self.margin_ascent_steps:
            raise ValueError(f"margin_ascent_curve reaches step {steps[-1]}, beyond the ascent's "
                             f"{self.margin_ascent_steps} steps")
        return self


class AscentRecipe(_Record):
    """``training.margin_ascent``: the ascent's budget and the curve's window."""

    steps: Count = 0
    window: Annotated[int, Field(ge=1)] | None = None


class TrainingFields(_Record):
    """``training``: the training config as recorded (typed where the model card prints it)."""

    optimizer: str | None = None
    lr: Annotated[float, Field(gt=0)] | None = None
    momentum: Annotated[float, Field(ge=0)] | None = None
    schedule: str | None = None
    epochs: Count | None = None
    batch_size: Annotated[int, Field(ge=1)] | None = None
    dtype: str | None = None
    margin_ascent: AscentRecipe | None = None
    config_hash: str | None = None


class PretrainedRecord(BaseModel):
    """``pretrained``: the pretrained model a fine-tuning started from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str | None
    weights_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    head: Literal["pretrained", "new"]
    data: dict[str, Any]
    config_hash: str | None = None


class ModelMeta(BaseModel):
    """The fields of ``model.json``, validated before anything is built.

    Every key :func:`~datarecon.models.checkpoint.save_model_dir` writes is listed; an unknown key is
    refused (a hand-edited or foreign file, whose extra field would otherwise be ignored silently).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    format: Literal["datarecon-model/1"]
    arch: ArchSpec
    loss: Annotated[str, AfterValidator(_known_loss)]
    weight_decay: float = Field(ge=0)
    data: dict[str, Any] = Field(default_factory=dict)
    normalisation: Literal["unit", "unit-minus-mean"] = "unit"
    sha256: dict[str, str] = Field(default_factory=dict)
    training: TrainingFields = Field(default_factory=TrainingFields)
    seed: int | None = None
    config_hash: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    metrics: ModelMetrics = Field(default_factory=ModelMetrics)
    num_parameters: int | None = Field(default=None, ge=0)
    init_sha256: str | None = None
    data_fingerprint: dict[str, str] | None = None
    pretrained: PretrainedRecord | None = None

    @model_validator(mode="after")
    def _curve_within_its_windows(self) -> ModelMeta:
        """At most one curve point per window of the recorded ascent, besides its start and its end."""
        curve, ascent = self.metrics.margin_ascent_curve, self.training.margin_ascent
        if not curve or ascent is None or ascent.window is None or self.metrics.margin_ascent_steps is None:
            return self
        most = self.metrics.margin_ascent_steps // ascent.window + 2
        if len(curve) > most:
            raise ValueError(f"metrics.margin_ascent_curve has {len(curve)} points, more than the {most} an ascent "
                             f"of {self.metrics.margin_ascent_steps} steps records (one per window of "
                             f"{ascent.window}, the start and the end)")
        off = next((p.step for p in curve[:-1] if p.step % ascent.window), None)
        if off is not None:
            raise ValueError(f"metrics.margin_ascent_curve has a point at step {off}, which is no multiple of the "
                             f"window {ascent.window} (only the last point may end between windows)")
        return self
