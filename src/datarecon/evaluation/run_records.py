"""Schemas of a run directory's own files as evaluations and reports read them back: the fields of ``run.json``
(:class:`RunFields`), the rows of ``history.jsonl`` (:class:`HistoryRow`) and the report's grid of best-matched
candidates (``neighbours.safetensors``), so that a damaged or tampered file is refused in one line, naming the
file, the field and the fix, before anything renders it. Fields no reader uses are kept as they are, so a run
written by an earlier version, with fewer fields, still reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError, model_validator

from datarecon.attacks.base import ATTACKS
from datarecon.errors import CheckpointError
from datarecon.evaluation.records import LEGACY_UNDEFINED, Count, Number, OwnModel, Record, check_record, problem, \
    status_word
from datarecon.utils.io import load_tensors, read_json, read_json_lines

__all__ = ["HistoryRow", "RunFields", "read_history", "read_neighbour_grid", "read_run_fields"]


class KnownInit(Record):
    """``knowledge.known_init``: the initialisation the attacker knew, by its source and SHA-256."""

    source: str
    sha256: str


class RestoredLabels(Record):
    """``knowledge.labels``: the label counts the attack restored (or assumed)."""

    counts: list[Count]
    source: str | None = None


class Knowledge(Record):
    """``knowledge``: the threat model of the run (what the attacker had)."""

    known_init: KnownInit | None = None
    n: Count | None = None
    used: list[str] | None = None
    summary: str | None = None
    labels: RestoredLabels | None = None


class Rank(Record):
    """``subspace.rank``: n estimated from the first dense layer's spectrum."""

    n_hat: Count | None = None
    interval: list[Count] | None = None
    above_noise: Count | None = None


class SubspaceRecord(Record):
    """``subspace``: the first dense layer's analysis (the attacker-side training subspace)."""

    layer: str | None = None
    matrix: str | None = None
    shape: list[Count] | None = None
    k: Count | None = None
    rank: Rank | None = None


class Source(Record):
    """``extra.sources[i]`` of a pool: a source run, by its folder."""

    run_dir: str | None = None
    key: str | None = None


class RunExtra(Record):
    """``extra``: what an attack records beyond its candidates (the bilevel attack's parameter distances, a pool's
    source runs)."""

    param_distance: Number = None
    param_distance_x0: Number = None
    sources: list[Source] | None = None


class Selected(Record):
    """``selection.<criterion>``: an attacker-side selection criterion's value."""

    value: Number = None


class InitRecord(Record):
    """``init``: the initialisation the run started from."""

    name: str | None = None
    params: dict[str, Any] | None = None
    experimenter_choice: bool | None = None


class RunFields(Record):
    """The fields of ``run.json`` a report or an evaluation reads (the attack writes the file)."""

    status: Annotated[str | None, BeforeValidator(status_word)] = None
    method: str | None = None
    model_dir: str | None = None
    steps_done: Count | None = None
    seed: Count | None = None
    wall_time_s: Number = None
    config: dict[str, Any] | None = None
    final: dict[str, Number] | None = None
    selection: dict[str, Selected | Number | str | dict[str, Number]] | None = None  # a pool: criterion, values
    extra: RunExtra | None = None
    knowledge: Knowledge | None = None
    subspace: SubspaceRecord | None = None
    own_model: OwnModel | None = None
    init: InitRecord | str | None = None
    resume_command: str | None = None
    pooled_from: list[str] | None = None


class HistoryRow(Record):
    """One row of ``history.jsonl``: a logged step and its metrics (numbers, or null where undefined)."""

    step: Count

    @model_validator(mode="after")
    def _metrics_are_numbers(self) -> HistoryRow:
        for key, value in (self.model_extra or {}).items():
            if isinstance(value, str) and value not in LEGACY_UNDEFINED and key in _numeric_history():
                raise ValueError(f"{key} {value!r:.40} is not a number")
        return self


def _numeric_history() -> frozenset[str]:
    """The history's metrics that reports and verdicts read as numbers: each registered attack's convergence metric
    (the convergence verdict, its figure; :attr:`~datarecon.attacks.base.Attack.convergence`) and the losses and
    distances attacks log."""
    return frozenset({ATTACKS.get(name).convergence.metric for name in ATTACKS.names()}
                     | {"loss", "residual", "param_distance"})


def read_run_fields(path: str | Path) -> dict[str, Any]:
    """A ``run.json``, checked for the fields evaluations and reports read (:class:`RunFields`).

    Raises:
        CheckpointError: missing, not JSON, or a field of the wrong type (one line).
    """
    return check_record(read_json(path), RunFields, path=path, fix="re-create the run (it was not written so by "
                        "datarecon)")


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """A ``history.jsonl``, each row checked (:class:`HistoryRow`); ``[]`` when it is missing. A torn last line (a
    killed writer) is dropped, as :func:`~datarecon.utils.io.read_json_lines` does.

    Raises:
        CheckpointError: a row without a whole step, or with a metric that is text (one line, its row number).
    """
    rows = read_json_lines(path)
    for i, row in enumerate(rows):
        try:
            HistoryRow.model_validate_json(json.dumps(row), strict=True)
        except ValidationError as exc:
            raise CheckpointError(f"{path} is damaged or was changed by hand (row {i + 1}: {problem(exc)}); "
                                  "re-create the run (it was not written so by datarecon)") from None
    return rows



def read_neighbour_grid(run_dir: str | Path, *, name: str = "neighbours.safetensors") -> dict[str, Any]:
    """``RUN/neighbours.safetensors`` (or another grid file ``name`` of the same format, e.g. a reproduction's
    ``grid-train-similarity.safetensors``), the report's grid of the best-matched candidates, checked: ``candidates``
    ``(N, C, H, W)`` floats; for each of ``train``, ``partition`` and ``init`` that it holds, N images of the same
    shape with ``<set>_score`` (N,) floats and ``<set>_index`` (N,) integers; ``n_candidates`` one integer ≥ N.
    ``{}`` when the file is missing (the report then has no grid).

    Raises:
        CheckpointError: a missing or misshapen tensor (one line naming it and the fix).
    """
    path = Path(run_dir) / name
    if not path.is_file():
        return {}
    grid = load_tensors(path)
    fix = f"rerun `datarecon evaluate {run_dir}` to rewrite it"

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path} is damaged or was changed by hand ({what}); {fix}")

    cands = grid.get("candidates")
    if cands is None or cands.dim() != 4 or not cands.dtype.is_floating_point:
        raise bad("no 'candidates' tensor of images (N, C, H, W)")
    n = cands.shape[0]
    for name in ("train", "partition", "init"):
        if name not in grid:
            continue
        if tuple(grid[name].shape) != tuple(cands.shape) or not grid[name].dtype.is_floating_point:
            raise bad(f"'{name}' has shape {tuple(grid[name].shape)}, the candidates {tuple(cands.shape)}")
        for suffix, floating in (("score", True), ("index", False)):
            v = grid.get(f"{name}_{suffix}")
            if v is None or tuple(v.shape) != (n,) or v.dtype.is_floating_point != floating:
                raise bad(f"'{name}_{suffix}' is not {n} {'numbers' if floating else 'integers'}")
    total = grid.get("n_candidates")
    if total is not None and (total.numel() != 1 or total.dtype.is_floating_point or int(total) < n):
        raise bad(f"'n_candidates' is not one integer of at least {n}")
    return grid
