"""Resume: the one protocol by which every resumable loop checkpoints and continues, and the one schema of
what its checkpoint records.

A loop (target training, margin ascent, DP-SGD, an attack run; a reference model's training is one more) is a
:class:`~datarecon.kernel.run_loop.RunLoop` over a *stepper*, the object whose state the steps change. To resume,
the stepper is :class:`Resumable` (its tensors, a JSON record of the rest, and how to load both back) and the loop
is given a :class:`Store`: where its checkpoint lives and the identity key it resumes under. Then
:meth:`RunLoop.resume <datarecon.kernel.run_loop.RunLoop.resume>` brings back the stepper, the history and the
stop rules' memory, and :meth:`RunLoop.run_resumed <datarecon.kernel.run_loop.RunLoop.run_resumed>` either
returns a finished run's recorded end (nothing written) or runs the steps left with checkpoints.

Every checkpoint's metadata is one :class:`Progress` (``schema`` :data:`SCHEMA`)::

    resume_key   the identity of the run (training: its configuration tag; an attack: its resume key);
                 a checkpoint resumes only under the same key
    steps_done   steps (epochs) completed;  total: the steps the loop was asked for
    status       running | complete | stopped-early | diverged (kernel/status.py)
    stop_reason  why it ended ("" while running)
    wall_time_s  time spent, resumes included (a timing field)
    metrics      the last step's metrics
    stop_state   the stop rules' memory, one mapping per rule in the loop's order
    history      the history rows (training); absent where the caller keeps them (an attack's history.jsonl)
    stepper      the stepper's own record (optimiser scalars, the ascent's curve, DP batch sizes; an attack's
                 method and config hash)

Checkpoints written before this schema are read too (:meth:`Progress.from_meta`): training's ``tag`` /
``epoch`` / ``finished`` vocabulary and the attacks' ``config_hash`` / ``resume_key`` / ``steps_done`` one; the
next save writes them in this schema.

:func:`folder_state` is the one reading of a folder that a command resumes as a whole (a run directory, a model
directory, a reproduction's piece).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from datarecon.errors import CheckpointError, DataReconError
from datarecon.kernel import checkpoint
from datarecon.kernel.engine import LoopState, send_fault
from datarecon.kernel.files import CHECKPOINT_DIR, PROGRESS_FILE, RUN_JSON
from datarecon.kernel.status import Status
from datarecon.utils.io import read_json

#: the ``schema`` of a checkpoint's metadata (:class:`Progress`)
SCHEMA = "datarecon-progress/1"

#: the loop's own fields in the two vocabularies before :data:`SCHEMA` (everything else was the stepper's)
_OLD_TRAINING = ("tag", "epoch", "wall_time_s", "history", "finished", "status", "stop_reason", "last_margin")
_OLD_ATTACK = ("resume_key", "steps_done", "total", "wall_time_s", "status", "stop_reason", "metrics", "early_stop")


def _floats(values: Mapping[str, Any] | None) -> dict[str, float]:
    """Metrics read back: JSON ``null`` (and the strings older versions wrote, ``"nan"``, ``"inf"``) as floats."""
    return {k: math.nan if v is None else float(v) for k, v in (values or {}).items()}


@dataclass(frozen=True)
class Progress:
    """Where a loop stands, as its checkpoint records it (the fields of the module docstring)."""

    resume_key: str | None
    steps_done: int
    total: int | None
    status: Status
    stop_reason: str = ""
    wall_time_s: float = 0.0
    metrics: Mapping[str, float] = field(default_factory=dict)
    stop_state: tuple[Mapping[str, Any], ...] = ()
    history: list[dict[str, Any]] | None = None
    stepper: Mapping[str, Any] = field(default_factory=dict)

    def to_meta(self) -> dict[str, Any]:
        """The checkpoint metadata (JSON-able; ``history`` left out when the checkpoint does not hold it)."""
        meta = {"schema": SCHEMA, "resume_key": self.resume_key, "steps_done": self.steps_done, "total": self.total,
                "status": str(self.status), "stop_reason": self.stop_reason, "wall_time_s": self.wall_time_s,
                "metrics": dict(self.metrics), "stop_state": [dict(s) for s in self.stop_state],
                "stepper": dict(self.stepper)}
        if self.history is not None:
            meta["history"] = list(self.history)
        return meta

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], *, kind: checkpoint.Kind) -> Progress:
        """A checkpoint's metadata in this schema, or in the vocabulary its ``kind`` of loop wrote before it.

        Raises:
            CheckpointError: metadata that is no progress record (a field missing or of the wrong type).
        """
        try:
            if meta.get("schema") == SCHEMA:
                return cls(resume_key=meta.get("resume_key"), steps_done=int(meta["steps_done"]),
                           total=None if meta.get("total") is None else int(meta["total"]),
                           status=Status.parse(meta["status"]), stop_reason=str(meta.get("stop_reason") or ""),
                           wall_time_s=float(meta.get("wall_time_s") or 0.0), metrics=_floats(meta.get("metrics")),
                           stop_state=tuple(dict(s or {}) for s in meta.get("stop_state") or ()),
                           history=meta.get("history"), stepper=dict(meta.get("stepper") or {}))
            return _from_training(meta) if kind == checkpoint.Kind.TRAIN else _from_attack(meta)
        except (KeyError, TypeError, ValueError, DataReconError):
            raise CheckpointError("a checkpoint's progress record is damaged (a field is missing or not what it "
                                  "should be); delete the checkpoint folder and rerun without --resume") from None

    def finished(self, total: int) -> bool:
        """Nothing is left to run for a loop of ``total`` steps: it diverged, stopped early, or completed
        ``total`` steps (a complete attack asked for more steps continues)."""
        if self.status in (Status.DIVERGED, Status.STOPPED_EARLY):
            return True
        return self.status is Status.COMPLETE and self.steps_done >= total

    def end_state(self) -> LoopState:
        """The final :class:`~datarecon.kernel.engine.LoopState` of a finished run, as recorded."""
        total = self.steps_done if self.total is None else self.total
        return LoopState(step=self.steps_done, total=total, metrics=dict(self.metrics),
                         stop_reason=self.stop_reason, wall_time_s=self.wall_time_s)


def _from_training(meta: Mapping[str, Any]) -> Progress:
    """Training's vocabulary before :data:`SCHEMA`: ``tag``, ``epoch``, ``finished``, ``last_margin``, ..."""
    status = Status.parse(meta["status"]) if meta.get("status") else (
        Status.COMPLETE if meta.get("finished") else Status.RUNNING)
    return Progress(resume_key=meta.get("tag"), steps_done=int(meta["epoch"]), total=None, status=status,
                    stop_reason=str(meta.get("stop_reason") or ""), wall_time_s=float(meta.get("wall_time_s") or 0.0),
                    stop_state=({"last_margin": meta["last_margin"]},) if "last_margin" in meta else (),
                    history=list(meta.get("history") or []),
                    stepper={k: v for k, v in meta.items() if k not in _OLD_TRAINING})


