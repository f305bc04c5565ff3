"""Experiment files: one YAML/TOML file describing train → attack → evaluate → report.

An experiment file maps one-to-one to :class:`Experiment` (docs/RUNS.md)::

    name: digits-kkt
    train:                       # a TrainConfig (or `model: DIR`, an existing model directory)
      data: {dataset: digits, task: odd-even, n_per_class: 10}
      arch: {name: mlp, hidden: [100], bias: false, init_scale: 1.0e-3}
      lr: 0.5
      epochs: 1000
      dtype: float64
    attack:                      # a ReconstructionRun without its model (the trained one is used)
      attack: {method: kkt, steps: 300, lr_x: 0.01, lr_lambda: 0.01, lambda_min: 0.2}
      init: {name: gaussian, scale: 0.05}
    evaluate: {against: [train, heldout, noise]}
    report: {title: digits, KKT attack}

:func:`run_experiment` executes it into one folder::

    OUT/experiment.json   the experiment (as validated), its hash, the status of each stage
    OUT/model/            the trained target (a model directory; absent with `model:`)
    OUT/run/              the attack's run directory; `evaluate` adds metrics.json there
    OUT/report.html       the report

Each stage's status is recorded in ``experiment.json`` when it finishes (atomically), so re-running
the same file into the same folder skips finished stages and resumes an interrupted one from its
own checkpoint (training and the attack checkpoint as usual; evaluation and the report are
recomputed). A folder written for another experiment (another hash) is refused; ``overwrite``
starts afresh. In the spirit of ML Privacy Meter's audit configuration files, but typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from datarecon.config import Seed, build_config, read_config_mapping
from datarecon.data import load_task
from datarecon.errors import DataReconError
from datarecon.evaluation import run_metrics
from datarecon.evaluation.neighbours import METRICS
from datarecon.evaluation.protocol import ASSIGNMENTS
from datarecon.evaluation.run_eval import check_reference_sets
from datarecon.experiments.identifiability import attach_identifiability
from datarecon.experiments.membership.evaluate import attach_membership
from datarecon.experiments.reconstruct import (ReconstructionRun, RunOptions, RunSettings, TargetRecord, build_run,
                                               check_before_target, execute)
from datarecon.kernel.files import EXPERIMENT_JSON, MODEL_JSON, REPORT_HTML
from datarecon.kernel.outdir import claim_out_dir
from datarecon.kernel.resume import folder_state
from datarecon.kernel.status import Status
from datarecon.report.html import render_report
from datarecon.models.checkpoint import read_model_meta
from datarecon.training.target import TrainConfig, check_training, train_target
from datarecon.utils.io import atomic_write_json, config_hash, read_json, versions

FORMAT = "datarecon-experiment/1"
MODEL_SUBDIR, RUN_SUBDIR, REPORT = "model", "run", REPORT_HTML
STAGES = ("train", "attack", "evaluate", "report")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class EvaluateSettings(_Frozen):
    """The ``evaluate`` stage (:func:`datarecon.evaluation.run_metrics`).

    Attributes:
        against: reference sets among ``train``, ``partition``, ``heldout``, ``noise``.
        metric: similarity metric of the nearest-neighbour search.
        assignment: ``greedy`` or ``hungarian`` matching of the Haim protocol.
        seed: seed of the noise references and baselines.
        allow_incomplete: evaluate an attack that did not finish (diverged).
    """

    against: tuple[str, ...] = ("train", "partition", "noise", "heldout")
    metric: str = "ssim"
    assignment: str = "greedy"
    seed: Seed = 0
    allow_incomplete: bool = False

    @field_validator("against")
    @classmethod
    def _known_sets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_reference_sets(v)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        METRICS.get(v)  # one line listing the valid names
        return v

    @field_validator("assignment")
    @classmethod
    def _known_assignment(cls, v: str) -> str:
        ASSIGNMENTS.get(v)
        return v


class ReportSettings(_Frozen):
    """The ``report`` stage (:func:`datarecon.report.html.render_report`).

    Attributes:
        title: the report's title.
    """

    title: str = "datarecon report"


class Experiment(_Frozen):
    """Train → attack → evaluate → report, one file (docs/RUNS.md).

    Attributes:
        name: a label stored with the experiment.
        train: the target's training config; exactly one of ``train`` and ``model``.
        model: an existing model directory to attack instead of training one (relative paths: to
            the current directory).
        attack: the reconstruction run (:class:`~datarecon.experiments.reconstruct.RunSettings`:
            a ``ReconstructionRun`` without ``model``).
        evaluate: the evaluation settings; ``null`` skips evaluation (and the report).
        report: the report settings; ``null`` skips the report.
    """

    name: str = ""
    train: TrainConfig | None = None
    model: str | None = None
    attack: RunSettings = Field(default_factory=RunSettings)
    evaluate: EvaluateSettings | None = Field(default_factory=EvaluateSettings)
    report: ReportSettings | None = Field(default_factory=ReportSettings)

    @model_validator(mode="after")
    def _one_target(self) -> Experiment:
        if (self.train is None) == (self.model is None):
            raise ValueError("give exactly one of train (a training config) and model (an existing model directory)")
        if self.report is not None and self.evaluate is None:
            raise ValueError("report needs the evaluate stage; set report: null or give evaluate settings")
        return self

    def hash(self) -> str:
        """Hash of everything that determines the experiment's results."""
        return config_hash(self.model_dump(mode="json", exclude={"name"}))

    def reconstruction_run(self, out: str | Path) -> ReconstructionRun:
        """The attack stage as a complete :class:`ReconstructionRun` on this experiment's target."""
        model = Path(out) / MODEL_SUBDIR if self.train is not None else Path(str(self.model))
        return ReconstructionRun(model=str(model), **dict(self.attack))


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment file (one-line errors naming unknown keys, bad values, missing files)."""
    return build_experiment(read_config_mapping(path), where=f"experiment file {path}")


def build_experiment(fields: Mapping[str, Any], *, where: str = "experiment") -> Experiment:
    """Validate a mapping into an :class:`Experiment` (the attack checked with its method's own messages)."""
    data = dict(fields)
    if isinstance(data.get("attack"), Mapping):
        if "model" in data["attack"]:
            raise DataReconError(f"{where}: attack: model: the attack's target is the experiment's own (its train: or "
                                 "model: at the top level); move the model directory to the top-level model: key")
        try:
            run = build_run({**dict(data["attack"]), "model": "-"}, where="run")
        except DataReconError as exc:
            raise DataReconError(f"{where}: attack: {exc}") from None
        data["attack"] = run.model_dump(exclude={"model"})
    return build_config(Experiment, data, where=where)


def finished_stages(out: str | Path, experiment: Experiment) -> list[str]:
    """The stages of ``experiment`` already complete in the folder ``out`` (a rerun skips them); [] for
    a new folder or one of another experiment."""
    out = Path(out)
    state = _state(out) if out.is_dir() else None
    if not state or state.get("config_hash") != experiment.hash():
        return []
    stages = state.get("stages") or {}
    return [s for s in STAGES if stages.get(s) == Status.COMPLETE.value]


def _state(out: Path) -> dict[str, Any] | None:
    """The record ``experiment.json`` of an experiment folder (None without one).

    Raises:
        DataReconError: a damaged record, with how to start the experiment afresh.
    """
    path = out / EXPERIMENT_JSON
    if not path.is_file():
        return None
    try:
        state = read_json(path)
    except DataReconError as exc:
        raise DataReconError(f"{exc}".split("; re-create it")[0] + "; rerun with --overwrite to start the experiment "
                             "afresh (only what datarecon wrote there is replaced)") from None
    if not isinstance(state, dict):
        raise DataReconError(f"{path} does not hold an experiment record; rerun with --overwrite to start afresh")
    return state


def run_experiment(experiment: Experiment, out: str | Path, *, data_dir: str | Path | None = None,
                   overwrite: bool = False, progress: bool = True,
                   record: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Execute ``experiment`` into the folder ``out``; re-running skips finished stages.

    Args:
        experiment: the validated experiment.
        out: the experiment folder (created; an existing one of the same experiment is resumed).
        data_dir: data folder (training, data-dependent initialisations, evaluation).
        overwrite: replace an existing experiment folder (only a datarecon experiment folder).
        progress: show progress.
        record: extra ``run.json`` fields of the attack stage (the CLI records how to continue it).

    Returns:
        Stage name → status (:class:`~datarecon.kernel.status.Status` value, or ``skipped`` for a stage
        the file leaves out).

    Raises:
        DataReconError: bad settings, missing data or model, a folder of another experiment, a
            diverged attack (its last finite state is kept in ``out/run``).
    """
    out = Path(out)
    state = _state(out) if out.is_dir() and not overwrite else None
    if state is not None and state.get("config_hash") != experiment.hash():
        raise DataReconError(f"{out} holds another experiment (config_hash {state.get('config_hash')} != "
                             f"{experiment.hash()}); use a new --out, or --overwrite to start afresh")
    with claim_out_dir(out, kind="experiment", overwrite=overwrite, resume=state is not None) as claim:
        check_experiment(experiment, out, state=state, data_dir=data_dir)
        claim.prepare()
        return _run_stages(experiment, out, state=state, data_dir=data_dir, progress=progress,
                           run_record=dict(record or {}))


def check_experiment(experiment: Experiment, out: Path, *, state: dict[str, Any] | None,
                     data_dir: str | Path | None) -> None:
    """Everything an experiment's stages would refuse that can be checked before its folder is written: the
    model directory, the training's data and pretrained start, and the attack's knowledge against the target.

    Raises:
        DataReconError: one line naming the field of the experiment file.
    """
    if experiment.model is not None and not Path(experiment.model).is_dir():
        what = "is a file, not a model directory" if Path(experiment.model).exists() else "not found"
        raise DataReconError(f"model directory {experiment.model} {what}; train one (`datarecon train`) or "
                             "fix model: in the experiment file")
    trained = ((state or {}).get("stages") or {}).get("train") == Status.COMPLETE.value
    if experiment.train is not None:
        task = load_task(experiment.train.data, data_dir=data_dir)  # missing data: refused before anything is written
        if not trained:
            try:
                check_training(experiment.train, task, out=out / MODEL_SUBDIR, option="pretrained.path")
            except DataReconError as exc:
                raise DataReconError(f"train: {exc}") from None
        target = TargetRecord(fine_tuned=experiment.train.pretrained is not None, n_train=len(task.train),
                              input_shape=tuple(experiment.train.arch_spec().input_shape),
                              batch_norm=experiment.train.arch.batch_norm)
    else:
        meta = read_model_meta(str(experiment.model))
        target = TargetRecord(fine_tuned=isinstance(meta.get("pretrained"), dict),
                              n_train=(meta.get("metrics") or {}).get("n_train"),
                              input_shape=tuple(meta["arch"]["input_shape"]),
                              batch_norm=bool(meta["arch"].get("batch_norm", False)))
    try:
        check_before_target(experiment.reconstruction_run(out), target, cli=False)
    except DataReconError as exc:
        raise DataReconError(f"attack: {exc}") from None


def _run_stages(experiment: Experiment, out: Path, *, state: dict[str, Any] | None, data_dir: str | Path | None,
                progress: bool, run_record: dict[str, Any]) -> dict[str, str]:
    """The stages of :func:`run_experiment` once ``out`` is claimed and prepared."""
    stages: dict[str, str] = dict((state or {}).get("stages") or {})

    def record(stage: str, status: str) -> None:
        stages[stage] = status
        atomic_write_json(out / EXPERIMENT_JSON, {
            "format": FORMAT, "name": experiment.name, "config_hash": experiment.hash(),
            "experiment": experiment.model_dump(mode="json"), "stages": stages, "versions": versions()})

    if state is None:
        record("train", Status.RUNNING if experiment.train is not None else "skipped")
    done = {Status.COMPLETE.value, "skipped"}

    if experiment.train is not None and stages.get("train") not in done:
        record("train", Status.RUNNING)
        train_target(experiment.train, data_dir=data_dir, out=out / MODEL_SUBDIR,
                     resume=folder_state(out / MODEL_SUBDIR, record=MODEL_JSON).present, progress=progress, nested=True)
        record("train", Status.COMPLETE)
    elif experiment.train is None:
        stages["train"] = "skipped"

    if stages.get("attack") not in done:
        record("attack", Status.RUNNING)
        how = RunOptions(resume=folder_state(out / RUN_SUBDIR).present, data_dir=data_dir, progress=progress,
                        raise_on_divergence=True, nested=True)
        rec = execute(experiment.reconstruction_run(out), out / RUN_SUBDIR, how, record=run_record or None)
        record("attack", Status.COMPLETE if rec.status != Status.RUNNING else Status.RUNNING)

    if experiment.evaluate is None:
        record("evaluate", "skipped")
    elif stages.get("evaluate") not in done:
        ev = experiment.evaluate
        record("evaluate", Status.RUNNING)
        run_metrics(out / RUN_SUBDIR, {"against": ev.against, "metric": ev.metric, "assignment": ev.assignment,
                                        "seed": ev.seed, "allow_incomplete": ev.allow_incomplete},
                     data_dir=data_dir, progress=progress)
        attach_membership(out / RUN_SUBDIR, data_dir=data_dir)
        attach_identifiability(out / RUN_SUBDIR, data_dir=data_dir)
        record("evaluate", Status.COMPLETE)

    if experiment.report is None:
        record("report", "skipped")
    elif stages.get("report") not in done:
        record("report", Status.RUNNING)
        render_report([out / RUN_SUBDIR], out=out / REPORT, title=experiment.report.title)
        record("report", Status.COMPLETE)
    return {stage: str(stages.get(stage)) for stage in STAGES}
