"""The one checkpoint format of every resumable loop: target training, margin ascent and attacks.

A checkpoint is a folder (``<model dir>/checkpoint``, ``<run dir>/checkpoint``) holding::

    state.safetensors   every tensor of the loop's state (weights, optimiser moments, the attack's
                        x and multipliers, generator states), plus a ``__meta__`` tensor: the
                        loop's JSON metadata as UTF-8 bytes (step, status, config hash, history...).
                        Header metadata: ``format`` (:data:`FORMAT`), ``kind`` (:class:`Kind`) and
                        ``sha256`` (:func:`digest` of the tensors, checked on load: a changed byte
                        is refused rather than resumed from).
    progress.json       the same metadata, human readable (a copy; ``state.safetensors`` wins)
    previous.safetensors   only with ``save(..., keep_previous=True)`` (the runs of a coupled group): the
                        checkpoint before the latest, so that the group can roll back to a step every run
                        has (:func:`promote_previous`); removed when the group ends (:func:`drop_previous`)

What the metadata holds (the one schema of every loop) is :class:`datarecon.kernel.resume.Progress`.

One file is one consistent checkpoint: it is written to a temporary name and renamed
(:func:`datarecon.utils.io.save_tensors`), so a kill at any moment leaves the previous or the new
checkpoint, never a mix. ``progress.json`` is written after it; a kill in between leaves a stale
copy, which :func:`load` rewrites. The metadata is a tensor rather than header text because the
safetensors reader caps headers at 100 MB and a training history can be long.

Two older formats are read (and replaced by this one at the next save):

* attacks before format 2: ``state.safetensors`` with the metadata as a ``progress`` header entry;
* training (``datarecon-train-checkpoint/1``): ``state-<epoch>.safetensors`` plus a ``state.json``
  that names it and records its SHA-256.

This is not :mod:`datarecon.models.checkpoint`, the model directory of a *finished* target.
"""

from __future__ import annotations

import hashlib
import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from datarecon.errors import CheckpointError
from datarecon.utils.io import (
    atomic_write_bytes,
    atomic_write_json,
    load_tensors,
    read_json,
    save_tensors,
    sha256_file,
    to_jsonable,
)
from datarecon.kernel.files import CHECKPOINT_DIR, PREVIOUS_STATE_FILE, PROGRESS_FILE, STATE_FILE

FORMAT = "datarecon-checkpoint/2"
#: the checkpoint folder inside a model or run directory
FOLDER = CHECKPOINT_DIR
META_KEY = "__meta__"
#: the training format before format 2 (``state.json`` + ``state-<epoch>.safetensors``)
LEGACY_TRAIN_FORMAT, LEGACY_TRAIN_JSON = "datarecon-train-checkpoint/1", "state.json"


