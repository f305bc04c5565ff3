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

The table of kinds is :data:`ARTEFACTS`; ``tests/kernel/test_outdir.py`` checks it against the
file-name constants of the modules that write each kind.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from datarecon.kernel import checkpoint
from datarecon.errors import DataReconError
from datarecon.registry import Registry
from datarecon.utils import manifest
from datarecon.utils.atomic import temp_target
from datarecon.utils.io import read_json
from datarecon.utils.lock import LOCK_FILE, check_free, hold
from datarecon.kernel.files import DONE_MARKER, CANDIDATES, CANDIDATES_CSV, EXPERIMENT_JSON, EXTRAS, HISTORY, INIT_FILE, MEMBERSHIP_TARGET, METRICS_FILE, MODEL_JSON, NEIGHBOURS_FILE, RECONSTRUCTIONS_PNG, REPORT_HTML, REPRODUCTION_JSON, RUN_JSON, SUBSPACE_FILE, TASK_FILE, WEIGHTS
from datarecon.kernel.status import Status


@dataclass(frozen=True)
class ArtefactKind:
    """A kind of output folder.

    Attributes:
        title: how messages name it ("model directory").
        markers: relative paths of which at least one is present in every such folder.
        names: the top-level entries datarecon writes there; None when any entry belongs to it
            (a reproduction folder, identified by its manifest).
        checkpoint: the kind of loop whose checkpoint in ``checkpoint/`` also marks such a folder
            (a killed training or attack leaves only that); None when none does.
        name: its :data:`ARTEFACTS` key (the kind a manifest records).
        pattern: a regular expression of further top-level names (``run0``, ``run1``, ... of
            ``reconstruct --runs``), for folders written before manifests existed.
        resumable: the commands writing it take ``--resume`` (named in the refusal of a folder
            holding an unfinished one).
    """

    title: str
    markers: tuple[str, ...]
    names: tuple[str, ...] | None
    checkpoint: checkpoint.Kind | None = None
    name: str = ""
    pattern: str | None = None
    resumable: bool = False

    def recognises(self, folder: Path, *, composite: bool = True) -> bool:
        """Whether ``folder``'s manifest names this kind, or it holds one of its markers (or checkpoint).

        ``composite=False`` leaves out markers inside sub-folders (the demo's ``model/model.json``):
        they also match a user's project folder that holds a model and a run side by side.
        """
        recorded = manifest.kind_of(folder)
        if recorded is not None:
            return recorded == self.name
        if any((folder / m).exists() for m in self.markers if composite or "/" not in m):
            return True
        return self.checkpoint is not None and checkpoint.kind_of(folder / checkpoint.FOLDER) == self.checkpoint

    def owns(self, name: str) -> bool:
        """Whether a folder of this kind written before manifests existed holds ``name`` at its top."""
        if self.names is None or name in self.names:
            return True
        return self.pattern is not None and re.fullmatch(self.pattern, name) is not None

    def foreign(self, folder: Path) -> list[str]:
        """Entries of ``folder``, at any depth, that datarecon did not write there (sorted relative paths)."""
        return unlisted(folder, kind=self)

    def strays(self, folder: Path) -> list[str]:
        """Top-level entries ``folder``'s manifest lists that this kind never writes: what another command
        put inside it before such paths were refused (a run in a model folder); ``--overwrite`` keeps them."""
        listed = manifest.listed(folder) or set()
        return [name for name in sorted(listed) if (folder / name).exists() and not self.owns(name)]


ARTEFACTS: Registry[ArtefactKind] = Registry("output kind")


def _register(name: str, kind: ArtefactKind) -> None:
    ARTEFACTS.register(name, dataclasses.replace(kind, name=name))


_register("model", ArtefactKind(
    "model directory", (MODEL_JSON,),
    (WEIGHTS, EXTRAS, MODEL_JSON, HISTORY, "checkpoint",
     "checkpoint-margin-ascent"), checkpoint.Kind.TRAIN, resumable=True))
_register("run", ArtefactKind(
    "run directory", (RUN_JSON,),
    (CANDIDATES, INIT_FILE, SUBSPACE_FILE, RUN_JSON, HISTORY, "checkpoint",
     METRICS_FILE, CANDIDATES_CSV, NEIGHBOURS_FILE, REPORT_HTML, TASK_FILE, ".claim"),
    checkpoint.Kind.ATTACK, pattern=r"run\d+", resumable=True))
