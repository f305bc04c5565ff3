"""Train a target model from a typed config and write its model directory.

:class:`TrainConfig` maps one-to-one to a YAML/TOML file (``datarecon.config.load_config_file``)::

    data: {dataset: cifar10, task: vehicles-animals, n_per_class: 250}
    arch: {name: mlp, hidden: [1000, 1000], bias: false, init_scale: 1.0e-4}
    loss: logistic
    lr: 0.01
    epochs: 1000000
    stop: {margin_patience: 10000}

:func:`train_target` loads the task, builds the model from a seeded ``torch.Generator``, trains
full batch (:func:`datarecon.training.fit.fit`) with periodic checkpoints in ``OUT/checkpoint/``,
and writes ``OUT/`` with :func:`datarecon.models.checkpoint.save_model_dir` plus
``history.jsonl``. :func:`model_card` renders a model directory for humans.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import ConfigDict, Field, model_validator

from datarecon.config import MAX_SEED, MAX_STEPS, RecordedConfig, build_config
from datarecon.data import DATASETS, DataSpec, Normalisation, load_task
from datarecon.errors import DataReconError, DivergenceError
from datarecon.kernel.checkpoint import Kind
from datarecon.kernel.engine import LoopOptions
from datarecon.kernel.files import ASCENT_CHECKPOINT_DIR, CHECKPOINT_DIR, HISTORY, MODEL_JSON
from datarecon.kernel.losses import LOSSES
from datarecon.kernel.outdir import claim_out_dir
from datarecon.kernel.resume import Store, folder_state, recorded_progress
from datarecon.kernel.status import Status
from datarecon.kernel.step import TrainingRecipe
from datarecon.models.checkpoint import ModelDescription, TrainingRecord, save_model_dir
from datarecon.models.spec import ArchSpec, build_model, is_homogeneous
from datarecon.registry import registered
from datarecon.training.card import ascent_curve_lines, model_card
from datarecon.training.configs import ArchConfig, MarginAscentConfig, StopConfig
from datarecon.training.dp import DPConfig, fit_dp
from datarecon.training.dp import resolve as resolve_dp
from datarecon.training.fit import CurveProbe, FitResult, ascend_margin, evaluate, fit, training_store
from datarecon.training.kkt_regime import homogeneity_degree, kkt_regime_score
from datarecon.training.margin import EXP_TAILED
from datarecon.training.optim import OPTIMIZERS, SCHEDULES
from datarecon.training.pretrained import (
    PretrainedConfig,
    PretrainedStart,
    check_compatible,
    check_disjoint,
    check_not_its_own_start,
    pretrained_record,
    resolve_pretrained,
    start_model,
)
from datarecon.utils.device import parse_device
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.io import atomic_write_text, config_hash, params_digest

# the configs' parts and the model card live in their own modules; imported from here as before
__all__ = ["ArchConfig", "FittedModel", "MarginAscentConfig", "StopConfig", "TargetMeasures", "TrainConfig",
           "TrainResult", "ascent_curve_lines", "build_train_config", "check_resumable_model", "check_training",
           "fit_on_images", "model_card", "pin_training_images", "train_target", "training_tag"]

class TrainConfig(RecordedConfig):
    """Everything that determines a trained target (one-to-one with a YAML/TOML file).

    Attributes:
        data: the data spec (dataset, task, n_per_class, selection, ...).
        arch: architecture choices.
        loss: ``LOSSES`` key; must fit the task (binary losses for binary tasks,
            ``cross-entropy`` for multiclass).
        weight_decay: wd ≥ 0 in E = mean L + (wd/2)‖θ‖².
        optimizer: ``OPTIMIZERS`` key.
        lr: learning rate > 0 (initial step of the L-BFGS line search).
        momentum: heavy-ball momentum in [0, 1) (``gd`` only).
        epochs: maximum number of full-batch epochs (≥ 1).
        schedule: ``SCHEDULES`` key (gd only).
        max_lr_factor: cap of the learning rate of growing schedules, relative to ``lr``; None: no
            cap (``loss-normalised`` on logistic / cross-entropy then steps lr·∇log L, in the log domain).
        margin_ascent: optional second stage after the epochs (:class:`MarginAscentConfig`).
        stop: early stops (of the GD epochs).
        dtype: ``float32`` | ``float64`` (parameters and inputs).
        device: ``cpu`` | ``cuda[:N]`` (not part of the config hash).
        seed: seed of the initialisation generator.
        checkpoint_every: epochs between training checkpoints (0: only at the end; not hashed).
        log_every: epochs between history rows.
        kkt_score: record the KKT-regime score in the model card (not hashed: it changes no weight).
        dp: DP-SGD instead of full-batch training (:class:`datarecon.training.dp.DPConfig`; needs
            ``pip install 'datarecon[dp]'``): ``epochs`` then counts epochs of round(n / batch_size)
            Poisson-sampled steps, and ε at δ from Opacus's accountant enters the model card.
        batch_size: mini-batch SGD (optimizer ``gd``, schedule ``constant``): each epoch takes
            ⌈n/b⌉ steps over batches drawn from ``seed`` and the epoch
            (:func:`datarecon.kernel.step.batch_order`, so the order is recorded by the seed);
            None: full batch.
        pretrained: fine-tune from this pretrained model directory (its weights, batch norm in eval
            mode, a new head drawn from ``seed`` where the classes differ; its training images must
            not be this training's); None: train from ``seed``'s initialisation.
        norm_mode: how batch norm runs in the training steps: ``train`` (each batch's statistics, the
            running ones moved toward them), ``eval`` (the running statistics fixed, the affine weights
            trained) or ``auto`` (eval when fine-tuning, as SimuDy does; train from scratch).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    added_fields: ClassVar[tuple[str, ...]] = ("batch_size", "pretrained", "norm_mode")  # unset: hashes as before

    data: DataSpec
    arch: ArchConfig = ArchConfig()
    loss: Annotated[str, registered(LOSSES)] = "logistic"
    weight_decay: float = Field(default=0.0, ge=0)
    optimizer: Annotated[str, registered(OPTIMIZERS)] = "gd"
    lr: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    epochs: int = Field(default=1000, ge=1, le=MAX_STEPS)
    schedule: Annotated[str, registered(SCHEDULES)] = "constant"
    max_lr_factor: float | None = Field(default=1e6, ge=1)
    margin_ascent: MarginAscentConfig = MarginAscentConfig()
    stop: StopConfig = StopConfig()
    dtype: Literal["float32", "float64"] = "float32"
    device: str = "cpu"
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    checkpoint_every: int = Field(default=1000, ge=0)
    log_every: int = Field(default=100, ge=1)
    kkt_score: bool = False
    dp: DPConfig | None = None
    batch_size: int | None = Field(default=None, ge=1)
    pretrained: PretrainedConfig | None = None
    norm_mode: Literal["auto", "train", "eval"] = "auto"

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        largest = torch.finfo(torch_dtype(self.dtype)).max
        if self.lr > largest:
            raise DataReconError(f"lr {self.lr:g} is beyond the range of {self.dtype} (largest {largest:.3g}); "
                                 "pass a smaller --lr")
        if self.optimizer != "gd" and self.momentum:
            raise DataReconError(f"momentum applies to optimizer gd only; set momentum 0 for {self.optimizer}")
        if self.optimizer != "gd" and self.schedule != "constant":
            raise DataReconError(f"schedule {self.schedule!r} applies to optimizer gd only; use constant")
        if self.norm_mode != "auto" and not self.arch.batch_norm:
            raise DataReconError(f"norm_mode {self.norm_mode!r} sets how batch norm runs in the training steps and "
                                 f"this {self.arch.name} has no batch norm; drop --norm-mode (norm_mode), or train a "
                                 "ResNet with --batch-norm")
        if self.margin_ascent.steps:
            if self.loss not in EXP_TAILED:
                raise DataReconError(f"margin ascent needs an exponentially tailed loss ({', '.join(EXP_TAILED)}), "
                                     f"not {self.loss!r}; set margin_ascent steps to 0")
            if self.weight_decay:
                raise DataReconError("margin ascent maximises the margin of an unregularised loss; "
                                     "with weight decay the minimiser is finite: set margin_ascent steps to 0")
        if self.dp is not None and (clash := self._clashes(dp=False, stop=True)):
            raise DataReconError("dp (DP-SGD) needs optimizer gd, schedule constant, no margin ascent and no stop "
                                 f"rules (its length is epochs); got {clash}: drop it or the dp settings (--dp-*)")
        if self.batch_size is not None and (clash := self._clashes(dp=True, stop=False)):
            raise DataReconError("batch_size (mini-batch SGD) needs optimizer gd, schedule constant, no dp and no "
                                 f"margin ascent; got {clash}: drop it or batch_size (--batch-size)")
        kind = self.data.resolved_task().label_kind
        need = LOSSES.get(self.loss).label_kind
        if need not in ("any", kind):
            fits = [n for n in LOSSES.names() if LOSSES.get(n).label_kind in ("any", kind)]
            raise DataReconError(
                f"loss {self.loss!r} does not fit the {kind} task {self.data.task!r}; use one of: {', '.join(fits)}"
            )
        return self

    def check_applies(self) -> None:
        """Refuse settings that would do nothing (the stop rules' own, :meth:`StopConfig.check_applies`, and a learning-
        rate cap of a schedule that never grows). Checked where a training is asked for (``datarecon train``), not on
        reading a model directory's record.

        Raises:
            DataReconError: naming the option and the one it needs.
        """
        self.stop.check_applies()
        if self.schedule == "constant" and self.max_lr_factor != type(self).model_fields["max_lr_factor"].default:
            raise DataReconError(f"max_lr_factor {self.max_lr_factor} (--max-lr-factor) caps a growing learning rate and "
                                 "schedule constant never grows: pass --schedule loss-normalised (or increasing), or "
                                 "drop --max-lr-factor")

    def _clashes(self, *, dp: bool, stop: bool) -> str:
        """The settings that mini-batch SGD and DP-SGD do not run with, as given (each with its flag); "" for none.
        ``dp``/``stop``: whether DP-SGD and the stop rules count."""
        found = [f"optimizer {self.optimizer} (--optimizer)" if self.optimizer != "gd" else "",
                 f"schedule {self.schedule} (--schedule)" if self.schedule != "constant" else "",
                 "dp (--dp-*)" if dp and self.dp is not None else "",
                 f"margin_ascent steps {self.margin_ascent.steps} (--margin-ascent-steps)"
                 if self.margin_ascent.steps else "",
                 *(f"stop.{k} {v} ({'--stop-at-zero-error' if k == 'zero_error' else '--' + k.replace('_', '-')})"
                   for k, v in (self.stop.model_dump(exclude_defaults=True).items() if stop else ()))]
        return ", ".join(f for f in found if f)

    def recipe(self) -> TrainingRecipe:
        """How the target is trained: the epochs (:func:`~datarecon.training.fit.fit`,
        :func:`~datarecon.training.dp.fit_dp`; ``seed`` orders the mini-batches and DP-SGD's batches and
        noise) and the margin-ascent stage after them, if any."""
        return TrainingRecipe(loss=self.loss, weight_decay=self.weight_decay, optimizer=self.optimizer, lr=self.lr,
                         momentum=self.momentum, epochs=self.epochs, schedule=self.schedule,
                         max_lr_factor=self.max_lr_factor, batch_size=self.batch_size, seed=self.seed,
                         norm_mode=self.resolved_norm_mode,
                         margin_ascent=self.margin_ascent.recipe() if self.margin_ascent.steps else None)

    @property
    def resolved_norm_mode(self) -> Literal["train", "eval"]:
        """``norm_mode`` with ``auto`` resolved: eval when fine-tuning, train from scratch."""
        if self.norm_mode != "auto":
            return self.norm_mode
        return "eval" if self.pretrained is not None else "train"

    def arch_spec(self) -> ArchSpec:
        """The architecture with input shape and output count derived from the data spec."""
        task = self.data.resolved_task()
        info = DATASETS.get(self.data.dataset)
        outputs = 1 if task.label_kind == "binary" else task.num_classes
        return self.arch.spec(input_shape=tuple(info.input_shape), num_outputs=outputs)

    def hash(self) -> str:
        """Hash of the fields that determine the result (``device`` and ``checkpoint_every`` excluded)."""
        data = self.model_dump(mode="json", exclude={"device", "checkpoint_every", "kkt_score"})
        if self.arch.kernel is None:
            data["arch"].pop("kernel")  # unset: hashes stay those of configs written before the field existed
        if not self.margin_ascent.steps:
            data.pop("margin_ascent")  # off: hashes stay those of configs written before the field existed
        elif self.margin_ascent.rtol is None:
            data["margin_ascent"].pop("window", None)  # without the stop rule it places curve points only
        if self.dp is None:
            data.pop("dp")  # likewise
        if self.pretrained is not None:  # the weights, not where they lie (unresolved: the path)
            p = self.pretrained
            data["pretrained"] = {"sha256": p.sha256} if p.sha256 is not None else {"path": p.path}
        return config_hash(data)


def build_train_config(fields: dict[str, Any], *, where: str = "training config") -> TrainConfig:
    """Validate a mapping into a :class:`TrainConfig` (one-line :class:`DataReconError` on failure)."""
    return build_config(TrainConfig, fields, where=where)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train_target` produced.

    Attributes:
        out: the model directory.
        model: the trained network (on the training device/dtype).
        arch: its architecture.
        metrics: the metrics saved in ``model.json``.
        fit: the :class:`~datarecon.training.fit.FitResult`.
        config: the training config.
    """

    out: Path
    model: torch.nn.Module
    arch: ArchSpec
    metrics: dict[str, Any]
    fit: FitResult
    config: TrainConfig


@dataclass(frozen=True)
class TargetMeasures:
    """What a training measures on its target besides its own metrics (none of it changes a weight).

    Attributes:
        kkt_score: compute the KKT-regime score (as ``TrainConfig.kkt_score``; either one turns it on).
        ascent_probe: given the loaded task, what the margin-ascent curve measures at its points besides the
            margin (e.g. :func:`datarecon.experiments.identifiability.kkt_gap_probe`: the identifiability gap;
            the training side defines the slot, the caller who holds more fills it); None: the margin only.
    """

    kkt_score: bool = False
    ascent_probe: Callable[[Any], CurveProbe] | None = None


def train_target(config: TrainConfig, *, data_dir: str | Path | None = None, out: str | Path,
                 resume: bool = False, overwrite: bool = False, progress: bool = True,
                 measures: TargetMeasures = TargetMeasures(), nested: bool = False) -> TrainResult:
    """Train the target described by ``config`` and write its model directory to ``out``.

    Args:
        config: the training config.
        data_dir: data folder (default ``$DATARECON_DATA`` / user cache).
        out: the model directory to write (must not exist unless ``overwrite`` or ``resume``).
        resume: continue from ``out/checkpoint/`` when present (the config hash must match).
        overwrite: replace an existing ``out``.
        progress: show a progress bar.
        measures: the KKT-regime score and the margin-ascent curve's probe (:class:`TargetMeasures`).
        nested: ``out`` lies inside a folder the caller claimed itself (a demo, an experiment, a
            reproduction piece); otherwise a path inside another datarecon folder is refused.

    Returns:
        :class:`TrainResult`.

    Raises:
        DataReconError: bad config / data; DataMissingError: no data files;
        CheckpointError: unusable checkpoint on resume; DivergenceError: training produced NaN/inf.
    """
    out = Path(out)
    device = parse_device(config.device)
    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    with claim_out_dir(out, kind="model", overwrite=overwrite, resume=resume, nested=nested) as claim:
        task = load_task(config.data, data_dir=data_dir)  # before touching out: bad data leaves no folder
        config, start = check_training(config, task, out=out)
        if resume:
            check_resumable_model(out, config=config, task=task)
        claim.prepare()
        probe = measures.ascent_probe
        return _train(config, task, out=out, device=device, resume=resume, progress=progress,
                      measures=TargetMeasures(measures.kkt_score, probe(task) if probe and config.margin_ascent.steps
                                              else None), start=start)


def check_training(config: TrainConfig, task: Any, *, out: str | Path,
                   option: str = "--pretrained") -> tuple[TrainConfig, PretrainedStart | None]:
    """What a training checks before its model directory ``out`` is written (an experiment, before its folder):
    a usable DP setting and a pretrained model that fits the config and its data and is not ``out`` itself
    (``option``: how messages name the pretrained setting).

    Returns:
        The config with the images ``n_train`` drew named (:func:`pin_training_images`) and the pretrained
        weights' SHA-256 filled in, and the resolved pretrained start (or None).

    Raises:
        DataReconError: one line naming the problem.
    """
    config = pin_training_images(config, task)
    if config.dp is not None:  # an unusable DP setting (delta, epsilon, no opacus)
        resolve_dp(config.dp, n=len(task.train), epochs=config.epochs)
    if config.pretrained is None:
        return config, None
    return _resolve_pretrained(config, task, out=out, option=option)


def pin_training_images(config: TrainConfig, task: Any) -> TrainConfig:
    """``config`` with the training images its ``n_train`` drew (``task.train``) as ``data.train_indices``.

    model.json then records the draw itself beside its rule (``n_train``, ``seed``); loading that data
    spec draws again and refuses a draw that differs (:func:`datarecon.data.draw.pick_training`).
    A config that draws nothing, or names its images already, is returned as it is (its hash unchanged).
    """
    data = config.data
    if data.n_train is None or data.train_indices is not None:
        return config
    named = data.model_copy(update={"train_indices": tuple(int(i) for i in task.train.indices)})
    return config.model_copy(update={"data": named})


def _resolve_pretrained(config: TrainConfig, task: Any, *, out: str | Path,
                        option: str = "--pretrained") -> tuple[TrainConfig, PretrainedStart]:
    """The pretrained model of ``config`` checked against it, its data and ``out``, and the config with the
    weights' SHA-256 filled in (what its hash covers)."""
    if config.pretrained is None:
        raise ValueError("no pretrained model in the config")
    start = resolve_pretrained(config.pretrained, option=option)
    check_not_its_own_start(start, out)
    check_compatible(start, config.arch_spec(), config.data)
    check_disjoint(start, task)
    pinned = config.pretrained.model_copy(update={"sha256": start.sha256})
    return config.model_copy(update={"pretrained": pinned}), start


#: separates the config hash from the data fingerprint in a training checkpoint's tag
_DATA_TAG = "+data:"
#: then, for a fine-tuning, the start of its pretrained weights' SHA-256 (a resume names a changed start)
_PRETRAINED_TAG = "+pretrained:"


def _checkpoint_tag(out: Path) -> str | None:
    """The tag of the training checkpoint in ``out`` (None without one)."""
    progress = recorded_progress(out / CHECKPOINT_DIR, kind=Kind.TRAIN)
    tag = progress.resume_key if progress is not None else None
    return tag if isinstance(tag, str) else None


def training_tag(config: TrainConfig, task: Any, *, out: Path | None = None) -> str:
    """The tag of this training's checkpoints: the config hash, a hash of the training data and, for a
    fine-tuning, its pretrained weights' SHA-256 (16 digits).

    With ``out`` (a resume), a checkpoint written before tags carried the data (the config hash alone) or the
    pretrained weights keeps its old tag, so it still resumes.
    """
    tag = f"{config.hash()}{_DATA_TAG}{config_hash(task.fingerprint())}"
    found = _checkpoint_tag(out) if out is not None else None
    if found == config.hash() or (found == tag and config.pretrained is not None):
        return found
    if config.pretrained is not None and config.pretrained.sha256:
        tag += f"{_PRETRAINED_TAG}{config.pretrained.sha256[:16]}"
    return tag


def check_resumable_model(out: Path, *, config: TrainConfig, task: Any) -> None:
    """Refuse to resume a training in ``out`` with other training data or other pretrained weights than its
    checkpoint's, naming which (either changes the config's tag, which would otherwise read as "another
    configuration").

    Raises:
        DataReconError: the checkpoint was written for other data (e.g. another ``--data-dir``) or from other
            pretrained weights (the pretrained folder retrained since).
    """
    found = _checkpoint_tag(out)
    if found is None or _DATA_TAG not in found:
        return
    found, _, was = found.partition(_PRETRAINED_TAG)
    pre = config.pretrained
    if was and pre is not None and was != (pre.sha256 or "")[:16]:
        raise DataReconError(f"the checkpoint in {out} was trained from other pretrained weights than those in "
                             f"{pre.path} now (weights sha256 {was[:12]} then, {(pre.sha256 or '')[:12]} now: retrained "
                             "or replaced since?); restore those weights, or pass the directory that holds them, to "
                             "resume, or start afresh with --overwrite")
    cfg, data = found.split(_DATA_TAG, 1)
    mine = training_tag(config, task).split(_DATA_TAG, 1)[1].partition(_PRETRAINED_TAG)[0]
    if cfg == config.hash() and data != mine:
        raise DataReconError(f"the training data found now differ from those the checkpoint in {out} was trained "
                             f"on (data fingerprint {mine} != {data}); point --data-dir (or $DATARECON_DATA) at the "
                             "original data to resume, or start afresh with --overwrite")


def _initial_model(config: TrainConfig, arch: ArchSpec, *, dtype: torch.dtype,
                   start: PretrainedStart | None) -> tuple[torch.nn.Module, dict[str, Any] | None]:
    """θ_init: drawn from the seed, or the pretrained start (then also model.json's ``pretrained`` record)."""
    if start is None:
        return build_model(arch, generator=torch.Generator().manual_seed(config.seed), dtype=dtype), None
    model, fresh = start_model(start, arch, config.data, seed=config.seed, dtype=dtype)
    return model, pretrained_record(start, fresh_head=fresh)


def _train(config: TrainConfig, task: Any, *, out: Path, device: torch.device, resume: bool, progress: bool,
           measures: TargetMeasures, start: PretrainedStart | None = None) -> TrainResult:
    """The body of :func:`train_target` once ``out`` is claimed and prepared (``measures.ascent_probe``: the
    curve's probe itself, built from the task)."""
    kkt_score, probe = measures.kkt_score, measures.ascent_probe
    dtype = torch_dtype(config.dtype)
    tag = training_tag(config, task, out=out if resume else None)
    arch = config.arch_spec()
    model, pretrained = _initial_model(config, arch, dtype=dtype, start=start)
    model = model.to(device)
    init_sha256 = params_digest(dict(model.named_parameters()))
    norm = task.normalisation
    x = norm.to_model(task.train.x).to(device=device, dtype=dtype)
    y = task.train.y.to(device)
    if y.dtype.is_floating_point:
        y = y.to(dtype)
    loop = LoopOptions(log_every=config.log_every, progress=progress, checkpoint_every=config.checkpoint_every,
                       resume=resume)
    result = _fit_epochs(config, model, x, y, checkpoint=training_store(out / CHECKPOINT_DIR, tag=tag), loop=loop)
    if result.status == Status.DIVERGED:
        raise DivergenceError(
            f"training diverged after {result.epochs_done} epochs ({result.stop_reason}); "
            f"lower --lr (now {config.lr:g}) and rerun with --overwrite"
        )
    gd_result, history = result, list(result.history)
    ascent: dict[str, Any] = {}
    separated = bool(float(result.margins.min()) > 0) if result.margins.numel() else False
    if config.margin_ascent.steps and result.status != Status.RUNNING and not separated:
        warnings.warn("margin ascent skipped: the training data are not separated after the epochs "
                      "(train longer or with a larger --lr)", stacklevel=2)
        ascent = {"margin_ascent_steps": 0, "margin_ascent_status": "skipped",
                  "margin_ascent_stop_reason": "training data not separated"}
    if config.margin_ascent.steps and result.status != Status.RUNNING and separated:
        result = ascend_margin(model, x, y, loss=config.loss, ascent=config.margin_ascent.recipe(), loop=loop,
                               checkpoint=training_store(out / ASCENT_CHECKPOINT_DIR, tag=tag), probe=probe)
        history += [{**row, "stage": "margin-ascent", "step": gd_result.epochs_done + row["step"]}
                    for row in result.history]
        ascent = {"margin_ascent_steps": result.epochs_done, "margin_ascent_status": result.status,
                  "margin_ascent_stop_reason": result.stop_reason,
                  "margin_ascent_wall_time_s": result.wall_time_s,
                  "normalised_margin_before_ascent": gd_result.metrics["normalised_margin"],
                  "margin_ascent_curve": [_nonfinite_as_text(p) for p in result.extra["curve"]]}
    metrics: dict[str, Any] = {
        "status": gd_result.status, "stop_reason": gd_result.stop_reason, "epochs_done": gd_result.epochs_done,
        "wall_time_s": gd_result.wall_time_s + float(ascent.get("margin_ascent_wall_time_s", 0.0)),
        "n_train": int(x.shape[0]), **ascent,
        "train_loss": result.metrics["loss"], "train_energy": result.metrics["energy"],
        "train_accuracy": result.metrics["train_acc"], "min_margin": result.metrics["min_margin"],
        "mean_margin": result.metrics["mean_margin"], "weight_norm": result.metrics["weight_norm"],
        "normalised_margin": result.metrics["normalised_margin"],
        "homogeneous": is_homogeneous(arch), "homogeneity_degree": homogeneity_degree(model),
    }
    metrics.update({f"dp_{k}": v for k, v in result.extra.get("dp", {}).items()})
    if len(task.heldout):
        metrics.update(_heldout_metrics(model, task, loss=config.loss, device=device, dtype=dtype))
    if kkt_score or config.kkt_score:
        score = kkt_regime_score(model, x, y)
        metrics.update({"kkt_regime_score": score.score, "kkt_num_active": score.num_active})
    model_cpu = model.to("cpu").eval()
    if resume and _finished_before(out, config, gd_result, result):  # nothing ran: the folder is the result
        return TrainResult(out=out, model=model, arch=arch, metrics=metrics, fit=result, config=config)
    save_model_dir(out, model=model_cpu, description=ModelDescription(
        arch=arch, loss=config.loss, weight_decay=config.weight_decay, data=config.data.model_dump(mode="json"),
        normalisation=norm.kind, training={**config.model_dump(mode="json"), "config_hash": config.hash()},
        seed=config.seed,
    ), record=TrainingRecord(
        input_mean=norm.mean, indices={"train": task.train.indices, "partition": task.partition.indices,
                                       "heldout": task.heldout.indices},
        metrics=metrics, extra_tensors={"train_margins": result.margins}, init_sha256=init_sha256,
        data_fingerprint=task.fingerprint(), pretrained=pretrained,
    ))
    atomic_write_text(out / HISTORY, "".join(json.dumps(_nonfinite_as_text(r), sort_keys=True) + "\n" for r in history))
    return TrainResult(out=out, model=model, arch=arch, metrics=metrics, fit=result, config=config)


def _finished_before(out: Path, config: TrainConfig, *results: FitResult) -> bool:
    """``out`` holds this training's model and every loop of it (``results``: the epochs, the ascent) had ended
    before this call: a finished training resumed, which rewrites nothing."""
    state = folder_state(out, record=MODEL_JSON)
    recorded = (state.record or {}).get("training") or {}
    return (state.finished and recorded.get("config_hash") == config.hash()
            and all(r.epochs_done == r.resumed_from for r in results))


@dataclass(frozen=True)
class FittedModel:
    """A model trained in memory by :func:`fit_on_images` (no model directory).

    Attributes:
        model: the trained network (CPU, eval mode).
        normalisation: its input normalisation, fitted on its own training images.
        fit: the :class:`~datarecon.training.fit.FitResult` of its epochs.
    """

    model: torch.nn.Module
    normalisation: Any
    fit: FitResult


def fit_on_images(config: TrainConfig, x: torch.Tensor, y: torch.Tensor, *, device: str = "cpu",
                  loop: LoopOptions = LoopOptions(progress=False)) -> FittedModel:
    """Train a fresh model with ``config``'s architecture and recipe on the images ``x`` (a reference model).

    What :func:`train_target` does between loading the data and writing the model directory: the
    normalisation of ``config.data`` fitted on ``x``, the architecture initialised from
    ``config.seed`` (or the pretrained start of a fine-tuning, its new head from ``config.seed``), the epochs (full batch, mini-batch or DP-SGD) and the margin ascent when the
    config has one; the data spec's own selection is not used.

    Args:
        config: the training config (its ``seed`` draws the initialisation and the batch order).
        x: (n, C, H, W) display-space images in [0, 1]; y: (n,) labels in the task's convention.
        device: where to train.
        loop: loop options (no checkpoints are written).

    Raises:
        DataReconError: data that do not fit the config; DivergenceError: the training diverged.
    """
    dev = parse_device(device)
    dtype = torch_dtype(config.dtype)
    norm = Normalisation.fit(config.data.normalisation, x)
    start = resolve_pretrained(config.pretrained) if config.pretrained is not None else None
    model, _ = _initial_model(config, config.arch_spec(), dtype=dtype, start=start)  # a fine-tuning starts as it did
    model = model.to(dev)
    xm = norm.to_model(x).to(device=dev, dtype=dtype)
    ym = y.to(dev)
    if ym.dtype.is_floating_point:
        ym = ym.to(dtype)
    result = _fit_epochs(config, model, xm, ym, checkpoint=None, loop=loop)
    if result.status == Status.DIVERGED:
        raise DivergenceError(f"training diverged after {result.epochs_done} epochs ({result.stop_reason})")
    if config.margin_ascent.steps and bool(float(result.margins.min()) > 0):
        ascend_margin(model, xm, ym, loss=config.loss, ascent=config.margin_ascent.recipe(), loop=loop)
    return FittedModel(model=model.to("cpu").eval(), normalisation=norm, fit=result)


def _fit_epochs(config: TrainConfig, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                checkpoint: Store | None, loop: LoopOptions) -> FitResult:
    """The epochs of ``config``: full-batch / mini-batch GD or L-BFGS (:func:`fit`), or DP-SGD
    (:func:`datarecon.training.dp.fit_dp`) when ``config.dp`` is set; checkpoints in ``checkpoint``."""
    if config.dp is not None:
        return fit_dp(model, x, y, recipe=config.recipe(), dp=config.dp, loop=loop, checkpoint=checkpoint)
    return fit(model, x, y, recipe=config.recipe(), stop=config.stop.rule(), loop=loop, checkpoint=checkpoint)


def _heldout_metrics(model: torch.nn.Module, task: Any, *, loss: str, device: torch.device,
                     dtype: torch.dtype) -> dict[str, Any]:
    """Loss and accuracy of the trained model on the task's held-out images (model input space)."""
    xh = task.normalisation.to_model(task.heldout.x).to(device=device, dtype=dtype)
    yh = task.heldout.y.to(device)
    if yh.dtype.is_floating_point:
        yh = yh.to(dtype)
    held, _ = evaluate(model, xh, yh, loss=loss)
    return {"heldout_loss": held["loss"], "heldout_accuracy": held["train_acc"], "n_heldout": int(xh.shape[0])}


def _nonfinite_as_text(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in row.items()}