class Kind(StrEnum):
    """Which loop wrote a checkpoint; a loop refuses another kind's checkpoint."""

    TRAIN = "train"
    ATTACK = "attack"


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """Hex SHA-256 over the names, dtypes, shapes and bytes of ``tensors`` in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _encode(meta: dict[str, Any]) -> torch.Tensor:
    text = json.dumps(to_jsonable(meta), sort_keys=True, allow_nan=False)
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)


def _decode(t: torch.Tensor, where: Path) -> dict[str, Any]:
    try:
        meta = json.loads(bytes(t.numpy().tobytes()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where} has unreadable metadata; delete {where.parent} and rerun without --resume")
    return meta


def _safetensors_metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as fh:
            return dict(fh.metadata() or {})
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path} is not a valid safetensors file ({exc}); delete {path.parent} "
                              "and rerun without --resume") from None


def kind_of(folder: str | Path) -> Kind | None:
    """The kind of the checkpoint in ``folder`` (older formats included), or None when it holds none."""
    folder = Path(folder)
    path = folder / STATE_FILE
    if path.is_file():
        try:
            header = _safetensors_metadata(path)
        except CheckpointError:
            return None
        if header.get("format") == FORMAT:
            return Kind(header["kind"]) if header.get("kind") in tuple(Kind) else None
        return Kind.ATTACK if "progress" in header else None
    return Kind.TRAIN if (folder / LEGACY_TRAIN_JSON).is_file() else None


def exists(folder: str | Path) -> bool:
    """Whether ``folder`` holds a checkpoint (in any format)."""
    folder = Path(folder)
    return (folder / STATE_FILE).is_file() or (folder / LEGACY_TRAIN_JSON).is_file()


def save(folder: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any], *, kind: Kind,
         keep_previous: bool = False) -> None:
    """Write one checkpoint atomically, then its readable copy; older-format files are then removed.

    Args:
        folder: the checkpoint folder (created).
        tensors: name -> tensor (any dtype/device; saved contiguous on the CPU). ``__meta__`` is reserved.
        meta: JSON-able metadata (non-finite floats are stored as ``null``).
        kind: which loop writes it.
        keep_previous: keep the checkpoint this one replaces as ``previous.safetensors`` (copied before the
            new file is renamed into place: at every moment the folder holds a latest checkpoint and, from the
            second save on, one before it).
    """
    folder = Path(folder)
    if META_KEY in tensors:
        raise ValueError(f"tensor name {META_KEY!r} is reserved for the checkpoint's metadata")
    tensors = {**{k: v.detach().contiguous().cpu() for k, v in tensors.items()}, META_KEY: _encode(meta)}
    if keep_previous and (folder / STATE_FILE).is_file():
        _copy_previous(folder)
    save_tensors(folder / STATE_FILE, tensors, metadata={"format": FORMAT, "kind": str(kind), "sha256": digest(tensors)})
    atomic_write_json(folder / PROGRESS_FILE, meta)
    # the new file is the checkpoint now: an older training checkpoint beside it is dead weight
    (folder / LEGACY_TRAIN_JSON).unlink(missing_ok=True)
    for old in folder.glob("state-*.safetensors"):
        old.unlink(missing_ok=True)


def _copy_previous(folder: Path) -> None:
    """``previous.safetensors`` := a copy of the current state file, written atomically (and recorded in the
    folder's manifest) by the one writer."""
    atomic_write_bytes(folder / PREVIOUS_STATE_FILE, (folder / STATE_FILE).read_bytes())


def has_previous(folder: str | Path) -> bool:
    """Whether ``folder`` keeps a checkpoint before its latest one (``save(..., keep_previous=True)``)."""
    return (Path(folder) / PREVIOUS_STATE_FILE).is_file()


def promote_previous(folder: str | Path) -> None:
    """Make the previous checkpoint the latest (a coupled group rolled back; the readable copy follows at the
    next :func:`load`)."""
    folder = Path(folder)
    os.replace(folder / PREVIOUS_STATE_FILE, folder / STATE_FILE)


def drop_previous(folder: str | Path) -> None:
    """Remove the previous checkpoint, if any (a coupled group that ended keeps its runs' latest ones only)."""
    (Path(folder) / PREVIOUS_STATE_FILE).unlink(missing_ok=True)


def remove(folder: str | Path) -> None:
    """Remove every checkpoint file of ``folder`` (a coupled group's run rolled back to its start)."""
    folder = Path(folder)
    for name in (STATE_FILE, PREVIOUS_STATE_FILE, PROGRESS_FILE, LEGACY_TRAIN_JSON):
        (folder / name).unlink(missing_ok=True)


def load(folder: str | Path, *, kind: Kind, previous: bool = False
         ) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The (tensors, metadata) of the checkpoint in ``folder``, or None when it holds none.

    Reads format 2 and both older formats (module docstring). A stale ``progress.json`` is rewritten
    from the tensor file. With ``previous``, the checkpoint before the latest (:func:`save`'s
    ``keep_previous``; None when there is none), whose readable copy is not touched.

    Raises:
        CheckpointError: a corrupt checkpoint, or one written by another kind of loop.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder, where the checkpoint folder belongs; move it away and "
                              "rerun the same command (or pass --overwrite to start afresh)")
    if previous:
        path = folder / PREVIOUS_STATE_FILE
        return _load_file(path, kind=kind) if path.is_file() else None
    path = folder / STATE_FILE
    if path.is_file():
        tensors, meta = _load_file(path, kind=kind)
        _refresh_progress(folder, meta)
        return tensors, meta
    if (folder / LEGACY_TRAIN_JSON).is_file():
        if kind != Kind.TRAIN:
            raise CheckpointError(f"{folder} holds a checkpoint of kind 'train', not {str(kind)!r}; choose another "
                                  "--out or rerun without --resume")
        return _load_legacy_train(folder)
    return None


