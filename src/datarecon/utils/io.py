"""Atomic file writes and JSON helpers.

Every artefact datarecon writes (weights, metadata, checkpoints, run records)
goes through :func:`atomic_write_bytes`: the bytes are written to a temporary
file in the same directory, flushed and fsynced, then renamed over the target,
so a killed process leaves either the old file or the new one, never a torn one.
The file gets the permissions a plain ``open(path, "w")`` would give (``0o666`` less the
process umask), not ``mkstemp``'s private ``0o600``: results are meant to be shared.

JSON files are standard JSON: undefined or non-finite numbers (NaN, ±inf) are written as
``null`` (see :func:`to_jsonable`), which every JSON reader accepts.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

import datarecon
from datarecon.errors import CheckpointError, DiskFullError
from datarecon.utils import manifest
from datarecon.utils.atomic import DISK_FULL_ERRNOS, disk_full_message, replace_atomically

def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, record: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename).

    The file's mode is ``0o666 & ~umask``, as for a file created with ``open``. Inside an output
    folder, its name is first recorded in the folder's manifest (:mod:`datarecon.utils.manifest`;
    ``record=False``: not, for the manifest itself), so ``--overwrite`` knows datarecon wrote it.

    Raises:
        DiskFullError: the disk (or quota) is full; ``path`` keeps its previous content and the
            temporary file is removed.
    """
    replace_atomically(Path(path), data, before=manifest.record if record else None)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def append_json_line(path: str | os.PathLike, row: Mapping[str, Any]) -> None:
    """Append ``row`` as one JSON line to ``path`` with a single ``write`` on an ``O_APPEND`` descriptor.

    The whole line (its newline included) goes to the kernel in one call, so concurrent appenders
    never interleave inside a line and a killed process leaves whole lines; a line torn by a crash
    of the machine itself lacks its newline and :func:`read_json_lines` drops it.

    Raises:
        DiskFullError: the disk (or quota) is full (the file keeps its earlier lines).
    """
    data = (json.dumps(to_jsonable(dict(row))) + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            view = memoryview(data)
            while view:  # a regular file takes the whole line at once; loop only on a short write
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(disk_full_message(path), path=str(path)) from None
        raise


def read_json_lines(path: str | os.PathLike, *, upto: int | None = None) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (a history), in order; ``[]`` when it is missing.

    A last line without its newline, or one that is not a JSON object, is the torn tail of a
    killed writer and is dropped. ``upto``: only rows whose ``step`` is at most this.
    """
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] and not text.endswith("\n"):
        lines.pop()  # torn tail
    rows = []
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(row, dict) and (upto is None or row.get("step", 0) <= upto):
            rows.append(row)
    return rows


def to_jsonable(obj: Any) -> Any:
    """Convert tensors, numpy values, paths and tuples into JSON-ready values.

    Non-finite floats (NaN, ±inf), also inside tensors and arrays, become ``None`` (JSON
    ``null``): "undefined". Readers treat ``null`` as a missing value; nothing writes the
    strings ``"nan"``/``"inf"``, which would break number formatting downstream.
    """
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return to_jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def as_float(value: Any) -> float:
    """``float(value)``, or NaN for what is not a number (``None`` from a JSON null, a string, ...)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as pretty, standard JSON atomically (non-finite numbers as ``null``)."""
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")


def rows_to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """CSV text of ``rows`` (dicts): header + one line per row, ``\\n`` line ends.

    Args:
        rows: Dicts; the columns are the union of their keys in first-seen order, a key a row
            lacks is written as an empty cell. Floats are written with ``.6g``.

    Returns:
        The CSV text (just ``"\\n"`` when ``rows`` is empty).
    """
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write ``rows`` (dicts) as CSV to ``path`` atomically (see :func:`rows_to_csv`)."""
    atomic_write_text(path, rows_to_csv(rows))


#: the largest JSON file datarecon reads back (its own are kilobytes; a run.json of a large sweep a few MB)
MAX_JSON_BYTES = 256 * 2**20


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file, raising :class:`CheckpointError` with a clear message.

    Files are untrusted input: a folder or device in place of the file, a file of more than
    :data:`MAX_JSON_BYTES`, text that is not UTF-8 JSON and JSON nested too deeply for the parser
    (``[[[[...]]]]``) are each refused in one line.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder where a JSON file is expected; is this the right directory?")
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "missing file"
        raise CheckpointError(f"{what} {path}; is this the right directory?" if what == "missing file" else
                              f"{path} {what}; pass the JSON file datarecon wrote")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path} is {path.stat().st_size / 2**20:.0f} MB, more than any JSON file datarecon "
                              "writes; re-create it")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); re-create it") from None
    except RecursionError:
        raise CheckpointError(f"{path} is nested too deeply to be a file datarecon wrote; re-create it") from None