_register("demo", ArtefactKind(
    "demo folder", ("model/model.json", "run/run.json"), ("model", "run", RECONSTRUCTIONS_PNG, REPORT_HTML)))
# a store is recognised by its manifest or its index; a bare runs/ folder is not a store
_register("store", ArtefactKind(
    "results store", ("index.sqlite",),
    ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm", "index.sqlite-journal", "runs", "pools", "sweeps")))
_register("reproduction", ArtefactKind("reproduction folder", (REPRODUCTION_JSON,), None, resumable=True))
# a membership folder (``datarecon membership --out``): its result, scores, figure, the most exposed members, pool and
# reference models
_register("membership", ArtefactKind(
    "membership folder", ("membership.json", "pool.safetensors"),
    ("membership.json", "images.json", "scores.safetensors", "signals.csv", "roc.png", "exposed.csv",
     "exposed.safetensors", "pool.safetensors", "references", MEMBERSHIP_TARGET, REPORT_HTML)))
_register("experiment", ArtefactKind(
    "experiment folder", (EXPERIMENT_JSON,), (EXPERIMENT_JSON, "model", "run", REPORT_HTML)))

#: files of a checkpoint folder (the current format and the training format before it), for
#: folders written before manifests existed
_CHECKPOINT_NAMES = (checkpoint.STATE_FILE, checkpoint.PROGRESS_FILE, checkpoint.LEGACY_TRAIN_JSON)
_LEGACY_CHECKPOINT_STATE = re.compile(r"state-\d+\.safetensors")
#: bookkeeping files datarecon keeps in every folder it writes
BOOKKEEPING = (manifest.MANIFEST, LOCK_FILE)



def is_temp_file(name: str, folder: str | Path | None = None) -> bool:
    """A temporary file that :func:`datarecon.utils.atomic.replace_atomically` left in ``folder``.

    Only the exact name the writer creates counts (``.<target>.<8 random characters>.tmp``), and
    only when ``<target>`` is a file datarecon writes there: listed in ``folder``'s manifest, a
    bookkeeping file, or (in a folder written before manifests existed, or without a folder) a name
    datarecon writes. A user's ``.run.json.backup.tmp`` is not one, so ``--overwrite`` keeps it.
    """
    target = temp_target(name)
    if target is None:
        return False
    if target in BOOKKEEPING:
        return True
    names = manifest.listed(folder) if folder is not None else None
    return target in names if names is not None else _known_legacy_file(target)


def _ignored(name: str, folder: Path | None = None) -> bool:
    """Bookkeeping and temporary files: datarecon's in any folder, never counted as content."""
    return name in BOOKKEEPING or is_temp_file(name, folder)


def _with_names(entry: ArtefactKind, names: tuple[str, ...] | None) -> ArtefactKind:
    return entry if names is None else dataclasses.replace(entry, names=names)


def identify(folder: Path) -> str | None:
    """The kind ``folder``'s manifest records, else the kind whose markers it holds (None: neither).

    Markers inside sub-folders are not used here (a folder holding a ``model/`` and a ``run/`` is not
    therefore a demo folder); a command recognises a legacy folder of its own kind by them
    (:meth:`ArtefactKind.recognises`).
    """
    recorded = manifest.kind_of(folder)
    if recorded in ARTEFACTS:
        return recorded
    for name in ARTEFACTS.names():
        if ARTEFACTS.get(name).recognises(folder, composite=False):
            return name
    return None


def _empty_tree(p: Path) -> bool:
    """A folder holding nothing but (empty) folders and bookkeeping: deleting it loses nothing."""
    if p.is_symlink() or not p.is_dir():
        return False
    return all(_ignored(c.name, p) or _empty_tree(c) for c in p.iterdir())


def is_empty(folder: Path) -> bool:
    """``folder`` holds nothing but bookkeeping and empty folders (a folder a lock just created)."""
    return _empty_tree(folder)


def _known_legacy_file(name: str) -> bool:
    """A file name datarecon writes somewhere (folders written before manifests existed)."""
    known = {n for k in ARTEFACTS.names() for n in (ARTEFACTS.get(k).names or ())}
    return (name in known or name in _CHECKPOINT_NAMES or name == DONE_MARKER
            or _LEGACY_CHECKPOINT_STATE.fullmatch(name) is not None or re.fullmatch(r"[0-9a-f]{16}\.json", name)
            is not None)


def _legacy_unlisted(folder: Path, rel: str, kind: ArtefactKind | None) -> list[str]:
    """Entries of a folder without a manifest that datarecon does not write there."""
    found = []
    for p in sorted(folder.iterdir()):
        if _ignored(p.name, folder):
            continue
        r = rel + p.name
        if p.is_dir() and not p.is_symlink():
            if kind is not None and not kind.owns(p.name):
                found.append(r)
                continue
            sub = identify(p)
            found += _legacy_unlisted(p, r + "/", ARTEFACTS.get(sub) if sub else None)
        elif not (kind.owns(p.name) if kind is not None and kind.names is not None else _known_legacy_file(p.name)):
            found.append(r)
    return found


def unlisted(folder: str | Path, *, kind: ArtefactKind | None = None, rel: str = "") -> list[str]:
    """Relative paths of the entries of ``folder``, at any depth, that datarecon did not write.

    An entry counts as datarecon's when its folder's manifest lists it (and, for a folder, when
    everything in it is datarecon's). Bookkeeping files, temporary files of the atomic writer and
    empty folders never count. A folder without a manifest (written before manifests existed)
    falls back to the names ``kind`` writes there.
    """
    folder = Path(folder)
    names = manifest.listed(folder)
    if names is None:
        return _legacy_unlisted(folder, rel, kind)
    found = []
    for p in sorted(folder.iterdir()):
        if _ignored(p.name, folder):
            continue
        r = rel + p.name
        if p.name not in names:
            if not _empty_tree(p):
                found.append(r)
        elif p.is_dir() and not p.is_symlink():
            found += unlisted(p, rel=r + "/") if manifest.listed(p) is not None else (
                [] if _empty_tree(p) else [r + "/" + c.name for c in sorted(p.iterdir()) if not _ignored(c.name, p)][:1])
    return found


def _folder_kind(folder: Path) -> str | None:
    """The kind of artefact ``folder`` is by its root manifest or by a marker file of its own (None:
    none). The demo's two-folder markers are not used here: any folder holding a ``model/`` and a
    ``run/`` would otherwise count as a demo folder."""
    try:
        recorded = manifest.kind_of(folder)
        if recorded in ARTEFACTS:
            return recorded
        for name in ARTEFACTS.names():
            if any("/" not in m and (folder / m).is_file() for m in ARTEFACTS.get(name).markers):
                return name
    except OSError:  # an unreadable folder is no evidence of anything
        return None
    return None


def enclosing_artefact(path: str | Path) -> tuple[Path, ArtefactKind] | None:
    """The nearest folder strictly above ``path`` that is a datarecon artefact, with its kind (None: none)."""
    d = Path(os.path.abspath(path)).parent
    while True:
        kind = _folder_kind(d)
        if kind is not None:
            return d, ARTEFACTS.get(kind)
        if d.parent == d:
            return None
        d = d.parent


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
            meta = read_json(out / checkpoint.FOLDER / checkpoint.PROGRESS_FILE) \
                if (out / checkpoint.FOLDER / checkpoint.PROGRESS_FILE).is_file() else {}
            if meta or run or any(out.glob("run*/checkpoint")):
                return f"an unfinished run (stopped at step {meta.get('steps_done', '?')})" if meta else \
                    "an unfinished run"
        if kind == "model" and not (out / MODEL_JSON).is_file():
            meta = read_json(out / checkpoint.FOLDER / checkpoint.PROGRESS_FILE) \
                if (out / checkpoint.FOLDER / checkpoint.PROGRESS_FILE).is_file() else {}
            return f"an unfinished training (stopped at epoch {meta.get('epoch', '?')})"
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
    entry = _with_names(ARTEFACTS.get(kind), names)
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
    only_temp = all(_ignored(p.name, out) for p in out.iterdir())
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
                if _empty_tree(p):
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
    if manifest.listed(folder) is None and not _empty_tree(folder):
        foreign = _legacy_unlisted(folder, "", None)
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
        _clear_legacy(out, _with_names(ARTEFACTS.get(kind), names))


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