def _from_attack(meta: Mapping[str, Any]) -> Progress:
    """The attacks' vocabulary before :data:`SCHEMA`: a complete run's last checkpoint said ``running``."""
    status = Status.parse(meta.get("status") or Status.RUNNING)
    if status is Status.RUNNING and meta.get("stop_reason") == "completed":
        status = Status.COMPLETE
    return Progress(resume_key=meta.get("resume_key"), steps_done=int(meta["steps_done"]),
                    total=None if meta.get("total") is None else int(meta["total"]), status=status,
                    stop_reason=str(meta.get("stop_reason") or ""), wall_time_s=float(meta.get("wall_time_s") or 0.0),
                    metrics=_floats(meta.get("metrics")),
                    stop_state=(dict(meta["early_stop"]),) if meta.get("early_stop") else (),
                    stepper={k: v for k, v in meta.items() if k not in _OLD_ATTACK})


class Resumable(Protocol):
    """A stepper whose state a checkpoint holds: its tensors, a JSON record of the rest, and how to load both."""

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def state_record(self) -> dict[str, Any]: ...

    def load_state(self, tensors: dict[str, torch.Tensor], record: Mapping[str, Any]) -> None: ...


class ModelState:
    """A network's weights (tensors ``model.<name>``) with a stepper's own state (``opt.<name>`` and its
    record): what a training checkpoint holds.

    Args:
        model: the network (loaded in place).
        stepper: the optimiser side (:class:`Resumable`; its tensors are stored under ``opt.``).
    """

    def __init__(self, model: nn.Module, stepper: Resumable) -> None:
        self.model, self.stepper = model, stepper

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        tensors.update({f"opt.{k}": v for k, v in self.stepper.state_tensors().items()})
        return tensors

    def state_record(self) -> dict[str, Any]:
        return self.stepper.state_record()

    def load_state(self, tensors: dict[str, torch.Tensor], record: Mapping[str, Any]) -> None:
        """Raises: CheckpointError: the checkpoint's weights do not fit the model."""
        weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        try:
            self.model.load_state_dict(weights)
        except RuntimeError as exc:
            raise CheckpointError(f"the checkpoint does not fit the model ({str(exc).splitlines()[0]}); "
                                  "use --overwrite") from None
        self.stepper.load_state({k[len("opt."):]: v for k, v in tensors.items() if k.startswith("opt.")}, record)