def _load_file(path: Path, *, kind: Kind) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, metadata) of one state file (format 2, or an attack's before it), checked."""
    folder = path.parent
    if True:
        header = _safetensors_metadata(path)
        tensors = load_tensors(path)
        if header.get("format") == FORMAT:
            found = header.get("kind")
            if found != kind:
                raise CheckpointError(f"{folder} holds a checkpoint of kind {found!r}, not {str(kind)!r}; choose another "
                                      "--out or rerun without --resume")
            if META_KEY not in tensors or digest(tensors) != header.get("sha256"):
                raise CheckpointError(f"{path} does not match its checksum (changed or damaged); delete {folder} "
                                      "and rerun without --resume")
            meta = _decode(tensors.pop(META_KEY), path)
        elif "progress" in header:  # an attack checkpoint from before format 2
            if kind != Kind.ATTACK:
                raise CheckpointError(f"{folder} holds a checkpoint of kind 'attack', not {str(kind)!r}; choose another "
                                      "--out or rerun without --resume")
            try:
                meta = json.loads(header["progress"])
            except (json.JSONDecodeError, RecursionError):
                meta = None
            if not isinstance(meta, dict):
                raise CheckpointError(f"{path} has unreadable metadata; delete {folder} and rerun without --resume")
        else:
            raise CheckpointError(f"{path} has no progress metadata; delete {folder} and rerun")
        return tensors, meta


def _refresh_progress(folder: Path, meta: dict[str, Any]) -> None:
    readable = folder / PROGRESS_FILE
    try:
        stale = json.loads(readable.read_text()) != json.loads(json.dumps(to_jsonable(meta)))
    except (OSError, ValueError, RecursionError):  # a damaged copy (nested too deeply for the parser too): rewritten
        stale = True
    if stale:
        atomic_write_json(readable, meta)


def _load_legacy_train(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A ``datarecon-train-checkpoint/1`` checkpoint: its tensors and ``state.json`` less the file fields."""
    info = read_json(folder / LEGACY_TRAIN_JSON)
    if not isinstance(info, dict) or info.get("format") != LEGACY_TRAIN_FORMAT:
        raise CheckpointError(f"{folder / LEGACY_TRAIN_JSON} is not a datarecon training checkpoint; "
                              "delete the folder or train without --resume")
    path = folder / str(info.get("tensors"))
    if not path.is_file() or sha256_file(path) != info.get("sha256"):
        raise CheckpointError(f"{path} is missing or does not match {LEGACY_TRAIN_JSON}; delete {folder} "
                              "and retrain with --overwrite")
    meta = {k: v for k, v in info.items() if k not in ("format", "tensors", "sha256")}
    return load_tensors(path), meta


__all__ = ["FOLDER", "FORMAT", "LEGACY_TRAIN_FORMAT", "LEGACY_TRAIN_JSON", "META_KEY", "PREVIOUS_STATE_FILE",
           "PROGRESS_FILE", "STATE_FILE", "Kind", "digest", "drop_previous", "exists", "has_previous", "kind_of", "load",
           "promote_previous", "remove", "save"]
