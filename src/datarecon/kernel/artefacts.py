"""The kinds of folder datarecon writes (a model directory, a run directory, a store, a reproduction, ...): the table
:data:`ARTEFACTS` of each kind's marker files and the names it writes, how a folder is recognised
(:func:`identify`, :func:`enclosing_artefact`), and which entries of a folder datarecon did not write
(:func:`unlisted`, from the folder's manifest or, for folders written before manifests, from the names each kind
writes). :mod:`datarecon.kernel.outdir` decides with them what may happen to an output folder;
``tests/kernel/test_outdir.py`` checks the table against the file-name constants of the modules that write each
kind.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

from datarecon.kernel import checkpoint
from datarecon.registry import Registry
from datarecon.utils import manifest
from datarecon.utils.atomic import temp_target
from datarecon.utils.lock import LOCK_FILE
from datarecon.kernel.files import (ASCENT_CHECKPOINT_DIR, CANDIDATES, CANDIDATES_CSV, CHECKPOINT_DIR, DONE_MARKER,
                                    EXPERIMENT_JSON, EXTRAS, HISTORY, INIT_FILE, MEMBERSHIP_EXPOSED,
                                    MEMBERSHIP_EXPOSED_CSV, MEMBERSHIP_IMAGES, MEMBERSHIP_POOL, MEMBERSHIP_REFERENCES,
                                    MEMBERSHIP_RESULT, MEMBERSHIP_ROC, MEMBERSHIP_SCORES, MEMBERSHIP_SIGNALS_CSV,
                                    MEMBERSHIP_TARGET, METRICS_FILE, MODEL_JSON, NEIGHBOURS_FILE, RECONSTRUCTIONS_PNG,
                                    REPORT_HTML, REPRODUCTION_JSON, RUN_JSON, SUBSPACE_FILE, TASK_FILE, WEIGHTS)


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
    (WEIGHTS, EXTRAS, MODEL_JSON, HISTORY, CHECKPOINT_DIR, ASCENT_CHECKPOINT_DIR), checkpoint.Kind.TRAIN,
    resumable=True))
_register("run", ArtefactKind(
    "run directory", (RUN_JSON,),
    (CANDIDATES, INIT_FILE, SUBSPACE_FILE, RUN_JSON, HISTORY, CHECKPOINT_DIR,
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
    "membership folder", (MEMBERSHIP_RESULT, MEMBERSHIP_POOL),
    (MEMBERSHIP_RESULT, MEMBERSHIP_IMAGES, MEMBERSHIP_SCORES, MEMBERSHIP_SIGNALS_CSV, MEMBERSHIP_ROC,
     MEMBERSHIP_EXPOSED_CSV, MEMBERSHIP_EXPOSED, MEMBERSHIP_POOL, MEMBERSHIP_REFERENCES, MEMBERSHIP_TARGET,
     REPORT_HTML)))
_register("experiment", ArtefactKind(
    "experiment folder", (EXPERIMENT_JSON,), (EXPERIMENT_JSON, "model", "run", REPORT_HTML)))

#: files of a checkpoint folder (the current format and the training format before it), for
#: folders written before manifests existed
_CHECKPOINT_NAMES = (checkpoint.STATE_FILE, checkpoint.PROGRESS_FILE, checkpoint.PREVIOUS_STATE_FILE,
                     checkpoint.LEGACY_TRAIN_JSON)
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


def ignored(name: str, folder: Path | None = None) -> bool:
    """Bookkeeping and temporary files: datarecon's in any folder, never counted as content."""
    return name in BOOKKEEPING or is_temp_file(name, folder)


def with_names(entry: ArtefactKind, names: tuple[str, ...] | None) -> ArtefactKind:
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


def empty_tree(p: Path) -> bool:
    """A folder holding nothing but (empty) folders and bookkeeping: deleting it loses nothing."""
    if p.is_symlink() or not p.is_dir():
        return False
    return all(ignored(c.name, p) or empty_tree(c) for c in p.iterdir())


def is_empty(folder: Path) -> bool:
    """``folder`` holds nothing but bookkeeping and empty folders (a folder a lock just created)."""
    return empty_tree(folder)


def _known_legacy_file(name: str) -> bool:
    """A file name datarecon writes somewhere (folders written before manifests existed)."""
    known = {n for k in ARTEFACTS.names() for n in (ARTEFACTS.get(k).names or ())}
    return (name in known or name in _CHECKPOINT_NAMES or name == DONE_MARKER
            or _LEGACY_CHECKPOINT_STATE.fullmatch(name) is not None or re.fullmatch(r"[0-9a-f]{16}\.json", name)
            is not None)


def legacy_unlisted(folder: Path, rel: str, kind: ArtefactKind | None) -> list[str]:
    """Entries of a folder without a manifest that datarecon does not write there."""
    found = []
    for p in sorted(folder.iterdir()):
        if ignored(p.name, folder):
            continue
        r = rel + p.name
        if p.is_dir() and not p.is_symlink():
            if kind is not None and not kind.owns(p.name):
                found.append(r)
                continue
            sub = identify(p)
            found += legacy_unlisted(p, r + "/", ARTEFACTS.get(sub) if sub else None)
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
        return legacy_unlisted(folder, rel, kind)
    found = []
    for p in sorted(folder.iterdir()):
        if ignored(p.name, folder):
            continue
        r = rel + p.name
        if p.name not in names:
            if not empty_tree(p):
                found.append(r)
        elif p.is_dir() and not p.is_symlink():
            found += unlisted(p, rel=r + "/") if manifest.listed(p) is not None else (
                [] if empty_tree(p) else [r + "/" + c.name for c in sorted(p.iterdir()) if not ignored(c.name, p)][:1])
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
