"""Reference (shadow) models for the membership attacks: trained with the target's recipe, kept, reused.

The reference-model attacks (LiRA, RMIA; :mod:`datarecon.attacks.mia.reference`) compare the target
with K models the attacker trains itself, with the recipe it knows (the target's model directory
records it: architecture, loss, optimiser, learning rate, batch size, epochs, dtype; or, for a
user's own model, the user's training function: :class:`RecipeTrainer`, :class:`FunctionTrainer`) on
random subsets of a **pool** of images. The pool holds every candidate whose membership is asked;
the models train only on its **eligible** part, the target's members and as many non-members of each
class (LiRA's design, Carlini et al. 2022 §4.2): reference model k trains on ``per_class`` images of
every task class drawn from the eligible ones by a generator seeded with SHA-256 of (seed, k)
(:func:`subset`), so each eligible candidate is in half of the models, and the attacker knows which.
An attacker who does not know the answer treats every eligible candidate the same. Each model is then
queried on every pool image (the large non-member draw included, which no model trains on) and on
the population samples (RMIA's z), and its statistics
(:class:`~datarecon.attacks.mia.statistics.ExampleStatistics`) are kept.

Storage, below a membership folder (``OUT``)::

    OUT/target.json                        the model the folder measures (another model's call is refused)
    OUT/pool.safetensors                   the pool (display images, labels, task classes) and the population
    OUT/references/ref-00007/DONE.json     completion marker (:mod:`datarecon.experiments.pipeline.pieces`)
    OUT/references/ref-00007/stats.safetensors   its statistics on the pool and the population, its subset
    OUT/references/ref-00007/weights.safetensors its weights and input mean (``keep_weights``, and always for
                                           the first :data:`KEPT_ALWAYS`, which play the target in turn)

Every reference model is one piece whose hash covers the recipe, the pool's fingerprint, its index
and the seed, and not K; its marker records the SHA-256 of its files, checked whenever they are read
back (:func:`read_checked`): a second call with the same or a larger K reuses every finished model and
trains only the missing ones; a killed call resumes at the first unfinished model. The pieces run as
tasks on the sweep backends (:mod:`datarecon.experiments.backends`: a local process pool, or Ray),
several models per task.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from datarecon.attacks.mia.statistics import example_statistics
from datarecon.config import MAX_SEED, Seed
from datarecon.errors import DataReconError
from datarecon.experiments.backends import Task, make_backend
from datarecon.experiments.execution import Execution
from datarecon.experiments.pipeline.pieces import Context, Piece, execute, is_done, piece_hashes
from datarecon.kernel.engine import LineRate, LoopState, ProgressBar
from datarecon.models.spec import build_model
from datarecon.training.target import TrainConfig, fit_on_images
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.threads import set_threads
from datarecon.kernel.files import DONE_MARKER
from datarecon.utils.io import config_hash, load_tensors, read_json, save_tensors, sha256_file

__all__ = ["AUTO", "FunctionTrainer", "KEPT_ALWAYS", "POOL_FILE", "REFERENCES_DIR", "RecipeTrainer", "ReferenceJob",
           "ReferencePool", "ReferenceSettings", "ReferenceStatistics", "done_record", "import_callable",
           "load_reference_model", "load_statistics", "read_checked", "reference_config", "reference_dir",
           "reference_seed", "reference_worker", "subset", "train_references", "trained_times"]

POOL_FILE = "pool.safetensors"
REFERENCES_DIR = "references"
STATS_FILE = "stats.safetensors"
REFERENCE_WEIGHTS = "weights.safetensors"
#: the most reference models one call may ask for
MAX_REFERENCES = 100_000
#: reference models per backend task (amortises a worker's start-up; each model is its own piece)
PER_TASK = 8
#: seconds between two looks for models finished inside a running task (their completion markers)
POLL_S = 1.0
#: a progress line (in a log) per this fraction of the reference models
PROGRESS_FRACTION = 0.1
#: the first reference models keep their weights whatever ``keep_weights`` says: they play the target in turn to
#: choose the strongest signal, and the white-box signals need their weights there
KEPT_ALWAYS = 4
#: ``count: auto``: the number of reference models follows from the time budget
AUTO = "auto"


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


@dataclass(frozen=True, eq=False)
class ReferencePool:
    """The images the reference models train on and are queried on.

    Attributes:
        x: (N, C, H, W) pool images (the candidates): display-space images in [0, 1] of a model directory, the
            model's own inputs for a user's model.
        y: (N,) their labels in the task's convention.
        classes: (N,) int64 task-class index of each (the subsets are class-balanced).
        z_x: (M, C, H, W) population samples (never in a reference model's training set); z_y: (M,).
        eligible: (N,) bool, the candidates the reference models train on (the members and as many non-members of
            each class: each is in half of the models).
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: torch.Tensor
    z_x: torch.Tensor
    z_y: torch.Tensor
    eligible: torch.Tensor

    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of every tensor of the pool."""
        h = hashlib.sha256()
        for t in (self.x.to(torch.float32), self.y, self.classes, self.z_x.to(torch.float32), self.z_y,
                  self.eligible.to(torch.bool)):
            t = t.detach().contiguous().cpu()
            h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()[:16]

    def save(self, path: Path) -> None:
        save_tensors(path, {"x": self.x, "y": self.y, "classes": self.classes, "z_x": self.z_x, "z_y": self.z_y,
                            "eligible": self.eligible.to(torch.bool)})

    @classmethod
    def load(cls, path: Path) -> ReferencePool:
        t = load_tensors(path)
        if "eligible" not in t and "x" in t:
            raise DataReconError(f"{path} holds reference models trained on the whole pool by an earlier datarecon "
                                 "version; pass --overwrite to train them in LiRA's half-in design")
        try:
            return cls(x=t["x"], y=t["y"], classes=t["classes"], z_x=t["z_x"], z_y=t["z_y"], eligible=t["eligible"])
        except KeyError as exc:
            raise DataReconError(f"{path} lacks the tensor {exc.args[0]!r}; rerun with --overwrite") from None


def reference_seed(seed: int, index: int, what: str) -> int:
    """The seed of reference model ``index``'s ``what`` ("subset", "init"): SHA-256 of (seed, index), below MAX_SEED."""
    digest = hashlib.sha256(f"datarecon-reference-{what}:{int(seed)}:{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % MAX_SEED


def subset(classes: torch.Tensor | np.ndarray, per_class: int | Mapping[int, int], *, seed: int, index: int,
           eligible: torch.Tensor | np.ndarray | None = None) -> np.ndarray:
    """The pool positions reference model ``index`` trains on: ``per_class`` of each task class (a count, or a count
    per class) among the eligible positions (None: all), sorted.

    Drawn by ``torch.randperm`` per class from a generator seeded with SHA-256 of (``seed``, ``index``),
    so any model's subset is recomputed from the seed alone.

    Raises:
        DataReconError: a class with fewer than ``per_class`` eligible pool images.
    """
    c = np.asarray(classes, dtype=np.int64)
    ok = np.ones(c.size, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    gen = torch.Generator().manual_seed(reference_seed(seed, index, "subset"))
    parts = []
    for k in np.unique(c[ok]):
        need = per_class if isinstance(per_class, int) else int(per_class.get(int(k), 0))
        pos = np.flatnonzero((c == k) & ok)
        if pos.size < need:
            raise DataReconError(f"the pool has {pos.size} images of task class {int(k)}, fewer than the {need} "
                                 "per class a reference model trains on; draw more non-members")
        parts.append(pos[torch.randperm(pos.size, generator=gen).numpy()[:need]])
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def reference_config(config: TrainConfig, *, seed: int, index: int, device: str) -> TrainConfig:
    """The target's training config for reference model ``index``: its own initialisation and batch-order
    seed, the given device, no checkpoints and no KKT score (the recipe is otherwise the target's)."""
    return config.model_copy(update={"seed": reference_seed(seed, index, "init"), "device": device, "checkpoint_every": 0,
                                     "kkt_score": False, "log_every": max(config.epochs, 1)})


def _statistics_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: Any) -> dict[str, torch.Tensor]:
    dtype = next(model.parameters()).dtype
    return example_statistics(model, x.to(dtype), y, loss=loss).tensors()


def import_callable(spec: str, *, what: str) -> Callable[..., Any]:
    """``package.module:name`` imported (the user's own code; the current folder is searched first, as ``python -m``
    does).

    Raises:
        DataReconError: not of the form package.module:name, a module that cannot be imported, no such name, or
            not callable.
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise DataReconError(f"{what} {spec!r} must be package.module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        raise DataReconError(f"{what} {spec!r}: module {exc.name!r} not found; run from the folder that holds "
                             "it or install it") from None
    except AttributeError:
        raise DataReconError(f"{what} {spec!r}: {module} has no {name!r}") from None
    if not callable(found):
        raise DataReconError(f"{what} {spec!r} is not callable")
    return found


@dataclass(frozen=True)
class Fitted:
    """A trained reference model: the network (eval mode, CPU), the shift of its inputs (model input = pool image −
    shift) and what its training reported."""

    model: nn.Module
    shift: torch.Tensor
    record: dict[str, Any]


@dataclass(frozen=True)
class RecipeTrainer:
    """Reference models trained by datarecon's own training with a model directory's recorded recipe
    (:func:`~datarecon.training.target.fit_on_images`, a new initialisation and batch order per model).

    Attributes:
        config: the target's training config (the recipe the attacker knows).
    """

    config: TrainConfig

    @property
    def loss(self) -> Any:
        return self.config.loss

    @property
    def label(self) -> str:
        """How the reference models train, in words."""
        return "the model's recorded training recipe"

    def identity(self) -> dict[str, Any]:
        """What the reference models' piece hash covers of the recipe."""
        recipe = self.config.model_dump(mode="json", exclude={"device", "checkpoint_every", "log_every", "kkt_score",
                                                               "seed"})
        return {"recipe": config_hash(recipe)}

    def payload(self) -> dict[str, Any] | None:
        return {"kind": "recipe", "config": self.config.model_dump(mode="json")}

    def fit(self, x: torch.Tensor, y: torch.Tensor, *, seed: int, index: int, device: str) -> Fitted:
        cfg = reference_config(self.config, seed=seed, index=index, device=device)
        fitted = fit_on_images(cfg, x, y, device=device)
        return Fitted(model=fitted.model, shift=fitted.normalisation.mean.to(torch.float64),
                      record={"train_accuracy": fitted.fit.metrics["train_acc"], "train_loss": fitted.fit.metrics["loss"],
                              "epochs_done": fitted.fit.epochs_done})

    def build(self) -> nn.Module:
        return build_model(self.config.arch_spec(), dtype=torch_dtype(self.config.dtype))


@dataclass(frozen=True)
class FunctionTrainer:
    """Reference models of a user's own model, trained by the user's function ``train(x, y, seed) -> nn.Module`` on
    the model's own inputs.

    Attributes:
        train: the training function (the seed is drawn per model from the reference seed).
        blank: ``blank() -> nn.Module`` of the architecture (to load kept weights into).
        loss: the training loss (a ``LOSSES`` name or a callable).
        name: ``package.module:function`` when the function can be imported by name (reference models may then
            train in worker processes), else its qualified name (trained in this process).
        factory: ``package.module:factory`` of the architecture when importable (for the workers), else None.
    """

    train: Callable[..., nn.Module]
    blank: Callable[[], nn.Module]
    loss: Any
    name: str
    factory: str | None = None

    @property
    def label(self) -> str:
        """How the reference models train, in words."""
        return f"your training function {self.name}"

    def identity(self) -> dict[str, Any]:
        return {"train": self.name, "loss": self.loss if isinstance(self.loss, str) else getattr(self.loss,
                                                                                                  "__qualname__", "")}

    def payload(self) -> dict[str, Any] | None:
        if ":" not in self.name or self.factory is None or not isinstance(self.loss, str):
            return None
        return {"kind": "function", "train": self.name, "factory": self.factory, "loss": self.loss, "cwd": os.getcwd()}

    def fit(self, x: torch.Tensor, y: torch.Tensor, *, seed: int, index: int, device: str) -> Fitted:
        model = self.train(x, y, reference_seed(seed, index, "init"))
        if not isinstance(model, nn.Module):
            raise DataReconError(f"the training function {self.name} returned {type(model).__name__}, not an "
                                 "nn.Module; return the trained network")
        return Fitted(model=model.to("cpu").eval(), shift=torch.zeros(x.shape[1:], dtype=torch.float64), record={})

    def build(self) -> nn.Module:
        return self.blank()


Trainer = RecipeTrainer | FunctionTrainer


def trainer_from_payload(payload: dict[str, Any]) -> Trainer:
    """The trainer a worker process rebuilds from :meth:`RecipeTrainer.payload` / :meth:`FunctionTrainer.payload`."""
    if payload["kind"] == "recipe":
        return RecipeTrainer(TrainConfig.model_validate(payload["config"]))
    if payload.get("cwd") and payload["cwd"] not in sys.path:
        sys.path.insert(0, payload["cwd"])
    factory = import_callable(payload["factory"], what="--model")
    return FunctionTrainer(train=import_callable(payload["train"], what="--recipe"), blank=factory,
                           loss=payload["loss"], name=payload["train"], factory=payload["factory"])


def _piece(index: int, job: ReferenceJob) -> Piece:
    """Train reference model ``index`` and keep its statistics (and weights)."""
    settings, pool_key = job.settings, job.pool_key
    keep = settings.keep_weights or index < KEPT_ALWAYS

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        pool = ReferencePool.load(ctx.out / POOL_FILE)
        if pool.fingerprint() != pool_key:
            raise DataReconError(f"{ctx.out / POOL_FILE} changed since this membership folder was planned; rerun "
                                 "with --overwrite")
        pos = subset(pool.classes, job.per_class, seed=settings.seed, index=index, eligible=pool.eligible)
        t0 = time.perf_counter()
        fitted = job.trainer.fit(pool.x[pos], pool.y[pos], seed=settings.seed, index=index, device=ctx.device)
        inside = torch.zeros(pool.x.shape[0], dtype=torch.bool)
        inside[torch.as_tensor(pos)] = True
        shift = fitted.shift
        stats = {f"pool.{k}": v for k, v in _statistics_of(fitted.model, pool.x - shift, pool.y, job.trainer.loss).items()}
        stats.update({f"population.{k}": v for k, v in _statistics_of(fitted.model, pool.z_x - shift, pool.z_y,
                                                                      job.trainer.loss).items()})
        save_tensors(d / STATS_FILE, {**stats, "inside": inside})
        if keep:
            save_tensors(d / REFERENCE_WEIGHTS, {**{f"model.{k}": v for k, v in fitted.model.state_dict().items()},
                                                 "input_mean": shift})
        kept = (STATS_FILE, REFERENCE_WEIGHTS) if keep else (STATS_FILE,)
        return {"index": index, **fitted.record, "pool": pool_key, "sha256": {name: sha256_file(d / name) for name in kept},
                "wall_time_s": time.perf_counter() - t0}

    # "checksummed": models kept before their files' SHA-256 was recorded are trained again, not read unchecked
    spec = {**job.trainer.identity(), "pool": pool_key, "index": index, "seed": settings.seed,
            "per_class": job.per_class, "keep_weights": keep, "checksummed": True}
    return Piece(key=f"{REFERENCES_DIR}/ref-{index:05d}", run=run, spec=spec, kind="reference")


def reference_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Backend task: train reference models ``start`` .. ``stop`` − 1 (top level: spawn and Ray import it).

    Payload: ``out``, ``trainer`` (:func:`trainer_from_payload`), ``pool_key``, ``settings`` (ReferenceSettings
    JSON), ``per_class``, ``start``, ``stop``, ``device``, ``threads``.
    """
    set_threads(payload.get("threads"))
    job = ReferenceJob(out=Path(payload["out"]), trainer=trainer_from_payload(payload["trainer"]),
                       pool_key=payload["pool_key"], settings=ReferenceSettings.model_validate(payload["settings"]),
                       per_class=_per_class(payload["per_class"]))
    return _train_range(job, payload)


def _per_class(value: int | Mapping[str, int]) -> int | dict[int, int]:
    """``per_class`` as JSON carried it (the keys of a per-class count became strings)."""
    return int(value) if isinstance(value, int) else {int(k): int(v) for k, v in value.items()}


def trained_times(out: Path, indices: Iterable[int]) -> list[float]:
    """The training wall times (seconds) the completion markers of reference models ``indices`` record (those that
    record one)."""
    times = [done_record(out, k).get("wall_time_s") for k in indices]
    return [float(t) for t in times if isinstance(t, (int, float))]


def _train_range(job: ReferenceJob, payload: dict[str, Any]) -> dict[str, Any]:
    """Train reference models ``payload["start"]`` .. ``payload["stop"]`` − 1 of ``job`` in this process."""
    pieces = [_piece(k, job) for k in range(int(payload["start"]), int(payload["stop"]))]
    ctx = Context(out=job.out, device=payload.get("device", "cpu"))
    t0 = time.perf_counter()
    records = execute(pieces, ctx, log=lambda _: None)
    return {"ran": sum(r.status == "ran" for r in records), "wall_time_s": time.perf_counter() - t0}


@dataclass(frozen=True)
class ReferenceStatistics:
    """The statistics of K reference models, stacked (float64), and which pool images each trained on.

    Attributes:
        confidence, loss: (K, N) on the pool.
        inside: (K, N) bool, pool image i in model k's training set.
        population_confidence, population_loss: (K, M) on the population samples.
        trained: how many of the K were trained by this call (the others were reused).
        wall_time_s: wall time of this call's training.
    """

    confidence: torch.Tensor
    loss: torch.Tensor
    inside: torch.Tensor
    population_confidence: torch.Tensor
    population_loss: torch.Tensor
    trained: int = 0
    wall_time_s: float = 0.0

    @property
    def count(self) -> int:
        return int(self.inside.shape[0])

    def select(self, models: list[int]) -> ReferenceStatistics:
        """The statistics of the reference models ``models`` only (e.g. all but a pseudo-target)."""
        idx = torch.as_tensor(models, dtype=torch.int64)
        return ReferenceStatistics(confidence=self.confidence[idx], loss=self.loss[idx], inside=self.inside[idx],
                                   population_confidence=self.population_confidence[idx],
                                   population_loss=self.population_loss[idx])


def reference_dir(out: Path, index: int) -> Path:
    """The folder of reference model ``index`` below the membership folder ``out``."""
    return out / REFERENCES_DIR / f"ref-{index:05d}"


def done_record(out: Path, index: int) -> dict[str, Any]:
    """The summary the completion marker of reference model ``index`` records ({} when unreadable)."""
    marker = reference_dir(out, index) / DONE_MARKER
    try:
        summary = read_json(marker).get("summary") if marker.is_file() else None
    except (DataReconError, AttributeError):
        summary = None
    return summary if isinstance(summary, dict) else {}


def read_checked(out: Path, index: int, name: str) -> dict[str, torch.Tensor]:
    """The tensors of file ``name`` of finished reference model ``index``, read only after its SHA-256 matched the
    one its completion marker records (as every other file datarecon reads back).

    Raises:
        DataReconError: a missing file, no recorded checksum (kept by an earlier version), or another checksum.
    """
    d = reference_dir(out, index)
    path, marker = d / name, d / DONE_MARKER
    retrain = f"delete {d} and rerun the --evaluate call into {out} to train that reference model again"
    recorded = (done_record(out, index).get("sha256") or {}).get(name)
    if not path.is_file():
        raise DataReconError(f"{path} is missing; {retrain}")
    if recorded is None:
        raise DataReconError(f"{marker} records no checksum of {name} (an earlier datarecon version kept it), so a "
                             f"changed file would go unnoticed; {retrain}")
    if sha256_file(path) != recorded:
        raise DataReconError(f"{path} does not match the checksum in {marker} (changed or damaged); {retrain}")
    return load_tensors(path)


def load_reference_model(out: Path, index: int, trainer: Trainer) -> tuple[torch.nn.Module, torch.Tensor]:
    """Reference model ``index`` kept under ``out`` (eval mode) and its input shift (C, H, W).

    Raises:
        DataReconError: its weights were not kept (``keep_weights`` off), do not match their checksum or do not fit
            the architecture.
    """
    path = reference_dir(out, index) / REFERENCE_WEIGHTS
    if not path.is_file():
        raise DataReconError(f"{path} is missing: the reference models' weights were not kept; rerun with "
                             "keep_weights on")
    tensors = read_checked(out, index, REFERENCE_WEIGHTS)
    model = copy.deepcopy(trainer.build())
    try:
        model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    except RuntimeError as exc:
        raise DataReconError(f"{path} does not fit the model's architecture ({str(exc).splitlines()[0]}); rerun "
                             "with --overwrite") from None
    return model.eval(), tensors["input_mean"]


def load_statistics(out: Path, count: int, *, trained: int = 0, wall_time_s: float = 0.0) -> ReferenceStatistics:
    """Stack the statistics of reference models 0 .. ``count`` − 1 kept under ``out``.

    Raises:
        DataReconError: a missing or unreadable statistics file, or one that does not match its checksum.
    """
    rows = [read_checked(out, k, STATS_FILE) for k in range(count)]

    def stack(key: str) -> torch.Tensor:
        return torch.stack([r[key].to(torch.float64) for r in rows])

    return ReferenceStatistics(confidence=stack("pool.confidence"), loss=stack("pool.loss"),
                               inside=torch.stack([r["inside"].bool() for r in rows]),
                               population_confidence=stack("population.confidence"),
                               population_loss=stack("population.loss"),
                               trained=trained, wall_time_s=wall_time_s)


def _todo(pieces: list[Piece], out: Path) -> list[int]:
    hashes = piece_hashes(pieces)
    return [k for k, p in enumerate(pieces) if not is_done(out / p.key, hashes[p.key])]


@dataclass(frozen=True)
class ReferenceJob:
    """The reference models of one membership folder: where, with which recipe, on which pool.

    Attributes:
        out: the membership folder (``out/pool.safetensors`` written).
        trainer: how a reference model trains (the recipe the attacker knows).
        pool_key: the pool's fingerprint (:meth:`ReferencePool.fingerprint`).
        settings: K (a number), the seed, whether to keep weights.
        per_class: training images per task class of each model (the target's members per class), a count or a
            count per class.
    """

    out: Path
    trainer: Trainer
    pool_key: str
    settings: ReferenceSettings
    per_class: int | dict[int, int]

    def pieces(self) -> list[Piece]:
        """The pieces of reference models 0 .. K − 1."""
        return [_piece(k, self) for k in range(int(self.settings.count))]


def train_references(job: ReferenceJob, *, execution: Execution = Execution(), device: str = "cpu",
                     log: Callable[[str], None] = print, progress: bool | str = False) -> ReferenceStatistics:
    """Train the reference models that ``job.out`` does not hold yet, then load all K models' statistics.

    Args:
        job: the folder, recipe, pool and settings.
        execution: where the tasks run (backend, workers, Ray address, threads per task).
        device: torch device of the training.
        log: sink of a line when the training starts and when it ends.
        progress: one step per reference model (a :data:`~datarecon.kernel.engine.PROGRESS_MODES` name or a bool:
            a bar on a terminal, a line per :data:`PROGRESS_FRACTION` of the models in a log).

    Raises:
        DataReconError: a failed reference model (the first error; finished ones are kept, a rerun resumes).
    """
    todo = _todo(job.pieces(), job.out)
    t0 = time.perf_counter()
    if todo:
        _run_tasks(job, todo=todo, execution=execution, device=device, log=log, progress=progress)
    return load_statistics(job.out, job.settings.count, trained=len(todo), wall_time_s=time.perf_counter() - t0)


def _chunks(todo: list[int], size: int) -> list[list[int]]:
    """Runs of up to ``size`` consecutive model indices."""
    chunks: list[list[int]] = []
    for k in todo:
        if chunks and chunks[-1][-1] == k - 1 and len(chunks[-1]) < size:
            chunks[-1].append(k)
        else:
            chunks.append([k])
    return chunks


class _Finished:
    """Counts finished reference models as their completion markers appear, whichever process wrote them, so that
    progress moves one model at a time also inside a task of several."""

    def __init__(self, job: ReferenceJob, todo: list[int], bar: ProgressBar) -> None:
        pieces = job.pieces()
        self.hashes, self.keys = piece_hashes(pieces), {k: pieces[k].key for k in todo}
        self.out, self.left, self.bar = job.out, list(todo), bar
        self.state = LoopState(step=0, total=len(todo))
        bar.before_run(self.state)

    def poll(self) -> None:
        done = [k for k in self.left if is_done(self.out / self.keys[k], self.hashes[self.keys[k]])]
        for k in done:
            self.left.remove(k)
            self.state.step += 1
            self.bar.after_step(self.state)

    def close(self) -> None:
        self.bar.after_run(self.state)


def _run_tasks(job: ReferenceJob, *, todo: list[int], execution: Execution, device: str,
               log: Callable[[str], None], progress: bool | str) -> None:
    """Fan the unfinished models out as tasks (one model each in the driver, up to :data:`PER_TASK` consecutive ones
    in worker processes, where a task's start-up is worth sharing); progress counts models as they finish."""
    trainer = job.trainer.payload()
    worker: Callable[[dict[str, Any]], dict[str, Any]] = reference_worker
    if trainer is None:  # a function that cannot be imported by name: it trains in this process only
        if not (execution.backend == "local" and (execution.workers or 1) == 1):
            raise DataReconError(f"{job.trainer.label} cannot be imported by "
                                 "name, so its reference models train in this process only; use one worker (or "
                                 "name it package.module:function)")
        worker = functools.partial(_train_range, job)
    base = {"out": str(job.out), "trainer": trainer, "pool_key": job.pool_key,
            "settings": job.settings.model_dump(mode="json"), "per_class": job.per_class, "device": device,
            "threads": execution.threads}
    log(f"training {len(todo)} reference models ({job.settings.count - len(todo)} kept from an earlier call) on "
        f"backend {execution.backend} ({execution.workers or 1} worker(s)) ...")
    failures: list[str] = []
    t0 = time.perf_counter()
    bar = ProgressBar(desc="reference models", unit="model", mode=progress,
                      rate=LineRate(interval_s=0.0, min_fraction=PROGRESS_FRACTION))
    with make_backend(execution.backend, worker, workers=execution.workers,
                      **execution.backend_options()) as be:
        size = 1 if getattr(be, "in_process", False) else PER_TASK
        tasks = [Task(key=f"ref-{c[0]:05d}-{c[-1]:05d}", payload={**base, "start": c[0], "stop": c[-1] + 1})
                 for c in _chunks(todo, size)]
        finished = _Finished(job, todo, bar)
        while tasks or be.in_flight:
            while tasks and be.in_flight < be.capacity:
                be.submit(tasks.pop(0))
            failures += [f"{o.task.key}: {o.error}" for o in be.wait(timeout=POLL_S) if not o.ok]
            finished.poll()
        finished.close()
    log(f"{len(todo) - len(finished.left)} reference models trained in {time.perf_counter() - t0:.0f} s")
    if failures:
        raise DataReconError(f"{len(failures)} reference-model tasks failed (first: {failures[0]}); the finished "
                             "models are kept: fix the cause and rerun into the same --out to resume")
