"""The settings of a membership evaluation, one-to-one with ``datarecon membership``'s flags and its ``--config``
file: how the non-members and population samples are drawn (:class:`MembershipSettings`), how many reference
models train and how (:class:`ReferenceSettings`, the one declaration of them for a model directory, a user's
module and ``audit --model``), the member call of a user's images (:class:`Calibration`), and where the reference
models train and how the evaluation reports (:class:`Runtime`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from datarecon.attacks.mia import MIASettings
from datarecon.config import Seed
from datarecon.errors import DataReconError
from datarecon.experiments.execution import Execution

__all__ = ["AUTO", "Calibration", "MAX_REFERENCES", "MembershipSettings", "ReferenceSettings", "Runtime",
           "EVALUATION_ONLY", "REFERENCE_ONLY", "check_budget_applies", "check_settings_apply", "parse_references"]

#: ``count: auto``: the number of reference models follows from the time budget
AUTO = "auto"
#: the most reference models one call may ask for
MAX_REFERENCES = 100_000


class ReferenceSettings(BaseModel):
    """How many reference models, and how they are drawn.

    Attributes:
        count: reference models K; auto: as many as the time budget allows, estimated from the first models trained
            (0: none; the loss, confidence, gradient-norm and subspace signals only)
        budget_minutes: with count auto, the wall time the reference models may take (their training, on the
            workers given)
        seed: seed of the reference models' training subsets and initialisations
        keep_weights: keep every reference model's weights in the folder (to score other images later); the first
            four are kept in any case (they play the target to choose the strongest signal)
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    count: int | Literal["auto"] = Field(default=AUTO, union_mode="left_to_right")
    budget_minutes: float = Field(default=3.0, gt=0, le=24 * 60)
    seed: Seed = 0
    keep_weights: bool = True

    @property
    def auto(self) -> bool:
        return self.count == AUTO

    def fixed(self, count: int) -> ReferenceSettings:
        """These settings with ``count`` models."""
        return self.model_copy(update={"count": int(count)})

    @field_validator("count")
    @classmethod
    def _count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= MAX_REFERENCES:
            raise ValueError(f"count must be auto or between 0 and {MAX_REFERENCES}, got {value}")
        return value


def parse_references(text: str) -> int | str:
    """``--references``: ``auto`` or a number of reference models.

    Raises:
        DataReconError: neither.
    """
    if text.strip() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise DataReconError(f"--references takes auto or a number of reference models, got {text!r}") from None


parse_references.metavar = "<int|auto>"  # type: ignore[attr-defined]


def check_budget_applies(references: ReferenceSettings, *, budget_given: bool) -> None:
    """Refuse a time budget given with a fixed number of reference models: it sets how many ``auto`` trains, and
    would do nothing.

    Raises:
        DataReconError: naming the option it needs.
    """
    if budget_given and not references.auto:
        raise DataReconError(f"--budget-minutes sets how many reference models --references auto trains, and "
                             f"--references is {references.count}: drop --budget-minutes, or pass --references auto")


#: what acts on reference models only (a call that trains none reads none of it): fields of
#: :class:`MembershipSettings`, the user's training function (``recipe``) and where reference-model tasks run
#: (``execution``: backend, workers, Ray address)
REFERENCE_ONLY = ("references.budget_minutes", "references.seed", "references.keep_weights", "attacks.variance_prior",
                  "attacks.rmia_a", "attacks.rmia_gamma", "recipe", "execution")
#: the fields of :class:`MembershipSettings` that only an evaluation reads: scoring images (``--images``) calls them
#: against a null with the reference models its folder keeps
EVALUATION_ONLY = ("nonmembers", "population", "calibration_fraction", "seed", "references.count",
                   "references.budget_minutes", "references.seed", "references.keep_weights")


