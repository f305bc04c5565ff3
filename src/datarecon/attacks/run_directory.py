"""The files of one attack run: checkpoint, ``history.jsonl``, ``run.json`` and candidates.

Layout (docs/dev/CONTRACTS.md)::

    candidates.safetensors   x (m, C, H, W) model input space, labels, multipliers, score_<name>
    init.safetensors         x0 (m, C, H, W) model input space: the start of a data-initialised run
                             (ground-truth, partition, mix), for the evaluation's headline rule
    run.json                 model_dir, method, config, config_hash, seed, versions, status, steps_done,
                             wall_time_s, stop_reason, final, selection, extra, message
    history.jsonl            one JSON object per logged step
    checkpoint/                    the attack state + generator state and its metadata (the one schema,
                                   :class:`datarecon.kernel.resume.Progress`: resume key, steps done, status,
                                   ...; the method and config hash as the stepper's record), in the format of
                                   :mod:`datarecon.kernel.checkpoint`

:class:`RunDirectory` owns these files; the optimisation itself
(:class:`datarecon.attacks.loop.AttackLoop` on :class:`datarecon.kernel.run_loop.RunLoop`) writes none of them.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from datarecon.kernel import checkpoint
from datarecon.attacks.base import Reconstruction
from datarecon.kernel.checkpoint import PROGRESS_FILE, STATE_FILE
from datarecon.errors import DataReconError
from datarecon.kernel.resume import Progress, Store
from datarecon.kernel.run_loop import check_key
from datarecon.kernel.status import Status
from datarecon.utils.io import (
    append_json_line,
    atomic_write_json,
    atomic_write_text,
    load_tensors,
    read_json,
    read_json_lines,
    save_tensors,
    to_jsonable,
)
from datarecon.kernel.files import CANDIDATES, HISTORY, INIT_FILE, RUN_JSON

CHECKPOINT_DIR = checkpoint.FOLDER
GENERATOR_KEY = "__generator_state__"


def load_checkpoint(out: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The checkpointed (state, metadata) of a run directory, or None if it has none.

    Raises:
        CheckpointError: a corrupt checkpoint, or a training checkpoint.
    """
    return checkpoint.load(Path(out) / CHECKPOINT_DIR, kind=checkpoint.Kind.ATTACK)


def save_checkpoint(out: str | Path, state: dict[str, torch.Tensor], meta: dict[str, Any],
                    *, generator: torch.Generator | None = None) -> None:
    """Write the state (+ generator state) and its metadata atomically (:func:`datarecon.kernel.checkpoint.save`)."""
    tensors = dict(state)
    if generator is not None:
        tensors[GENERATOR_KEY] = generator.get_state()
    checkpoint.save(Path(out) / CHECKPOINT_DIR, tensors, meta, kind=checkpoint.Kind.ATTACK)


def write_candidates(out: str | Path, rec: Reconstruction) -> None:
    """Write ``candidates.safetensors``: x, labels, multipliers and ``score_<name>`` tensors."""
    tensors = {"x": rec.x, "labels": rec.labels, "multipliers": rec.multipliers}
    tensors.update({f"score_{k}": v for k, v in rec.scores.items()})
    save_tensors(Path(out) / CANDIDATES, tensors)