#: test-only fault injection: ``"<folder name>:<step>:<signal>"`` (e.g. ``run1:70:KILL``) sends the signal
#: (KILL, INT, TERM) to this process right after the checkpoint of the loop whose checkpoint folder lies in
#: that folder (a run directory, a model directory) was saved at that step, so a fault trial can land
#: between two runs' checkpoints without racing the clock
FAULT_ENV = "DATARECON_FAULT_AFTER_CHECKPOINT"


def _fault_after_checkpoint(folder: Path, step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, at, sig = (spec.split(":") + ["KILL"])[:3]
    if folder.parent.name == name and step == int(at):
        send_fault(getattr(signal, f"SIG{sig}"))


@dataclass(frozen=True)
class Store:
    """Where a loop's checkpoint lives and the key it resumes under.

    Attributes:
        folder: the checkpoint folder (:data:`~datarecon.kernel.files.CHECKPOINT_DIR` of a model or run
            directory, :data:`~datarecon.kernel.files.ASCENT_CHECKPOINT_DIR` of a model directory).
        key: the run's identity (:attr:`Progress.resume_key`).
        kind: which kind of loop writes it (a loop refuses another kind's checkpoint).
        check: the refusal of a checkpoint another run wrote, given its :class:`Progress` (None: its key must
            be ``key``, else a :class:`~datarecon.errors.CheckpointError`).
        keep_previous: keep the checkpoint before the latest (the runs of a coupled group).
        history: the checkpoint holds the history rows (False: the caller keeps them elsewhere).
    """

    folder: Path
    key: str
    kind: checkpoint.Kind
    check: Callable[[Progress], None] | None = None
    keep_previous: bool = False
    history: bool = True

    def exists(self) -> bool:
        return checkpoint.exists(self.folder)

    def load(self, *, previous: bool = False) -> tuple[dict[str, torch.Tensor], Progress] | None:
        """The checkpoint's (tensors, progress), checked to be this run's; None when there is none.

        Raises:
            CheckpointError: a corrupt checkpoint, another kind's, or (by default) another key's;
            whatever ``check`` raises.
        """
        found = checkpoint.load(self.folder, kind=self.kind, previous=previous)
        if found is None:
            return None
        tensors, meta = found
        progress = Progress.from_meta(meta, kind=self.kind)
        if self.check is not None:
            self.check(progress)
        elif progress.resume_key != self.key:
            raise CheckpointError(f"the checkpoint in {self.folder} was written with another configuration "
                                  f"(hash {progress.resume_key} != {self.key}); rerun with the original settings "
                                  "or use --overwrite")
        return tensors, progress

    def save(self, tensors: dict[str, torch.Tensor], progress: Progress) -> None:
        """Write one checkpoint (:func:`datarecon.kernel.checkpoint.save`), then the test-only fault hook."""
        checkpoint.save(self.folder, tensors, progress.to_meta(), kind=self.kind, keep_previous=self.keep_previous)
        _fault_after_checkpoint(self.folder, progress.steps_done)


@dataclass(frozen=True)
class Start:
    """Where a loop starts: afresh (``progress`` None), or where its checkpoint left it.

    Attributes:
        progress: the checkpoint's :class:`Progress`, or None for a fresh start.
    """

    progress: Progress | None = None

    @property
    def step(self) -> int:
        """Steps done before this call."""
        return 0 if self.progress is None else self.progress.steps_done

    @property
    def elapsed(self) -> float:
        """Wall time of those steps (s)."""
        return 0.0 if self.progress is None else self.progress.wall_time_s

    def finished(self, total: int) -> bool:
        """The checkpointed run had ended (:meth:`Progress.finished`): nothing is left to run, nothing to write."""
        return self.progress is not None and self.progress.finished(total)


@dataclass(frozen=True)
class FolderState:
    """What a folder that a command resumes as a whole holds (:func:`folder_state`).

    Attributes:
        path: the folder.
        record: its record file, parsed (None: absent or unreadable).
        finished: the record says the folder's work is done (a finished status, or a marker without one) and
            matches the key asked for.
        checkpoint: a checkpoint folder is there (an unfinished loop can continue).
    """

    path: Path
    record: dict[str, Any] | None
    finished: bool
    checkpoint: bool

    @property
    def present(self) -> bool:
        """The folder exists (a stage that wrote anything there continues with resume)."""
        return self.path.is_dir()


def folder_state(folder: str | Path, *, record: str = RUN_JSON, key: Mapping[str, Any] | None = None) -> FolderState:
    """The one reading of a folder a command resumes: a run directory (``run.json``), a model directory
    (``model.json``), a reproduction's piece (``DONE.json``).

    Args:
        folder: the folder.
        record: the file a finished folder holds.
        key: fields the record must hold with these values to count as this work's (e.g. a piece's ``hash``,
            a run's ``resume_key``).

    Returns:
        :class:`FolderState`: ``finished`` when the record is readable, matches ``key`` and its ``status`` is a
        finished one (a record without ``status``, a completion marker, is finished by being there).
    """
    folder = Path(folder)
    found: dict[str, Any] | None = None
    if (folder / record).is_file():
        try:
            parsed = read_json(folder / record)
        except DataReconError:
            parsed = None
        found = parsed if isinstance(parsed, dict) else None
    finished = found is not None and all(found.get(k) == v for k, v in (key or {}).items())
    if finished and "status" in found:
        try:
            finished = Status.parse(str(found["status"])).finished
        except DataReconError:
            finished = False
    return FolderState(path=folder, record=found, finished=finished, checkpoint=(folder / CHECKPOINT_DIR).is_dir())


def recorded_progress(folder: str | Path, *, kind: checkpoint.Kind) -> Progress | None:
    """The progress a checkpoint folder's readable copy (``progress.json``) records, in either vocabulary; None
    without one or when it is unreadable (for messages and identity checks before anything is loaded)."""
    path = Path(folder) / PROGRESS_FILE
    try:
        meta = read_json(path) if path.is_file() else None
        return Progress.from_meta(meta, kind=kind) if isinstance(meta, dict) else None
    except DataReconError:
        return None


__all__ = ["FAULT_ENV", "SCHEMA", "FolderState", "ModelState", "Progress", "Resumable", "Start", "Store",
           "folder_state", "recorded_progress"]
