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
import errno
import hashlib
import io
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from datarecon.errors import CheckpointError, DiskFullError

#: errno values of a full disk or exhausted quota
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(path: str | os.PathLike | None, *, hint: str = "rerun the same command") -> str:
    """One line for a write that failed on a full disk: which file, that the old file is intact, and
    ``hint`` (how the command that failed continues: ``rerun the same command with --resume``)."""
    where = f"writing {path}" if path else "writing a file"
    return (f"no space left on device {where}; files are replaced atomically, so the previous version "
            f"(and the last checkpoint) is intact: free some space and {hint}")


def current_umask() -> int:
    """The process umask (read from ``/proc/self/status`` where it is there, else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, record: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename).

    The file's mode is ``0o666 & ~umask``, as for a file created with ``open``. Inside an output
    folder, its name is first recorded in the folder's manifest (:mod:`datarecon.utils.manifest`;
    ``record=False``: not, for the manifest itself), so ``--overwrite`` knows datarecon wrote it.

    Raises:
        DiskFullError: the disk (or quota) is full; ``path`` keeps its previous content and the
            temporary file is removed.
    """
    from datarecon.utils import manifest

    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if record:
            manifest.record(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(disk_full_message(path), path=str(path)) from None
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(obj: Any) -> Any:
    """Convert tensors, numpy values, paths and tuples into JSON-ready values.

    Non-finite floats (NaN, ±inf), also inside tensors and arrays, become ``None`` (JSON
    ``null``): "undefined". Readers treat ``null`` as a missing value; nothing writes the
    strings ``"nan"``/``"inf"``, which would break number formatting downstream.
    """
    import numpy as np

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


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file, raising :class:`CheckpointError` with a clear message."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"missing file {path}; is this the right directory?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); re-create it") from None


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
    if not path.is_file():
        raise CheckpointError(f"missing weights file {path}; is this the right directory?")
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
#: byte-reproducible from its inputs (docs/RELIABILITY.md); these fields are where time goes.
TIMING_FIELDS = ("wall_time_s", "task_time_s", "finished_at", "created", "updated")


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
    import platform

    import numpy as np

    import datarecon

    return {
        "datarecon": datarecon.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