def read_run(out: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read (candidates tensors, run.json) of a finished run directory."""
    out = Path(out)
    return load_tensors(out / CANDIDATES), read_json(out / RUN_JSON)


class RunState:
    """An attack run's resumable state (:class:`datarecon.kernel.resume.Resumable`): the attack's tensors
    (``x``, multipliers, optimiser moments, ...) with its generator's state (``__generator_state__``), and the
    run's method and config hash as the record.

    Args:
        state: the attack state, filled in place by :meth:`load_state` (the dict the loop steps).
        generator: the run's generator (its state restored in place).
        record: ``method`` and ``config_hash``.
    """

    def __init__(self, state: dict[str, torch.Tensor], generator: torch.Generator, record: dict[str, Any]) -> None:
        self.state, self.generator, self.record = state, generator, record

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {**self.state, GENERATOR_KEY: self.generator.get_state()}

    def state_record(self) -> dict[str, Any]:
        return dict(self.record)

    def load_state(self, tensors: dict[str, torch.Tensor], record: Any) -> None:
        tensors = dict(tensors)
        generator = tensors.pop(GENERATOR_KEY, None)
        if generator is not None:
            self.generator.set_state(generator)
        self.state.update(tensors)


class RunDirectory:
    """One attack run's folder: resumes from, and writes, the files of the module docstring.

    Args:
        path: the run directory (created by :meth:`begin`).
        record: the fields every ``run.json`` of this run starts with (``model_dir``, ``method``,
            ``config``, ``config_hash``, ``resume_key``, ``seed``, ``versions``, ``m``, extras).
    """

    def __init__(self, path: str | Path, record: dict[str, Any]) -> None:
        self.path = Path(path)
        self.record = record

    def store(self, *, key: str, chash: str, keep_previous: bool = False) -> Store:
        """The run's checkpoint (``checkpoint/``) as the run loop resumes and saves it: under the resume key,
        refusing another run's checkpoint (:meth:`check_resume`), the history kept in ``history.jsonl``.

        Args:
            key: the run's resume key (:func:`datarecon.attacks.runner.resume_key`).
            chash: the run's resume hash (:func:`datarecon.attacks.runner.resume_hash`).
            keep_previous: keep the checkpoint before the latest (a run of a coupled group).
        """
        return Store(self.path / CHECKPOINT_DIR, key=key, kind=checkpoint.Kind.ATTACK, keep_previous=keep_previous,
                     history=False, check=lambda progress: self.check_resume(progress, key=key, chash=chash))

    def check_resume(self, progress: Progress, *, key: str, chash: str) -> None:
        """Refuse a checkpoint written by another configuration, target, prior or initialisation.

        Raises:
            DataReconError: the checkpoint's config hash or resume key is another run's; one from before
                resume keys against another model directory.
        """
        out, model_dir, meta = self.path, self.record.get("model_dir"), progress.stepper
        check_key(meta, "config_hash", chash, refuse=lambda found: DataReconError(
            f"{out} was run with another method/config (checkpoint {meta.get('method')}, "
            f"config_hash {found} != {chash}); use the same settings to resume or a new --out"))
        if progress.resume_key is not None:
            check_key({"resume_key": progress.resume_key}, "resume_key", key, refuse=lambda found: DataReconError(
                f"{out} was run against another model, initialisation, seed or prior (resume key "
                f"{found} != {key}); resume with the same --model and settings or choose a new --out"))
            return
        # a checkpoint from before resume keys: at least the model directory must be the same
        try:
            recorded = read_json(out / RUN_JSON).get("model_dir")
        except DataReconError:
            recorded = None
        if recorded is not None and model_dir is not None and recorded != model_dir:
            raise DataReconError(f"{out} was run against the model {recorded}, not {model_dir}; resume with the "
                                 "same --model or choose a new --out")
        # stack: here, resume, run_attack, its caller
        warnings.warn(f"{out}: checkpoint predates resume keys; only its config and model path could be checked",
                      UserWarning, stacklevel=4)

    def history(self, *, upto: int) -> list[dict[str, float]]:
        """The rows of ``history.jsonl`` up to step ``upto`` (none when the file is missing at step 0).

        Raises:
            DataReconError: the file is missing while the checkpoint is past step 0 (every run writes it before its
                first checkpoint; a resume would record a history without the rows before the checkpoint).
        """
        if upto > 0 and not (self.path / HISTORY).is_file():
            raise DataReconError(f"{self.path / HISTORY} is missing, yet the run's checkpoint is at step {upto}: its "
                                 "history before the checkpoint cannot be rebuilt; restore the file, or pass "
                                 "--overwrite to start afresh")
        return read_json_lines(self.path / HISTORY, upto=upto)

    def begin(self, history_rows: list[dict[str, float]], *, steps_done: int, wall_time_s: float) -> None:
        """Create the folder, rewrite ``history.jsonl`` to ``history_rows`` and mark ``run.json`` running."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path / HISTORY, "".join(json.dumps(to_jsonable(r)) + "\n" for r in history_rows))
        atomic_write_json(self.path / RUN_JSON, {**self.record, "status": Status.RUNNING, "steps_done": steps_done,
                                                 "wall_time_s": wall_time_s})

    def write_init(self, x0: torch.Tensor) -> None:
        """Write ``init.safetensors`` (tensor ``x0``, model input space): where a data-initialised run started."""
        save_tensors(self.path / INIT_FILE, {"x0": x0.detach().cpu()})

    def append_history(self, row: dict[str, float]) -> None:
        """Append one row to ``history.jsonl`` (one atomic line: :func:`datarecon.utils.io.append_json_line`)."""
        append_json_line(self.path / HISTORY, row)

    def finish(self, rec: Reconstruction) -> None:
        """Write ``candidates.safetensors`` and the final ``run.json`` of ``rec``."""
        write_candidates(self.path, rec)
        s = rec.summary
        atomic_write_json(self.path / RUN_JSON, {
            **self.record, "status": rec.status, "steps_done": rec.steps_done, "wall_time_s": s["wall_time_s"],
            "stop_reason": s["stop_reason"], "final": s["final"], "selection": s["selection"], "extra": s["extra"],
            "notes": s.get("notes", []), "message": s["message"],
        })


__all__ = ["CANDIDATES", "CHECKPOINT_DIR", "HISTORY", "INIT_FILE", "PROGRESS_FILE", "RUN_JSON", "STATE_FILE", "RunDirectory",
           "RunState", "load_checkpoint", "read_run", "save_checkpoint", "write_candidates"]
