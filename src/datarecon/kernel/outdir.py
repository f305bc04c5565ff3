"""Output folders: refuse to overwrite anything that datarecon did not write.

Every command that writes a folder (``train``, ``reconstruct``, ``run``, ``demo``, ``sweep``,
``reproduce``, ``audit``, ``sweep pool``) names the *kind* of artefact it writes and goes through
:func:`claim_out_dir`: it locks the folder (:mod:`datarecon.utils.lock`: one process per folder),
decides what may happen to it (:func:`check_out_dir`) and, once the command's inputs have been
accepted, clears it if asked to and starts its manifest (:mod:`datarecon.utils.manifest`: the
record of every entry datarecon writes there, at any depth). An existing, non-empty ``--out`` is

* refused without ``--overwrite`` / ``--resume``; when it holds an unfinished run of the same kind
  the message says to pass ``--resume`` (commands that have it);
* with ``--overwrite``, cleared only when it is a datarecon artefact of the same kind and every
  entry in it, at any depth, is one datarecon wrote: listed in the manifest of its folder (folders
  written before manifests existed: a name datarecon writes there, :data:`ARTEFACTS`). Only those
  entries are deleted, never the folder itself; a folder holding anything else (``thesis.txt``,
  ``run/notes.txt``, a project checkout, ``--out .``) is refused with a one-line error naming it
  and left untouched;
* with ``--resume`` (or a sweep rerun), refused when it is an artefact of *another* kind (a run
  folder passed to ``sweep --out``, a model folder passed to ``reconstruct --out``), or when it is
  no datarecon artefact at all and holds files datarecon did not write (``--resume --out ~``);
* refused, whatever the flags, when it lies inside another datarecon folder (``--out M/sub`` of a
  model directory ``M``): only the command that claimed a folder writes below it (a demo's
  ``run/``, a reproduction's pieces, a store's runs: ``nested=True``), so ``--overwrite`` of that
  folder can never delete what another command put there (:func:`check_outside`).

A command that writes one file (``report``, ``store export``, ``membership``) follows the same rule
through :func:`check_out_file`: never inside another datarecon folder, an existing file only with
``--overwrite`` and only when datarecon wrote it.

The table of kinds is :data:`~datarecon.kernel.artefacts.ARTEFACTS` (:mod:`datarecon.kernel.artefacts`: what
each kind of folder is and how it is recognised); ``tests/kernel/test_outdir.py`` checks it against the
file-name constants of the modules that write each kind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from datarecon.errors import DataReconError
from datarecon.kernel import checkpoint
from datarecon.kernel.artefacts import (  # noqa: F401 (the table of kinds, read here and by importers of outdir)
    ARTEFACTS, BOOKKEEPING, ArtefactKind, empty_tree, enclosing_artefact, identify, ignored, is_empty, is_temp_file,
    legacy_unlisted, unlisted, with_names)
from datarecon.kernel.files import CHECKPOINT_DIR, MODEL_JSON, RUN_JSON
from datarecon.kernel.resume import recorded_progress
from datarecon.kernel.status import Status
from datarecon.utils import manifest
from datarecon.utils.io import read_json
from datarecon.utils.lock import check_free, hold


def check_path(path: str | Path, *, option: str = "--out") -> None:
    """Refuse an output path that cannot be a file or folder: a symbolic link that leads nowhere (broken,
    or a loop), or one below a file (``f.txt/r.html``); each named in one line before any work.

    Raises:
        DataReconError: what is wrong with the path.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise DataReconError(f"{option} {path} is a symbolic link that leads nowhere (broken, or a loop); choose "
                             f"another {option}")
    for parent in Path(os.path.abspath(path)).parents:
        if parent.exists() and not parent.is_dir():
            raise DataReconError(f"{option} {path}: a part of this path is a file, not a folder ({parent}); choose "
                                 f"another {option}")
        if parent.is_dir():
            break


def check_outside(path: str | Path, *, option: str = "--out") -> None:
    """Refuse a ``path`` inside another datarecon folder (a model, run, store, reproduction, audit,
    demo or experiment folder): only the command that wrote that folder writes into it, so a later
    ``--overwrite`` of it can never delete a run, report or file some other command put there.

    Raises:
        DataReconError: one line naming the enclosing folder and its kind.
    """
    found = enclosing_artefact(path)
    if found is not None:
        folder, entry = found
        raise DataReconError(f"{option} {path} lies inside {folder}, a datarecon {entry.title}, and datarecon never "
                             f"writes into another datarecon folder; choose an {option} outside it")


