"""The manifest of an output folder: the names datarecon wrote there, recorded as it writes them.

A command that writes an output folder (``train``, ``reconstruct``, ``run``, ``demo``, ``sweep``,
``reproduce``, ``audit``, ``sweep pool``) starts a manifest in it (:func:`start`): the hidden file
``OUT/.datarecon-manifest``, whose first line names the kind of folder. From then on every file
written below that folder through :func:`datarecon.utils.io.atomic_write_bytes` is recorded
(:func:`record`) *before* it is written: its name in the manifest of its own folder, and each
sub-folder's name in the manifest of the folder above, up to the root. So every folder datarecon
wrote into has a manifest listing exactly the entries datarecon created there, and a file a user
put anywhere inside (``OUT/run/notes.txt``, ``OUT/model/checkpoint/mine.pt``) is not listed.

``--overwrite`` (:func:`datarecon.kernel.outdir.clear_out_dir`) deletes only listed entries and
refuses, before deleting anything, a folder holding an entry that is not listed
(:func:`unlisted`). A kill between recording a name and writing the file leaves a listed name
without a file, which is harmless; the reverse (a file without its name) cannot happen.

Files outside any folder with a manifest (``report --out ~/r.html``) are not recorded: a folder
is managed only below a root that a command started. Several processes may record into one
folder at once (sweep and audit workers): each update holds an advisory lock on the manifest
file (``fcntl.flock``) and appends one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from datarecon.errors import DiskFullError
from datarecon.utils.atomic import DISK_FULL_ERRNOS, current_umask, disk_full_message, replace_atomically

try:  # POSIX; elsewhere updates are not serialised (one writer per folder is then assumed)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: the manifest file of a folder
MANIFEST = ".datarecon-manifest"
#: the first line of a root manifest: ``KIND_PREFIX + kind``
KIND_PREFIX = "# datarecon "


def _mode() -> int:
    return 0o666 & ~current_umask()


def _update(folder: Path, line: str | None = None, *, kind: str | None = None) -> None:
    """Append ``line`` to ``folder``'s manifest unless listed (creating it, with ``kind`` as its header).

    Raises:
        DiskFullError: the disk (or quota) is full (named: the manifest file).
    """
    try:
        _append_line(folder, line, kind=kind)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(disk_full_message(folder / MANIFEST), path=str(folder / MANIFEST)) from None
        raise


def _append_line(folder: Path, line: str | None, *, kind: str | None) -> None:
    fd = os.open(folder / MANIFEST, os.O_RDWR | os.O_CREAT | os.O_APPEND, _mode())
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        text = b""
        while chunk := os.read(fd, 1 << 16):
            text += chunk
        lines = text.decode("utf-8", "replace").splitlines()
        add = []
        if kind is not None and not any(x.startswith(KIND_PREFIX) for x in lines):
            add.append(KIND_PREFIX + kind)
        if line is not None and line not in lines:
            add.append(line)
        if add:
            prefix = "\n" if text and not text.endswith(b"\n") else ""  # a torn last line stays on its own
            os.write(fd, (prefix + "".join(a + "\n" for a in add)).encode("utf-8"))
    finally:
        os.close(fd)


def managed_root(folder: str | Path) -> Path | None:
    """The nearest folder at or above ``folder`` that has a manifest (None: unmanaged)."""
    d = Path(os.path.abspath(folder))
    while True:
        if (d / MANIFEST).is_file():
            return d
        if d.parent == d:
            return None
        d = d.parent


def record(path: str | Path) -> None:
    """Record that datarecon is about to write ``path`` (a file or a folder), if it lies in a managed folder.

    Lists ``path``'s name in its folder's manifest and every folder between it and the managed
    root in the manifest of the folder above. Does nothing outside a managed folder.
    """
    path = Path(os.path.abspath(path))
    root = managed_root(path.parent)
    if root is None or path == root:
        return
    chain = [path]
    while chain[-1].parent != root:
        chain.append(chain[-1].parent)
    for entry in reversed(chain):  # top-down: a folder is listed above before anything is written in it
        _update(entry.parent, entry.name)
        if entry is not path:
            entry.mkdir(exist_ok=True)
            _update(entry)


def start(folder: str | Path, *, kind: str) -> None:
    """Make ``folder`` a managed root of ``kind`` (recorded in a managed parent, if any); idempotent."""
    folder = Path(folder)
    record(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _update(folder, kind=kind)


def listed(folder: str | Path) -> set[str] | None:
    """The names ``folder``'s manifest lists (None when it has none)."""
    path = Path(folder) / MANIFEST
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    return {x for x in text.splitlines() if x and not x.startswith(KIND_PREFIX)}


def kind_of(folder: str | Path) -> str | None:
    """The kind a root manifest names (None without a manifest or a kind line)."""
    try:
        text = (Path(folder) / MANIFEST).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    for x in text.splitlines():
        if x.startswith(KIND_PREFIX):
            return x[len(KIND_PREFIX):].strip() or None
    return None


def reset(folder: str | Path) -> None:
    """Empty ``folder``'s manifest but for its kind line (after its listed entries were deleted)."""
    kind = kind_of(folder)
    path = Path(folder) / MANIFEST
    if path.is_file():
        replace_atomically(path, (KIND_PREFIX + kind + "\n").encode() if kind else b"")


__all__ = ["KIND_PREFIX", "MANIFEST", "kind_of", "listed", "managed_root", "record", "reset", "start"]
