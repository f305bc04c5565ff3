"""Output folders: refuse to overwrite anything that is not recognisably ours.

Every command that writes a folder (``train``, ``reconstruct``, ``demo``, ``sweep``,
``reproduce``) names the *kind* of artefact it writes. An existing, non-empty ``--out`` is

* refused without ``--overwrite`` / ``--resume``;
* with ``--overwrite``, cleared only when it is recognisably a datarecon artefact of the same kind:
  one of the kind's marker files is present and every entry is a name datarecon writes there
  (plus leftover temporary files of the atomic writer). Only those entries are deleted, never the
  folder itself; a folder holding anything else (``thesis.txt``, a project checkout, ``--out .``)
  is refused with a one-line error and left untouched;
* with ``--resume`` (or a sweep rerun), refused when it is an artefact of *another* kind (a run
  folder passed to ``sweep --out``, a model folder passed to ``reconstruct --out``).

The table of kinds is :data:`ARTEFACTS`; ``tests/utils/test_outdir.py`` checks it against the
file-name constants of the modules that write each kind.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from datarecon import checkpoint
from datarecon.errors import DataReconError
from datarecon.registry import Registry


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
    """

    title: str
    markers: tuple[str, ...]
    names: tuple[str, ...] | None
    checkpoint: checkpoint.Kind | None = None

    def recognises(self, folder: Path) -> bool:
        """Whether ``folder`` holds one of this kind's markers (or its kind of checkpoint)."""
        if any((folder / m).exists() for m in self.markers):
            return True
        return self.checkpoint is not None and checkpoint.kind_of(folder / checkpoint.FOLDER) == self.checkpoint

    def foreign(self, folder: Path) -> list[str]:
        """Entries of ``folder`` datarecon does not write for this kind (sorted)."""
        if self.names is None:
            return []
        return sorted(p.name for p in folder.iterdir() if p.name not in self.names and not is_temp_file(p.name))


ARTEFACTS: Registry[ArtefactKind] = Registry("output kind")
ARTEFACTS.register("model", ArtefactKind(
    "model directory", ("model.json",),
    ("weights.safetensors", "extras.safetensors", "model.json", "history.jsonl", "checkpoint",
     "checkpoint-margin-ascent"), checkpoint.Kind.TRAIN))
ARTEFACTS.register("run", ArtefactKind(
    "run directory", ("run.json",),
    ("candidates.safetensors", "init.safetensors", "run.json", "history.jsonl", "checkpoint", "metrics.json",
     "candidates.csv", "neighbours.safetensors", "report.html", "task.json", ".claim"), checkpoint.Kind.ATTACK))
ARTEFACTS.register("demo", ArtefactKind(
    "demo folder", ("model/model.json", "run/run.json"), ("model", "run", "reconstructions.png", "report.html")))
ARTEFACTS.register("store", ArtefactKind(
    "results store", ("index.sqlite", "runs", "sweeps"),
    ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm", "index.sqlite-journal", "runs", "pools", "sweeps")))
ARTEFACTS.register("reproduction", ArtefactKind("reproduction folder", ("reproduction.json",), None))
ARTEFACTS.register("experiment", ArtefactKind(
    "experiment folder", ("experiment.json",), ("experiment.json", "model", "run", "report.html")))


def is_temp_file(name: str) -> bool:
    """A temporary file left by :func:`datarecon.utils.io.atomic_write_bytes` (``.<name>.<random>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def _with_names(entry: ArtefactKind, names: tuple[str, ...] | None) -> ArtefactKind:
    return entry if names is None else dataclasses.replace(entry, names=names)


def identify(folder: Path) -> str | None:
    """The kind whose markers ``folder`` holds (None when it holds none)."""
    for name in ARTEFACTS.names():
        if ARTEFACTS.get(name).recognises(folder):
            return name
    return None


def check_out_dir(out: str | Path, *, kind: str, overwrite: bool = False, resume: bool = False,
                  names: tuple[str, ...] | None = None) -> bool:
    """Decide what may happen to ``out`` before anything is written.

    Args:
        out: the output folder.
        kind: an :data:`ARTEFACTS` key.
        overwrite: the user asked to replace an existing folder.
        resume: the user asked to continue the run in ``out`` (or the command always resumes).
        names: the entries this folder's own record says datarecon wrote there (a reproduction's
            manifest); they replace the kind's ``names``.

    Returns:
        True when ``out`` must be cleared (with :func:`clear_out_dir`) before writing.

    Raises:
        DataReconError: ``out`` is a file; it exists without ``--overwrite``/``--resume``; it is an
            artefact of another kind; or ``--overwrite`` would delete something datarecon did not write.
    """
    out = Path(out)
    entry = _with_names(ARTEFACTS.get(kind), names)
    if out.exists() and not out.is_dir():
        raise DataReconError(f"--out {out} is an existing file; choose a directory for --out")
    if not out.is_dir() or not any(out.iterdir()):
        return False
    other = identify(out)
    if not entry.recognises(out) and other is not None and other != kind:
        raise DataReconError(f"--out {out} is a datarecon {ARTEFACTS.get(other).title}, not a {entry.title}; "
                             "choose another --out")
    if resume:
        return False
    if not overwrite:
        raise DataReconError(f"output directory {out} exists; pass --overwrite to replace it or choose another --out")
    foreign = entry.foreign(out)
    only_temp = all(is_temp_file(p.name) for p in out.iterdir())
    if not (entry.recognises(out) or only_temp) or foreign:
        if not foreign:
            what = "none of its files were written by datarecon"
        else:
            more = f" and {len(foreign) - 1} more entries" if len(foreign) > 1 else ""
            what = f"it holds {foreign[0]!r}{more}"
        raise DataReconError(f"refusing to --overwrite {out}: it is not a datarecon {entry.title} ({what}); "
                             "choose another --out or remove it yourself")
    return True


def clear_out_dir(out: str | Path, *, kind: str, names: tuple[str, ...] | None = None) -> None:
    """Delete what datarecon wrote in ``out`` (a folder :func:`check_out_dir` accepted, with the same
    ``names``); the folder stays."""
    out = Path(out)
    entry = _with_names(ARTEFACTS.get(kind), names)
    for p in sorted(out.iterdir()):
        if entry.names is not None and p.name not in entry.names and not is_temp_file(p.name):
            continue  # never reached after check_out_dir; kept as a second guard
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def prepare_out_dir(out: str | Path, *, kind: str, overwrite: bool = False, resume: bool = False) -> Path:
    """:func:`check_out_dir`, then :func:`clear_out_dir` when asked to, then create ``out``."""
    out = Path(out)
    if check_out_dir(out, kind=kind, overwrite=overwrite, resume=resume):
        clear_out_dir(out, kind=kind)
    out.mkdir(parents=True, exist_ok=True)
    return out


__all__ = ["ARTEFACTS", "ArtefactKind", "check_out_dir", "clear_out_dir", "identify", "is_temp_file",
           "prepare_out_dir"]
