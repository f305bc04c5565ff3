"""Training and resuming the reference (shadow) models of a membership folder: one resumable piece per model.

The reference-model attacks (LiRA, RMIA; :mod:`datarecon.attacks.mia.reference`) compare the target
with K models the attacker trains itself, with the recipe it knows (:mod:`.trainers`: a model
directory's recorded recipe, or a user's own training function) on random subsets of a **pool** of
images. The pool holds every candidate whose membership is asked; the models train only on its
**eligible** part, the target's members and as many non-members of each class (LiRA's design,
Carlini et al. 2022 §4.2): reference model k trains on ``per_class`` images of every task class drawn
from the eligible ones by a generator seeded with SHA-256 of (seed, k) (:func:`subset`), so each
eligible candidate is in half of the models, and the attacker knows which. An attacker who does not
know the answer treats every eligible candidate the same. Each model is then queried on every pool
image (the large non-member draw included, which no model trains on) and on the population samples
(RMIA's z), and its statistics (:class:`~datarecon.attacks.mia.statistics.ExampleStatistics`) are kept
(:mod:`.reference_store`: where, and how they are read back).

Every reference model is one piece (:mod:`datarecon.experiments.pipeline.pieces`) whose hash covers the
recipe, the pool's fingerprint, its index and the seed, and not K: a second call with the same or a
larger K reuses every finished model and trains only the missing ones; a killed call resumes at the
first unfinished model; a call whose pieces would replace finished models made with other settings is
refused before anything is written (:func:`refuse_other_models`). The pieces run as tasks on the sweep
backends (:mod:`datarecon.experiments.backends`: a local process pool, or Ray), several models per task.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from datarecon.attacks.mia.statistics import example_statistics
from datarecon.errors import DataReconError
from datarecon.experiments.backends import Task, make_backend
from datarecon.experiments.execution import Execution
from datarecon.experiments.membership.reference_store import (KEPT_ALWAYS, POOL_FILE, REFERENCE_WEIGHTS, STATS_FILE,
                                                              ReferencePool, ReferenceStatistics, done_record,
                                                              finished_references, load_statistics, reference_key)
from datarecon.experiments.membership.settings import ReferenceSettings
from datarecon.experiments.membership.trainers import Trainer, reference_seed, trainer_from_payload
from datarecon.experiments.pipeline.pieces import Context, Piece, execute, is_done, piece_hashes
from datarecon.kernel.engine import LineRate, LoopState, ProgressBar
from datarecon.kernel.files import MEMBERSHIP_RESULT
from datarecon.utils.io import read_json, save_tensors, sha256_file
from datarecon.utils.threads import set_threads

__all__ = ["PER_TASK", "ReferenceJob", "refuse_other_models", "reference_worker", "subset", "train_references",
           "trained_times"]

#: reference models per backend task (amortises a worker's start-up; each model is its own piece)
PER_TASK = 8
#: seconds between two looks for models finished inside a running task (their completion markers)
POLL_S = 1.0
#: a progress line (in a log) per this fraction of the reference models
PROGRESS_FRACTION = 0.1


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


def _statistics_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: Any) -> dict[str, torch.Tensor]:
    dtype = next(model.parameters()).dtype
    return example_statistics(model, x.to(dtype), y, loss=loss).tensors()


@dataclass(frozen=True)
class ReferenceJob:
    """The reference models of one membership folder: where, with which recipe, on which pool.

    Attributes:
        out: the membership folder (``out/pool.safetensors`` written).
        trainer: how a reference model trains (the recipe the attacker knows).
        pool_key: the pool's fingerprint (:meth:`~.reference_store.ReferencePool.fingerprint`).
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
    return Piece(key=reference_key(index), run=run, spec=spec, kind="reference")


def refuse_other_models(job: ReferenceJob) -> None:
    """Refuse, before anything is written, a call whose reference models would be trained over finished ones of the
    folder that were made with other settings (another ``--reference-seed``, ``--no-reference-keep-weights`` or
    recipe): their pieces' hashes differ, so the call would replace them, and the folder's evaluation with them.
    ``job.settings.count`` is not read: every finished model is checked.

    Raises:
        DataReconError: how many would be replaced, the settings the folder's evaluation recorded, and the ways on.
    """
    finished = finished_references(job.out)
    if not finished:
        return
    planned = ReferenceJob(out=job.out, trainer=job.trainer, pool_key=job.pool_key,
                           settings=job.settings.fixed(max(finished) + 1), per_class=job.per_class).pieces()
    hashes = piece_hashes(planned)
    other = [k for k, state in finished.items() if (state.record or {}).get("hash") != hashes[planned[k].key]]
    if not other:
        return
    try:
        recorded = (read_json(job.out / MEMBERSHIP_RESULT).get("settings") or {}).get("references") or {}
    except DataReconError:
        recorded = {}
    mine = job.settings
    was = []
    if recorded.get("seed") not in (None, mine.seed):
        was.append(f"--reference-seed {recorded['seed']}")
    if recorded.get("keep_weights") not in (None, mine.keep_weights):
        was.append("--reference-keep-weights" if recorded["keep_weights"] else "--no-reference-keep-weights")
    made = f"made with {' '.join(was)}" if was else "made with another --reference-seed, weights setting or recipe"
    raise DataReconError(f"--out {job.out} holds {len(other)} finished reference models {made}, not this call's "
                         f"(--reference-seed {mine.seed}); this call would train over them: pass the folder's settings "
                         "again, choose another --out, or pass --overwrite to replace them")


def reference_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Backend task: train reference models ``start`` .. ``stop`` − 1 (top level: spawn and Ray import it).

    Payload: ``out``, ``trainer`` (:func:`~.trainers.trainer_from_payload`), ``pool_key``, ``settings``
    (ReferenceSettings JSON), ``per_class``, ``start``, ``stop``, ``device``, ``threads``.
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


def _todo(pieces: list[Piece], out: Path) -> list[int]:
    hashes = piece_hashes(pieces)
    return [k for k, p in enumerate(pieces) if not is_done(out / p.key, hashes[p.key])]


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


class FinishedModels:
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
        count = len(tasks)
        finished = FinishedModels(job, todo, bar)
        while tasks or be.in_flight:
            while tasks and be.in_flight < be.capacity:
                be.submit(tasks.pop(0))
            failures += [o.error or "" for o in be.wait(timeout=POLL_S) if not o.ok]
            finished.poll()
        finished.close()
    log(f"{len(todo) - len(finished.left)} reference models trained in {time.perf_counter() - t0:.0f} s")
    if failures:
        first = failures[0].removeprefix(f"{DataReconError.__name__}: ")
        raise DataReconError(f"{first} ({len(failures)} of {count} reference-model tasks failed; the finished models "
                             "are kept: fix the cause and rerun into the same --out to resume)")
