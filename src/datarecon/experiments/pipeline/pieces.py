"""Pieces of a reproduction, each in its own directory with an atomic completion marker.

A reproduction is a list of :class:`Piece` s (train target X, run attack Y, evaluate Z, draw
figure W). Each piece writes only under ``OUT/<piece.key>/``; when it finishes, the runner writes
``OUT/<piece.key>/DONE.json`` atomically (temp file + rename) as the very last thing. A rerun of
the same reproduction into the same ``OUT`` skips every piece whose marker exists and carries the
same hash, so a killed reproduction resumes where it stopped.

The hash of a piece covers its own spec (the part of the config it depends on) and the hashes of
the pieces it reads from, so changing one setting reruns exactly the pieces downstream of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datarecon.errors import DataReconError
from datarecon.experiments.pipeline.memory import format_bytes, resident_bytes
from datarecon.kernel.files import DONE_MARKER, REPORT_HTML, REPRODUCTION_JSON, TIMINGS_JSON
from datarecon.kernel.outdir import OutDir, claim_out_dir, remove_written
from datarecon.kernel.resume import folder_state
from datarecon.utils.io import atomic_write_json, config_hash, read_json

#: the presets of reproductions and audits (``<name>-<scale>.yaml``)
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"


@dataclass(frozen=True)
class Piece:
    """One resumable unit of a reproduction.

    Attributes:
        key: its directory relative to the output folder, e.g. ``"models/affine"``.
        run: ``run(ctx, dir) -> summary`` does the work, writing only under ``dir``; the returned
            JSON-able summary is stored in the marker and readable by later pieces.
        spec: JSON-able description of what determines its result (hashed).
        deps: keys of pieces it reads from (must come earlier in the plan).
        kind: short label for progress output ("train", "attack", "evaluate", "figure", ...).
        estimate: ``estimate(device) -> seconds`` (``device`` a torch device name such as ``"cpu"`` or
            ``"cuda"``): the piece's expected wall time from a cost model, for ``--dry-run``; None when
            the piece has no model (cheap pieces: tables, figures).
    """

    key: str
    run: Callable[[Context, Path], dict[str, Any]]
    spec: dict[str, Any] = field(default_factory=dict)
    deps: tuple[str, ...] = ()
    kind: str = "piece"
    estimate: Callable[[str], float | None] | None = field(default=None, compare=False)


@dataclass
class Context:
    """What a running piece may read: the output folder, finished pieces' summaries, options.

    Attributes:
        out: the reproduction's output folder.
        data_dir: data folder (None: ``$DATARECON_DATA`` / cache).
        device: torch device name for training and attacks.
        resume: let trainings and attack runs continue from their own checkpoints inside an unfinished piece.
        progress: long pieces (training, attacks) report progress on stderr: a bar on a terminal,
            plain rate-limited lines (step, rate, ETA) in a log.
        summaries: key -> summary of every finished piece so far.
    """

    out: Path
    data_dir: str | Path | None = None
    device: str = "cpu"
    resume: bool = False
    progress: bool = False
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def dir(self, key: str) -> Path:
        """The directory of piece ``key``."""
        return self.out / key

    def summary(self, key: str) -> dict[str, Any]:
        """The summary of the finished piece ``key``."""
        try:
            return self.summaries[key]
        except KeyError:
            raise DataReconError(f"piece {key!r} has not run yet; this is a bug in the reproduction plan") from None



@dataclass(frozen=True)
class Runtime:
    """Where and how the pieces of a reproduction (or an audit) compute: a
    :class:`Context` without its output folder.

    Attributes:
        data_dir: data folder (None: ``$DATARECON_DATA`` / cache).
        device: torch device name, ``cpu`` or ``cuda[:N]``.
        resume: inside an unfinished piece, continue a training or an attack from its checkpoint
            (and reuse an output folder of the same configuration).
        progress: progress inside long pieces (training epochs, attack steps) on stderr: a bar on a
            terminal, plain rate-limited lines with rate and ETA otherwise.
    """

    data_dir: str | Path | None = None
    device: str = "cpu"
    resume: bool = False
    progress: bool = False

    def context(self, out: Path) -> Context:
        """The :class:`Context` of the pieces writing into ``out``."""
        return Context(out=out, data_dir=self.data_dir, device=self.device, resume=self.resume,
                       progress=self.progress)


@dataclass(frozen=True)
class PieceRecord:
    """What happened to one piece in :func:`execute`: ``status`` is "ran" or "skipped"."""

    key: str
    status: str
    wall_time_s: float
    hash: str


def piece_hashes(pieces: Sequence[Piece]) -> dict[str, str]:
    """Hash of each piece: its key, spec and the hashes of its dependencies.

    Raises:
        DataReconError: duplicate keys or a dependency that is not earlier in the plan.
    """
    hashes: dict[str, str] = {}
    for p in pieces:
        if p.key in hashes:
            raise DataReconError(f"piece {p.key!r} appears twice in the plan")
        missing = [d for d in p.deps if d not in hashes]
        if missing:
            raise DataReconError(f"piece {p.key!r} depends on {missing}, which are not earlier in the plan")
        hashes[p.key] = config_hash({"key": p.key, "spec": p.spec, "deps": {d: hashes[d] for d in p.deps}})
    return hashes


def is_done(directory: Path, expected_hash: str) -> bool:
    """Whether ``directory`` holds a completion marker with ``expected_hash`` (the one folder reading,
    :func:`datarecon.kernel.resume.folder_state`)."""
    return folder_state(directory, record=DONE_MARKER, key={"hash": expected_hash}).finished


def execute(pieces: Sequence[Piece], ctx: Context, *, log: Callable[[str], None] = print) -> list[PieceRecord]:
    """Run the pieces in order, skipping those already finished with the same hash.

    A piece directory without a valid marker is cleared before its piece runs (a partial result
    of a killed run), except that with ``ctx.resume`` it is kept so a training or an attack can
    continue from its own checkpoint.

    Returns:
        One :class:`PieceRecord` per piece.
    """
    hashes = piece_hashes(pieces)
    records: list[PieceRecord] = []
    total = len(pieces)
    width = len(str(total))
    for i, p in enumerate(pieces, start=1):
        d = ctx.dir(p.key)
        h = hashes[p.key]
        tag = f"[{i:>{width}}/{total}] {p.kind:<8} {p.key}"
        found = folder_state(d, record=DONE_MARKER, key={"hash": h})
        if found.finished:
            ctx.summaries[p.key] = (found.record or {}).get("summary", {})
            log(f"{tag}: done earlier, skipped")
            records.append(PieceRecord(p.key, "skipped", 0.0, h))
            continue
        if d.exists() and not ctx.resume:
            remove_written(d)  # a killed piece's partial result; anything else in it is refused, not deleted
        elif (d / DONE_MARKER).exists():  # stale marker (other hash): never trust it
            (d / DONE_MARKER).unlink()
        d.mkdir(parents=True, exist_ok=True)
        log(f"{tag}: running ...")
        t0 = time.perf_counter()
        summary = p.run(ctx, d) or {}
        wall = time.perf_counter() - t0
        ctx.summaries[p.key] = summary
        atomic_write_json(d / DONE_MARKER, {"key": p.key, "hash": h, "kind": p.kind, "wall_time_s": wall,
                                       "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                       "deps": list(p.deps), "summary": summary})
        log(f"{tag}: done in {wall:.1f} s")
        records.append(PieceRecord(p.key, "ran", wall, h))
    return records


@dataclass(frozen=True)
class PlannedPiece:
    """One line of a dry run: a piece, whether it is already finished, and its estimated wall time.

    Attributes:
        key, kind: as in :class:`Piece`.
        done: a completion marker with the same hash exists (a rerun would skip it).
        estimate_s: estimated seconds on the chosen device (None: no cost model; cheap).
        memory_bytes: estimated peak tensor memory (the estimate's ``memory_bytes``; None: not modelled).
    """

    key: str
    kind: str
    done: bool
    estimate_s: float | None
    memory_bytes: int | None = None


def dry_run(pieces: Sequence[Piece], ctx: Context) -> list[PlannedPiece]:
    """What :func:`execute` would do, without running anything: each piece, done or not, and its estimate."""
    hashes = piece_hashes(pieces)
    out = []
    for p in pieces:
        done = is_done(ctx.dir(p.key), hashes[p.key])
        est = p.estimate(ctx.device) if p.estimate is not None else None
        mem = getattr(p.estimate, "memory_bytes", None)
        out.append(PlannedPiece(p.key, p.kind, done, None if est is None else float(est),
                                None if mem is None else int(mem)))
    return out


#: Wall time of the pieces without a cost model, measured in the runkel2024 smoke run (2026-11-25,
#: 2-core shared CPU, one thread; evaluation grows with m x the reference images, figures with the
#: images drawn). A range per kind, printed so that a dry run says what they cost.
CHEAP_PIECE_SECONDS = {"evaluate": (0.05, 0.5), "figure": (0.5, 1.5), "table": (0.0, 0.1), "select": (0.0, 0.1)}


def format_plan(planned: Sequence[PlannedPiece], *, device: str) -> list[str]:
    """Human-readable lines for a dry run: one per piece (state, time, peak tensor memory), then the
    total time still to run, the largest memory, and what the pieces without a cost model cost."""
    width = max((len(p.key) for p in planned), default=10)
    lines = [f"{'piece':<{width}}  {'kind':<8}  {'state':<5}  {'time (' + device + ')':<14}  memory"]
    todo = 0.0
    cheap: dict[str, int] = {}
    for p in planned:
        est = "-" if p.estimate_s is None else format_seconds(p.estimate_s)
        mem = "-" if p.memory_bytes is None else format_bytes(p.memory_bytes)
        lines.append(f"{p.key:<{width}}  {p.kind:<8}  {'done' if p.done else 'todo':<5}  {est:<14}  {mem}")
        if not p.done:
            if p.estimate_s is None:
                cheap[p.kind] = cheap.get(p.kind, 0) + 1
            else:
                todo += p.estimate_s
    lines.append(f"to run: {sum(not p.done for p in planned)} of {len(planned)} pieces, "
                 f"estimated {format_seconds(todo)} for the modelled ones")
    if cheap:
        lo = sum(CHEAP_PIECE_SECONDS.get(k, (0.0, 1.0))[0] * n for k, n in cheap.items())
        hi = sum(CHEAP_PIECE_SECONDS.get(k, (0.0, 1.0))[1] * n for k, n in cheap.items())
        what = ", ".join(f"{n} {k}" for k, n in sorted(cheap.items()))
        lines.append(f"  + {what} pieces without a cost model: {format_seconds(lo)}-{format_seconds(hi)} at smoke "
                     "size on a 2-core CPU (they grow with the number of candidates and images)")
    todo_mem = [p for p in planned if not p.done and p.memory_bytes is not None]
    if todo_mem:
        big = max(todo_mem, key=lambda p: p.memory_bytes or 0)
        lines.append(f"peak memory: about {format_bytes(resident_bytes(big.memory_bytes or 0))} resident "
                     f"({big.key}: {format_bytes(big.memory_bytes or 0)} of weights, optimiser state, inputs and kept "
                     "activations, plus the process; fitted to measured runs, docs/PERFORMANCE.md §6)")
    return lines


def format_seconds(s: float) -> str:
    """``42 s``, ``3.5 min`` or ``2.1 h``."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def entries(pieces: Sequence[Piece]) -> list[str]:
    """The top-level names a reproduction of ``pieces`` writes in its folder (recorded in its manifest)."""
    return sorted({p.key.split("/")[0] for p in pieces} | {REPRODUCTION_JSON, REPORT_HTML, TIMINGS_JSON})


def check_manifest(out: Path, *, name: str, config_hash_: str, overwrite: bool) -> None:
    """:func:`claim_reproduction` and prepare ``out`` at once (for callers that hold no lock for long)."""
    with claim_reproduction(out, name=name, config_hash_=config_hash_, overwrite=overwrite) as claim:
        claim.prepare()


@contextmanager
def claim_reproduction(out: Path, *, name: str, config_hash_: str, overwrite: bool,
                       resume: bool = False) -> Iterator[OutDir]:
    """Lock and check a reproduction's (or audit's) output folder; refuse to mix two configurations.

    ``OUT/reproduction.json`` names the reproduction, its config hash and the top-level entries it
    writes (:func:`entries`). A folder written by another reproduction or config is refused unless
    ``overwrite``; then only what datarecon wrote there is deleted (the folder's manifest,
    :mod:`datarecon.utils.manifest`; for folders of earlier versions the entries of
    ``reproduction.json``), and a folder holding anything else (``notes.txt``, at any depth) is
    refused and left as it is. A folder without a manifest (not a reproduction) is never emptied
    (:mod:`datarecon.kernel.outdir`). The yielded claim's ``prepare()`` clears and starts the folder.

    Raises:
        DataReconError: ``resume`` with ``overwrite``; ``out`` holds another reproduction/config,
            unrelated files, or is in use by another process.
    """
    if resume and overwrite:
        raise DataReconError("pass either --resume (continue the reproduction in --out) or --overwrite (start "
                             "afresh), not both")
    manifest = out / REPRODUCTION_JSON
    same, names = False, None
    if manifest.is_file():
        m = read_json(manifest)
        same = m.get("name") == name and m.get("config_hash") == config_hash_
        names = tuple(m["entries"]) if isinstance(m.get("entries"), list) else None
        if out.is_dir() and not same and not overwrite:
            raise DataReconError(f"{out} holds another configuration ({m.get('name')}, hash "
                                 f"{m.get('config_hash')}); pass --overwrite to replace it or choose another --out",
                                 python="overwrite=True, another out")
    with claim_out_dir(out, kind="reproduction", overwrite=overwrite, resume=same, names=names) as claim:
        yield claim