def _looks_like_safetensors(raw: bytes) -> bool:
    """A safetensors file: u64 little-endian header length N, then N bytes of JSON starting with '{'."""
    if len(raw) < 10:
        return False
    n = int.from_bytes(raw[:8], "little")
    return 2 <= n <= len(raw) - 8 and raw[8:9] == b"{"


def _looks_like_pickle(raw: bytes) -> bool:
    """Pickle protocol >= 2 (0x80 PROTO opcode) or a torch.save zip archive."""
    return raw[:1] == b"\x80" or raw[:4] == b"PK\x03\x04"


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor],
                 *, metadata: dict[str, str] | None = None) -> None:
    """Save a flat dict of tensors as safetensors, atomically."""
    data = _st_save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                    metadata=metadata)
    atomic_write_bytes(path, data)


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a safetensors file. Never unpickles: a pickle or torch.save file is refused.

    Returns:
        name -> tensor, in sorted name order (the same in every process).

    Raises:
        CheckpointError: missing, pickled, truncated or corrupt file.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder where a safetensors file is expected; pass the file")
    if not path.is_file():
        raise CheckpointError(f"{path} is not a regular file; pass a safetensors file" if path.exists() else
                              f"missing weights file {path}; is this the right directory?")
    raw = path.read_bytes()
    if not _looks_like_safetensors(raw) and _looks_like_pickle(raw):
        raise CheckpointError(
            f"{path} is a pickle/torch.save file; datarecon loads only safetensors "
            "(pickles can execute code). Convert it with safetensors.torch.save_file"
        )
    try:
        tensors = _st_load(raw)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path} is not a valid safetensors file ({exc}); re-create it") from None
    # safetensors hands the tensors back in a per-process hash order: sort them, so everything
    # derived from the key order (CSV columns, score lists) is the same in every process
    return {k: tensors[k] for k in sorted(tensors)}


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's contents."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: JSON fields that hold wall-clock times or timestamps. Everything else datarecon writes is
#: byte-reproducible from its inputs (docs/RELIABILITY.md); these fields are where time goes: run and
#: training wall times, the margin ascent's share of a training's (``model.json`` metrics), a worker's task
#: time, when a piece finished or a pool was created, a store row's update, and the measured time per
#: reference model of ``--references auto`` (``membership.json``) and the cost ``--runs auto`` measured
#: (``run.json``'s ``runs_auto``). tests/utils/test_timing_fields.py keeps
#: every such key written anywhere in the package in this list.
TIMING_FIELDS = ("wall_time_s", "margin_ascent_wall_time_s", "task_time_s", "finished_at", "created", "updated",
                 "seconds_per_model", "probe_seconds", "prepare_seconds", "seconds_per_step", "seconds_per_run")


def strip_timing(obj: Any) -> Any:
    """``obj`` (parsed JSON) without the :data:`TIMING_FIELDS`, at any depth (for comparing artefacts)."""
    if isinstance(obj, dict):
        return {k: strip_timing(v) for k, v in obj.items() if k not in TIMING_FIELDS}
    if isinstance(obj, list):
        return [strip_timing(v) for v in obj]
    return obj


def params_digest(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of named parameters cast to float64 (sorted names, shapes and bytes).

    Casting makes the hash independent of the dtype the tensors are held in (a float32 attack on a
    float64 model), while values that differ (rounded, another seed) hash differently. Model
    directories record it for their initialisation (``init_sha256``).
    """
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().to("cpu", torch.float64).contiguous()
        h.update(f"{name}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).numpy().tobytes())
    return h.hexdigest()


def config_hash(obj: Any) -> str:
    """A stable short hash of a JSON-able config (sorted keys)."""
    text = json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return sha256_bytes(text.encode("utf-8"))[:16]


def versions() -> dict[str, str]:
    """Versions of the packages that determine numerical results."""
    return {
        "datarecon": datarecon.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