def check_writable(path: str | Path, *, option: str = "--out") -> None:
    """Refuse, before any work, an output file whose folder (the nearest existing one above it) this process cannot
    write into: the atomic writer creates its temporary file there, and the refusal would otherwise come after the
    work and name that temporary file.

    Raises:
        DataReconError: the folder, and the fix.
    """
    folder = Path(os.path.abspath(path)).parent
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise DataReconError(f"cannot write {option} {path}: the folder {folder} is not writable for this user; "
                             f"choose an {option} in a folder you can write (or fix its permissions)")


def check_out_file(path: str | Path, *, overwrite: bool, ours: Callable[[Path], bool], what: str,
                   option: str = "--out") -> Path:
    """The output rule for a command that writes one file (``report``, ``store export``, ``membership``),
    the same as for folders: never inside another datarecon folder; an existing file only with
    ``--overwrite``, and only when it is one datarecon wrote (``ours``), never a user's file.

    Args:
        path: the output file.
        overwrite: the user passed ``--overwrite``.
        ours: recognises a file of this kind that datarecon wrote (a report by its generator tag).
        what: how messages name such a file ("report").
        option: the option that named ``path``.

    Returns:
        ``path``.

    Raises:
        DataReconError: ``path`` is a folder or not a regular file, lies inside another datarecon
            folder, lies in a folder this process cannot write, exists without ``--overwrite``, or exists
            and is not a {what} datarecon wrote.
    """
    path = Path(path)
    if path.is_dir():
        raise DataReconError(f"{option} {path} is a folder; pass a file name for {option}")
    check_path(path, option=option)
    check_outside(path, option=option)
    check_writable(path, option=option)
    if not (path.exists() or path.is_symlink()):
        return path
    if not path.is_file():
        raise DataReconError(f"{option} {path} exists and is not a regular file; choose another {option}")
    if not ours(path):
        raise DataReconError(f"{option} {path} exists and is not a {what} datarecon wrote, so datarecon will not "
                             f"replace it (not even with --overwrite); choose another {option}")
    if not overwrite:
        raise DataReconError(f"{option} {path} exists (a {what} datarecon wrote); pass --overwrite to replace it "
                             f"or choose another {option}")
    return path


#: how the options these refusals name are spelled in the Python API (added for a Python caller only:
#: :class:`~datarecon.errors.DataReconError` ``python``)
PYTHON_SPELLING = "resume=True, overwrite=True, another out"


def _unfinished(out: Path, kind: str) -> str | None:
    """" (stopped at step N)"-like note when ``out`` holds an unfinished run of ``kind`` (None otherwise)."""
    try:
        if kind == "run":
            run = read_json(out / RUN_JSON) if (out / RUN_JSON).is_file() else {}
            if run.get("status") not in (None, Status.RUNNING):
                return None
            progress = recorded_progress(out / CHECKPOINT_DIR, kind=checkpoint.Kind.ATTACK)
            if progress is not None or run or any(out.glob(f"run*/{CHECKPOINT_DIR}")):
                return f"an unfinished run (stopped at step {progress.steps_done})" if progress is not None else \
                    "an unfinished run"
        if kind == "model" and not (out / MODEL_JSON).is_file():
            progress = recorded_progress(out / CHECKPOINT_DIR, kind=checkpoint.Kind.TRAIN)
            return f"an unfinished training (stopped at epoch {progress.steps_done if progress is not None else '?'})"
    except DataReconError:
        return None
    return None


def _exists_message(out: Path, entry: ArtefactKind) -> str:
    """The refusal of an existing folder without --overwrite/--resume, naming --resume when it helps."""
    unfinished = _unfinished(out, entry.name) if entry.recognises(out) else None
    if unfinished and entry.resumable:
        return (f"{out} holds {unfinished}; pass --resume to continue it, --overwrite to start afresh, "
                "or choose another --out")
    return f"output directory {out} exists; pass --overwrite to replace it or choose another --out"


