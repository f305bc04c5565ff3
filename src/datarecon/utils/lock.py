"""Advisory locks: one datarecon process at a time writes an output folder or a results store.

:func:`hold` takes an exclusive ``fcntl.flock`` on ``FOLDER/.datarecon-lock`` for as long as a
command writes ``FOLDER`` (a model, run, experiment, demo, reproduction or audit folder, a sweep's
store). A second process that asks for the same folder (two commands with one ``--out``, a double
``--resume``, ``--overwrite`` while a job runs, two sweeps on one store) is refused at once with one
line naming the holder's pid and command. The lock file holds that pid, the host and the command
line as JSON; it is written only after the lock is taken, so it always names the holder.

Why ``fcntl.flock`` and not the ``filelock`` package (docs/DESIGN.md): the kernel releases a
flock when its process dies, however it dies (SIGKILL, the OOM killer), so a killed run never
leaves a lock that blocks the rerun; a lock file whose recorded process is gone is *stale* and is
taken over silently (:attr:`Held.stale_pid` says whose it was). ``filelock``'s flock-based lock
truncates the file when it opens it, before locking, which would erase the holder's pid that the
refusal names; its soft (marker-file) lock is the kind that goes stale. On a filesystem without
flock (some network mounts) the folder is used without a lock and a warning says so.

Locks are re-entrant within a process (an experiment holds ``OUT`` and, inside it, training holds
``OUT/model``), so nested calls of the library functions that take them are fine. A folder that
:func:`hold` had to create is removed again on release when nothing but the lock was written, so
a command refused after taking the lock leaves no trace.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from datarecon.errors import DataReconError
from datarecon.utils.manifest import MANIFEST

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: folders are not locked
    fcntl = None  # type: ignore[assignment]

#: the lock file inside a locked folder
LOCK_FILE = ".datarecon-lock"
#: errno values of a filesystem that does not support flock
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@dataclass
class Held:
    """A lock this process holds.

    Attributes:
        folder: the locked folder (absolute).
        fd: the open lock file (-1 when the filesystem has no flock).
        count: re-entrant depth.
        created: folders :func:`hold` created (deepest last), removed on release if left empty.
        stale_pid: the pid a stale lock file named (its process had died), or None.
    """

    folder: Path
    fd: int
    count: int = 1
    created: tuple[Path, ...] = ()
    stale_pid: int | None = None


_HELD: dict[Path, Held] = {}
_GUARD = threading.RLock()


def _holder(fd: int) -> dict:
    """The JSON record of a lock file (empty when unreadable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while chunk := os.read(fd, 4096):
            data += chunk
        rec = json.loads(data.decode("utf-8") or "{}")
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def describe_holder(rec: dict) -> str:
    """``pid 123 on host, `datarecon ...`, since 12:00:01`` from a lock record."""
    parts = [f"pid {rec.get('pid', '?')}"]
    if rec.get("host") and rec.get("host") != socket.gethostname():
        parts[0] += f" on {rec['host']}"
    if rec.get("command"):
        parts.append(f"`{rec['command']}`")
    if rec.get("since"):
        parts.append(f"since {rec['since']}")
    return ", ".join(parts)


def _make_dirs(folder: Path) -> tuple[Path, ...]:
    """Create ``folder`` and missing parents; the folders created, outermost first."""
    missing = []
    d = folder
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    folder.mkdir(parents=True, exist_ok=True)
    return tuple(reversed(missing))


def _open_locked(path: Path, folder: Path, what: str) -> tuple[int, dict]:
    """Open and flock ``path`` (retrying if it was replaced meanwhile); (fd, previous record)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            rec = _holder(fd)
            os.close(fd)
            raise DataReconError(f"{what} {folder} is in use by another datarecon process ({describe_holder(rec)}); "
                                 "wait for it to finish or stop it, then rerun") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the previous holder may have removed the file between our open and our flock
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, _holder(fd)
        os.close(fd)


def _write_record(fd: int) -> None:
    rec = {"pid": os.getpid(), "host": socket.gethostname(),
           "command": " ".join(["datarecon", *sys.argv[1:]]) if sys.argv else "datarecon",
           "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(rec).encode("utf-8"))


def _acquire(folder: Path, what: str) -> Held:
    created = _make_dirs(folder)
    if fcntl is None:
        return Held(folder, -1, created=created)
    path = folder / LOCK_FILE
    try:
        fd, previous = _open_locked(path, folder, what)
    except DataReconError:
        _remove_empty(created)
        raise
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            _remove_empty(created)
            raise
        warnings.warn(f"{folder}: the filesystem does not support locks; make sure no other datarecon process "
                      "writes it", RuntimeWarning, stacklevel=3)
        return Held(folder, -1, created=created)
    stale = previous.get("pid") if previous.get("pid") != os.getpid() else None
    _write_record(fd)
    return Held(folder, fd, created=created, stale_pid=stale if isinstance(stale, int) else None)


def _remove_empty(created: tuple[Path, ...]) -> None:
    """Remove the folders :func:`hold` created (deepest first) where nothing but bookkeeping is left."""
    for d in reversed(created):
        try:
            left = [p for p in d.iterdir() if p.name not in (LOCK_FILE, MANIFEST)]
            if left:
                return
            for name in (LOCK_FILE, MANIFEST):
                (d / name).unlink(missing_ok=True)
            d.rmdir()
        except OSError:
            return


def _release(held: Held) -> None:
    if held.fd >= 0:
        try:
            (held.folder / LOCK_FILE).unlink(missing_ok=True)  # while still holding it
        except OSError:
            pass
        os.close(held.fd)
    _remove_empty(held.created)


@contextmanager
def hold(folder: str | Path, *, what: str = "output folder") -> Iterator[Held]:
    """Hold the advisory lock of ``folder`` (created if missing) for the duration of the block.

    Args:
        folder: the output folder or store.
        what: how the refusal names it ("output folder", "results store").

    Yields:
        The :class:`Held` lock (``stale_pid``: the dead process whose lock file was taken over).

    Raises:
        DataReconError: another process holds the lock (one line naming its pid and command), or
            ``folder`` is an existing file.
    """
    folder = Path(os.path.abspath(folder))
    if folder.exists() and not folder.is_dir():
        raise DataReconError(f"{folder} is an existing file; choose a directory for --out")
    with _GUARD:
        held = _HELD.get(folder)
        if held is not None:
            held.count += 1
        else:
            held = _HELD[folder] = _acquire(folder, what)
    try:
        yield held
    finally:
        with _GUARD:
            held.count -= 1
            if held.count == 0:
                del _HELD[folder]
                _release(held)


def check_free(folder: str | Path, *, what: str = "output folder") -> None:
    """Refuse at once (the same one line as :func:`hold`) when another process holds ``folder``;
    for the checks a command makes before it takes the lock itself. Creates nothing.

    Raises:
        DataReconError: another process holds the lock.
    """
    folder = Path(os.path.abspath(folder))
    if fcntl is None or is_held_here(folder) or not (folder / LOCK_FILE).is_file():
        return
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        rec = _holder(fd)
        raise DataReconError(f"{what} {folder} is in use by another datarecon process ({describe_holder(rec)}); "
                             "wait for it to finish or stop it, then rerun") from None
    except OSError:
        return
    finally:
        os.close(fd)  # closing releases a lock this peek took


def is_held_here(folder: str | Path) -> bool:
    """Whether this process holds the lock of ``folder``."""
    with _GUARD:
        return Path(os.path.abspath(folder)) in _HELD


__all__ = ["LOCK_FILE", "Held", "check_free", "describe_holder", "hold", "is_held_here"]
