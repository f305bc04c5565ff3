"""The atomic write every file datarecon writes goes through (below the manifest and the JSON helpers).

The bytes are written to a temporary file in the same directory, flushed and fsynced, then renamed
over the target, so a killed process leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from datarecon.errors import DiskFullError

#: errno values of a full disk or exhausted quota
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: the temporary files :func:`replace_atomically` creates: ``.<target name>.<8 random characters of
#: mkstemp>.tmp``, nothing else (a user's ``.notes.old.tmp`` is not one)
TEMP_NAME = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")


def temp_target(name: str) -> str | None:
    """The file a temporary file named ``name`` was replacing, when ``name`` is exactly what
    :func:`replace_atomically` creates (None for any other name)."""
    found = TEMP_NAME.fullmatch(name)
    return found.group("target") if found else None


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


def replace_atomically(path: Path, data: bytes, *, before: Callable[[Path], None] | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), mode ``0o666 & ~umask``.

    Args:
        path: the file.
        data: its new content.
        before: called with ``path`` once its folder exists, before the write (the manifest's record).

    Raises:
        DiskFullError: the disk (or quota) is full; ``path`` keeps its previous content and the
            temporary file is removed.
        PermissionError: the folder cannot be written; named by ``path`` (not by the temporary file).
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if before is not None:
            before(path)
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
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            # the file the user asked for, not the temporary file beside it that failed first
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        raise