def check_out_dir(out: str | Path, *, kind: str, overwrite: bool = False, resume: bool = False,
                  names: tuple[str, ...] | None = None, nested: bool = False) -> bool:
    """Decide what may happen to ``out`` before anything is written.

    Args:
        out: the output folder.
        kind: an :data:`ARTEFACTS` key.
        overwrite: the user asked to replace an existing folder.
        resume: the user asked to continue the run in ``out`` (or the command always resumes).
        names: the top-level entries a reproduction's own record (``reproduction.json``) says it
            writes; used for folders written before manifests existed.
        nested: ``out`` lies inside a folder the caller itself claimed (a demo's ``run/``, a
            reproduction's piece, a sweep store's run); otherwise a path inside another datarecon
            folder is refused (:func:`check_outside`).

    Returns:
        True when ``out`` must be cleared (with :func:`clear_out_dir`) before writing.

    Raises:
        DataReconError: ``out`` is a file; it exists without ``--overwrite``/``--resume``; it is an
            artefact of another kind; ``--resume`` into a folder that is none of datarecon's;
            ``--overwrite`` would delete something datarecon did not write; or ``out`` lies inside
            another datarecon folder.
    """
    out = Path(out)
    entry = with_names(ARTEFACTS.get(kind), names)
    if not nested:
        check_outside(out)
    if out.exists() and not out.is_dir():
        raise DataReconError(f"--out {out} is an existing file; choose a directory for --out")
    if not out.is_dir() or is_empty(out):
        return False
    check_free(out, what="results store" if kind == "store" else "output folder")  # in use: say that first
    other = identify(out)
    if not entry.recognises(out) and other is not None and other != kind:
        raise DataReconError(f"--out {out} is a datarecon {ARTEFACTS.get(other).title}, not a {entry.title}; "
                             "choose another --out")
    only_temp = all(ignored(p.name, out) for p in out.iterdir())
    if resume:
        if not entry.recognises(out) and not only_temp:
            foreign = entry.foreign(out)
            if foreign:
                raise DataReconError(f"--out {out} is not a {entry.title} datarecon wrote (it holds {foreign[0]!r}), "
                                     "so there is nothing to resume in it; choose another --out")
        return False
    if not overwrite:
        raise DataReconError(_exists_message(out, entry), python=PYTHON_SPELLING)
    foreign = entry.foreign(out)
    more = f" and {len(foreign) - 1} more entries" if len(foreign) > 1 else ""
    if not (entry.recognises(out) or only_temp):
        what = f"it holds {foreign[0]!r}{more}" if foreign else "none of its files were written by datarecon"
        raise DataReconError(f"refusing to --overwrite {out}: it is not a datarecon {entry.title} ({what}); "
                             "choose another --out or remove it yourself")
    if foreign:
        raise DataReconError(f"refusing to --overwrite {out}: it holds {foreign[0]!r}{more}, which datarecon did not "
                             "write; move it out of the folder or choose another --out")
    if strays := entry.strays(out):
        raise DataReconError(f"refusing to --overwrite {out}: it holds {strays[0]!r}, which another datarecon command "
                             f"wrote there (a {entry.title} never holds it); move it out of the folder or choose "
                             "another --out")
    return True


def _clear_listed(folder: Path) -> None:
    """Delete the entries ``folder``'s manifest lists (recursively) and stale bookkeeping below it."""
    names = manifest.listed(folder) or set()
    for p in sorted(folder.iterdir()):
        if is_temp_file(p.name, folder):
            p.unlink()
        elif p.name in names:
            if p.is_dir() and not p.is_symlink():
                if manifest.listed(p) is not None:
                    _clear_listed(p)
                for name in BOOKKEEPING:
                    (p / name).unlink(missing_ok=True)
                if empty_tree(p):
                    shutil.rmtree(p)
            else:
                p.unlink()


