"""What a membership folder keeps of its reference models, and how it is read back.

Storage, below a membership folder (``OUT``)::

    OUT/target.json                        the model the folder measures (another model's call is refused)
    OUT/pool.safetensors                   the pool (display images, labels, task classes) and the population
    OUT/references/ref-00007/DONE.json     completion marker (:mod:`datarecon.experiments.pipeline.pieces`)
    OUT/references/ref-00007/stats.safetensors   its statistics on the pool and the population, its subset
    OUT/references/ref-00007/weights.safetensors its weights and input mean (``keep_weights``, and always for
                                           the first :data:`KEPT_ALWAYS`, which play the target in turn)

A finished model's marker records the SHA-256 of its files, checked whenever they are read back
(:func:`read_checked`). The models are written by :mod:`.reference_training`.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datarecon.errors import DataReconError
from datarecon.experiments.membership.trainers import Trainer
from datarecon.kernel.files import (DONE_MARKER, MEMBERSHIP_POOL, MEMBERSHIP_REFERENCES, REFERENCE_PREFIX,
                                    REFERENCE_STATS)
from datarecon.kernel.files import REFERENCE_WEIGHTS as REFERENCE_WEIGHTS
from datarecon.kernel.resume import FolderState, folder_state
from datarecon.utils.io import load_tensors, save_tensors, sha256_file

__all__ = ["KEPT_ALWAYS", "POOL_FILE", "REFERENCES_DIR", "REFERENCE_WEIGHTS", "ReferencePool", "ReferenceStatistics",
           "STATS_FILE", "done_record", "finished_references", "kept_references", "load_reference_model", "load_statistics", "read_checked",
           "reference_dir", "reference_key", "reference_state"]

POOL_FILE = MEMBERSHIP_POOL
REFERENCES_DIR = MEMBERSHIP_REFERENCES
STATS_FILE = REFERENCE_STATS
#: the first reference models keep their weights whatever ``keep_weights`` says: they play the target in turn to
#: choose the strongest signal, and the white-box signals need their weights there
KEPT_ALWAYS = 4


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


def reference_key(index: int) -> str:
    """The folder of reference model ``index`` relative to its membership folder (``references/ref-00007``; its
    piece's key)."""
    return f"{REFERENCES_DIR}/{REFERENCE_PREFIX}{index:05d}"


def reference_dir(out: Path, index: int) -> Path:
    """The folder of reference model ``index`` below the membership folder ``out``."""
    return out / reference_key(index)


def reference_state(out: Path, index: int) -> FolderState:
    """What the folder of reference model ``index`` holds: its completion marker read by the one reading of a
    resumed folder (:func:`datarecon.kernel.resume.folder_state`)."""
    return folder_state(reference_dir(out, index), record=DONE_MARKER)


def finished_references(out: Path | None) -> dict[int, FolderState]:
    """The reference models below ``out`` whose completion marker is there and readable, by index (sorted): every
    reader of a folder's models (resume, the refusal of other settings, the kept weights) starts here."""
    if out is None or not (out / REFERENCES_DIR).is_dir():
        return {}
    found = {}
    for d in sorted((out / REFERENCES_DIR).glob(f"{REFERENCE_PREFIX}*")):
        index = d.name[len(REFERENCE_PREFIX):]
        state = reference_state(out, int(index)) if index.isdigit() else None
        if state is not None and state.finished:
            found[int(index)] = state
    return found


def done_record(out: Path, index: int) -> dict[str, Any]:
    """The summary the completion marker of reference model ``index`` records ({} when unreadable)."""
    summary = (reference_state(out, index).record or {}).get("summary")
    return summary if isinstance(summary, dict) else {}


def kept_references(out: Path | None) -> list[int]:
    """The indices of the finished reference models whose weights a membership folder keeps."""
    return [k for k, state in finished_references(out).items() if (state.path / REFERENCE_WEIGHTS).is_file()]


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