def check_settings_apply(references: ReferenceSettings, given: Mapping[str, str], *, evaluate: bool,
                         out: bool) -> None:
    """Refuse a setting this call would not read, naming the option it needs: no option silently does nothing.

    Args:
        references: the reference models asked for (a count of 0: none).
        given: what the command line set, as :data:`REFERENCE_ONLY` and :data:`EVALUATION_ONLY` name it → the
            option as the user spelled it.
        evaluate: the call measures the signals (``--evaluate``), else it scores images (``--images``).
        out: the call has a membership folder (``--out``).

    Raises:
        DataReconError: one line: the option, what it acts on, and the option it needs (or to drop it).
    """
    for path, flag in given.items():
        if not evaluate and path in EVALUATION_ONLY:
            raise DataReconError(f"{flag} sets what --evaluate measures; --images scores your images against --null "
                                 f"with the reference models --out keeps: drop {flag}, or pass --evaluate")
        if not evaluate and not out and path.startswith("attacks."):
            raise DataReconError(f"{flag} sets the reference attacks, which --images runs with the reference models "
                                 f"of a membership folder: pass --out DIR (a folder of --evaluate --references K), "
                                 f"or drop {flag}")
        if evaluate and references.count == 0 and path in REFERENCE_ONLY:
            raise DataReconError(f"{flag} acts on reference models and --references is 0 (none): pass --references K "
                                 f"or auto, or drop {flag}")
        if evaluate and references.auto and not out and path == "references.keep_weights":
            raise DataReconError(f"{flag} says which reference-model weights --out keeps, and without --out the "
                                 f"reference models are deleted after the call: pass --out DIR, or drop {flag}")


class MembershipSettings(BaseModel):
    """How a membership evaluation draws its images and which attacks it runs (one-to-one with the flags).

    Attributes:
        nonmembers: non-members drawn from the unused part of the model's training split (at least 1000 resolve a
            TPR at 0.1% FPR)
        population: population samples for RMIA, drawn from the test split
        calibration_fraction: fraction of the members and of the non-members on which the strongest signal is chosen
            when no reference models choose it (the ROCs are reported on the rest)
        seed: seed of the draws and of the calibration split
        references: the reference models
        attacks: settings of the reference attacks
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    nonmembers: int = Field(default=2000, ge=1)
    population: int = Field(default=1000, ge=1)
    calibration_fraction: float = Field(default=0.3, ge=0, lt=1)
    seed: Seed = 0
    references: ReferenceSettings = ReferenceSettings()
    attacks: MIASettings = MIASettings()

    def without_references(self) -> MembershipSettings:
        """These settings with no reference models (``datarecon evaluate`` and the reproductions' quick rows)."""
        return self.model_copy(update={"references": self.references.fixed(0)})


class Calibration(BaseModel):
    """Where the member call of a user's images comes from: the null, the false-positive rate and the signal.

    Attributes:
        null: images known NOT to be training images, to calibrate the threshold on (default: the
            model's held-out test images)
        fpr: false-positive rate of the member call (default 0.01)
        signal: the signal the member call uses (auto: the strongest of an evaluation kept in --out, else
            the loss with labels and the subspace without)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    null: Path | None = None
    fpr: float = 0.01
    signal: str = "auto"


@dataclass(frozen=True)
class Runtime:
    """Where an evaluation's reference models train and how it reports.

    Attributes:
        execution: backend, workers, Ray address, threads per task (:class:`~datarecon.experiments.execution.Execution`).
        device: torch device of the reference models' training.
        data_dir: data folder (None: ``$DATARECON_DATA`` / cache).
        log: sink of the lines that say what runs (reference models trained, kept, scoring).
        progress: progress of the reference models (one step per model) and of the scoring (one step per
            pseudo-target, then per signal): a :data:`~datarecon.kernel.engine.PROGRESS_MODES` name or a bool (True:
            a bar on a terminal, plain lines in a log; False: none).
    """

    execution: Execution = Execution()
    device: str = "cpu"
    data_dir: str | Path | None = None
    log: Callable[[str], None] = print
    progress: bool | str = False