def _clear_legacy(folder: Path, entry: ArtefactKind) -> None:
    """Delete what a folder written before manifests existed holds (checked by :func:`check_out_dir`)."""
    for p in sorted(folder.iterdir()):
        if p.name in BOOKKEEPING:
            continue
        if not (entry.owns(p.name) or is_temp_file(p.name, folder)):
            continue  # never reached after check_out_dir; kept as a second guard
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def remove_written(folder: str | Path) -> None:
    """Delete a sub-folder datarecon wrote (a killed piece's partial result), refusing one that holds
    anything datarecon did not write there (named in the one-line error; nothing is deleted)."""
    folder = Path(folder)
    if manifest.listed(folder) is None and not empty_tree(folder):
        foreign = legacy_unlisted(folder, "", None)
    else:
        foreign = unlisted(folder)
    if foreign:
        raise DataReconError(f"refusing to clear {folder}: it holds {foreign[0]!r}, which datarecon did not write; "
                             "move it elsewhere and rerun")
    if manifest.listed(folder) is not None:
        _clear_listed(folder)
    else:
        for p in sorted(folder.iterdir()):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    shutil.rmtree(folder)


def clear_out_dir(out: str | Path, *, kind: str, names: tuple[str, ...] | None = None) -> None:
    """Delete what datarecon wrote in ``out`` (a folder :func:`check_out_dir` accepted, with the same
    ``names``); the folder, its lock and the kind line of its manifest stay."""
    out = Path(out)
    if manifest.listed(out) is not None:
        _clear_listed(out)
        manifest.reset(out)
    else:
        _clear_legacy(out, with_names(ARTEFACTS.get(kind), names))


def prepare_out_dir(out: str | Path, *, kind: str, overwrite: bool = False, resume: bool = False,
                    nested: bool = False) -> Path:
    """:func:`check_out_dir`, then :func:`clear_out_dir` when asked to, then create ``out`` and its manifest.

    Takes no lock: commands use :func:`claim_out_dir`, which does the same under the folder's lock.
    """
    out = Path(out)
    if check_out_dir(out, kind=kind, overwrite=overwrite, resume=resume, nested=nested):
        clear_out_dir(out, kind=kind)
    manifest.start(out, kind=kind)
    return out


@dataclass
class OutDir:
    """An output folder claimed by :func:`claim_out_dir`: locked and checked, not yet written.

    Attributes:
        path: the folder.
        kind: its :data:`ARTEFACTS` key.
        clear: it must be cleared before the first write (``--overwrite`` of an accepted folder).
        names: a reproduction's recorded top-level entries (folders written before manifests).
    """

    path: Path
    kind: str
    clear: bool
    names: tuple[str, ...] | None = None

    def prepare(self) -> Path:
        """Clear the folder if needed and start its manifest: call once the inputs are accepted."""
        if self.clear:
            clear_out_dir(self.path, kind=self.kind, names=self.names)
            self.clear = False
        manifest.start(self.path, kind=self.kind)
        return self.path


@contextmanager
def claim_out_dir(out: str | Path, *, kind: str, overwrite: bool = False, resume: bool = False,
                  names: tuple[str, ...] | None = None, nested: bool = False) -> Iterator[OutDir]:
    """Lock ``out`` (:func:`datarecon.utils.lock.hold`), check it (:func:`check_out_dir`) and yield
    an :class:`OutDir` whose :meth:`OutDir.prepare` clears and starts it; the one way commands
    claim an output folder.

    Nothing is written until ``prepare``; a folder the lock had to create is removed again when
    the block ends without writing to it (a command refused after taking the lock leaves no trace).

    ``nested``: ``out`` lies inside a folder the caller itself claimed (see :func:`check_out_dir`).

    Raises:
        DataReconError: another process holds the folder, or :func:`check_out_dir` refuses it.
    """
    out = Path(out)
    if not nested:
        check_outside(out)  # first: a file inside another datarecon folder is named as such; before the lock
    if out.exists() and not out.is_dir():
        raise DataReconError(f"--out {out} is an existing file; choose a directory for --out")
    check_path(out)
    what = "results store" if kind == "store" else "output folder"
    with hold(out, what=what):
        yield OutDir(out, kind, check_out_dir(out, kind=kind, overwrite=overwrite, resume=resume, names=names,
                                              nested=nested), names)


__all__ = ["ARTEFACTS", "BOOKKEEPING", "ArtefactKind", "OutDir", "check_out_dir", "check_out_file", "check_outside",
           "check_path", "check_writable",
           "claim_out_dir", "clear_out_dir", "enclosing_artefact", "identify", "is_empty", "is_temp_file", "prepare_out_dir", "remove_written", "unlisted"]
