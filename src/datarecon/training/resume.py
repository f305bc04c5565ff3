"""Checkpoint and resume, shared by the training loops (:func:`~datarecon.training.fit.fit`,
:func:`~datarecon.training.fit.ascend_margin` and :func:`~datarecon.training.dp.fit_dp`).

Each loop is a :class:`~datarecon.kernel.run_loop.RunLoop`; it starts from :func:`start_or_resume`
(afresh, or where its :class:`TrainingCheckpoint` left it) and saves through the loop's checkpoint
with :func:`checkpoint_info` as the metadata. A resumed run is bit-identical to an uninterrupted
one (same device, same dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datarecon.errors import CheckpointError
from datarecon.kernel import checkpoint
from datarecon.kernel.engine import LoopState
from datarecon.kernel.run_loop import RunLoop, check_key

__all__ = ["LoopStart", "TrainingCheckpoint", "checkpoint_info", "start_or_resume"]


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
        check_key(info, "tag", self.tag, refuse=lambda found: CheckpointError(
            f"the checkpoint in {self.folder} was written with another configuration "
            f"(hash {found} != {self.tag}); rerun with the original settings or use --overwrite"))
        model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        opt = {k[len("opt."):]: v for k, v in tensors.items() if k.startswith("opt.")}
        return info, model_sd, opt


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


def start_or_resume(ckpt: TrainingCheckpoint | None, model: nn.Module, loop: RunLoop, *, resume: bool,
                    load: Callable[[dict[str, Any], dict[str, torch.Tensor]], None]) -> LoopStart:
    """Resume from ``ckpt`` when asked to and there is one: restore ``model``, then the stepper's own
    state (``load(info, optimiser tensors)``), then ``loop``'s history; otherwise a fresh start.

    Raises:
        CheckpointError: an unusable checkpoint.
    """
    if ckpt is None or not resume or not ckpt.exists():
        return LoopStart()
    info, opt_tensors = _restore_model(ckpt, model)
    load(info, opt_tensors)
    start = LoopStart(step=int(info["epoch"]), elapsed=float(info.get("wall_time_s", 0.0)),
                      stop_reason=info.get("stop_reason", ""), finished=bool(info.get("finished")), info=info)
    loop.restore(info.get("history", []))
    return start


def checkpoint_info(state: LoopState, loop: RunLoop, own: dict[str, Any]) -> dict[str, Any]:
    """A training checkpoint's metadata: the loop's progress (history, status, ...) and its own fields ``own``."""
    done = state.stop_reason != "" or state.step >= state.total
    return {"wall_time_s": state.wall_time_s, "history": loop.history.rows, **own,
            "finished": done and not loop.diverged, "status": loop.status(state),
            "stop_reason": state.stop_reason}
