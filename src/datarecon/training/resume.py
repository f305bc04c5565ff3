"""Checkpoint and resume, shared by the training loops (:func:`~datarecon.training.fit.fit`,
:func:`~datarecon.training.fit.ascend_margin` and :func:`~datarecon.training.dp.fit_dp`).

A loop starts from :func:`start_or_resume` (afresh, or where its :class:`TrainingCheckpoint` left
it), saves through a :class:`CheckpointHook` with :func:`checkpoint_info` as the metadata, and
reports its end as :func:`loop_status`. A resumed run is bit-identical to an uninterrupted one
(same device, same dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from datarecon.errors import CheckpointError
from datarecon.kernel import checkpoint
from datarecon.kernel.engine import Checkpoint, History, LoopState, NaNStop
from datarecon.kernel.status import Status

__all__ = ["CheckpointHook", "LoopStart", "TrainingCheckpoint", "checkpoint_info", "loop_status", "start_or_resume"]


class TrainingCheckpoint:
    """The training checkpoint of a folder, in the one format of :mod:`datarecon.kernel.checkpoint`.

    Tensors are ``model.<name>`` (the state dict) and ``opt.<name>`` (optimiser moments); the
    metadata holds ``tag``, ``epoch`` and the loop's own fields (history, status, stop rule state).
    Checkpoints in the earlier layout (``state.json`` + ``state-<epoch>.safetensors``) load too.

    Args:
        folder: the checkpoint folder (created on save).
        tag: identifies the run's configuration; a resume with another tag is refused.
    """

    def __init__(self, folder: str | Path, *, tag: str) -> None:
        self.folder = Path(folder)
        self.tag = tag

    def exists(self) -> bool:
        return checkpoint.exists(self.folder)

    def save(self, *, epoch: int, model: nn.Module, opt_tensors: dict[str, torch.Tensor],
             info: dict[str, Any]) -> None:
        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        tensors.update({f"opt.{k}": v for k, v in opt_tensors.items()})
        checkpoint.save(self.folder, tensors, {"tag": self.tag, "epoch": epoch, **info}, kind=checkpoint.Kind.TRAIN)

    def load(self) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Returns (info, model state dict, optimiser tensors).

        Raises:
            CheckpointError: missing/corrupt checkpoint or a different configuration.
        """
        found = checkpoint.load(self.folder, kind=checkpoint.Kind.TRAIN)
        if found is None:
            raise CheckpointError(f"no training checkpoint in {self.folder}; train without --resume")
        tensors, info = found
        if info.get("tag") != self.tag:
            raise CheckpointError(
                f"the checkpoint in {self.folder} was written with another configuration "
                f"(hash {info.get('tag')} != {self.tag}); rerun with the original settings or use --overwrite"
            )
        model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        opt = {k[len("opt."):]: v for k, v in tensors.items() if k.startswith("opt.")}
        return info, model_sd, opt


class _Updating(Protocol):
    """A stepper that says whether it is in the middle of an update (a checkpoint then is no state of the run)."""

    in_update: bool


class CheckpointHook(Checkpoint):
    """:class:`Checkpoint` that skips the final save when the loop was interrupted mid-update."""

    def __init__(self, save: Callable[[LoopState], None], *, every: int, stepper: _Updating) -> None:
        super().__init__(save, every=every)
        self.stepper = stepper

    def after_run(self, state: LoopState) -> None:
        if not self.stepper.in_update:
            self.save(state)


def _restore_model(ckpt: TrainingCheckpoint, model: nn.Module) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Load ``ckpt`` into ``model``; returns (info, optimiser tensors).

    Raises:
        CheckpointError: the checkpoint's weights do not fit ``model``.
    """
    info, model_sd, opt_tensors = ckpt.load()
    try:
        model.load_state_dict(model_sd)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint in {ckpt.folder} does not fit the model "
                              f"({str(exc).splitlines()[0]}); use --overwrite") from None
    return info, opt_tensors


@dataclass(frozen=True)
class LoopStart:
    """Where a training loop starts: afresh, or where its training checkpoint left it.

    Attributes:
        step: steps (epochs) completed before this call, ≥ 0.
        elapsed: wall time of those steps in seconds.
        stop_reason: the checkpointed run's stop reason ("" while it was running).
        finished: the checkpointed run had ended: nothing is left to run.
        info: the checkpoint's metadata; None for a fresh start.
    """

    step: int = 0
    elapsed: float = 0.0
    stop_reason: str = ""
    finished: bool = False
    info: dict[str, Any] | None = None

    def finished_state(self, total: int) -> LoopState:
        """The final loop state of a checkpointed run that had ended (of ``total`` steps)."""
        return LoopState(step=self.step, total=total, stop_reason=self.stop_reason, wall_time_s=self.elapsed)


def start_or_resume(ckpt: TrainingCheckpoint | None, model: nn.Module, history: History, *, resume: bool,
                    load: Callable[[dict[str, Any], dict[str, torch.Tensor]], None]) -> LoopStart:
    """Resume from ``ckpt`` when asked to and there is one: restore ``model``, then the loop's own
    state (``load(info, optimiser tensors)``), then ``history``; otherwise a fresh start.

    Raises:
        CheckpointError: an unusable checkpoint.
    """
    if ckpt is None or not resume or not ckpt.exists():
        return LoopStart()
    info, opt_tensors = _restore_model(ckpt, model)
    load(info, opt_tensors)
    start = LoopStart(step=int(info["epoch"]), elapsed=float(info.get("wall_time_s", 0.0)),
                      stop_reason=info.get("stop_reason", ""), finished=bool(info.get("finished")), info=info)
    history.rows = list(info.get("history", []))
    return start


def checkpoint_info(state: LoopState, history: History, nan_stop: NaNStop, own: dict[str, Any]) -> dict[str, Any]:
    """A training checkpoint's metadata: the loop's progress (history, status, ...) and its own fields ``own``."""
    done = state.stop_reason != "" or state.step >= state.total
    return {"wall_time_s": state.wall_time_s, "history": history.rows, **own,
            "finished": done and not nan_stop.tripped, "status": loop_status(state, nan_stop),
            "stop_reason": state.stop_reason}


def loop_status(state: LoopState, nan_stop: NaNStop) -> Status:
    """The loop's :class:`~datarecon.kernel.status.Status` (the one vocabulary of training and attacks)."""
    if nan_stop.tripped:
        return Status.DIVERGED
    if state.stop_reason == "completed" or (not state.stop_reason and state.step >= state.total):
        return Status.COMPLETE
    if state.stop_reason:
        return Status.STOPPED_EARLY
    return Status.RUNNING
