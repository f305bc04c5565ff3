"""Results store: one directory per run (the source of truth) plus a SQLite index.

Layout of a store directory::

    index.sqlite          the index (WAL mode); rebuildable from the directories below
    runs/<key>/           one attack run (run-directory contract: run.json, candidates.safetensors, ...)
    runs/<key>/task.json  the sweep driver's record of the task (spec, attempts, error)
    pools/<key>/          pooled candidates of a sweep's best runs (same contract, method "pool")
    sweeps/<id>.json      one sweep: its config and the keys of its runs

Only sweep *drivers* write the index (workers write only their own run directory). Every write
is one ``BEGIN IMMEDIATE`` transaction with a busy timeout, in WAL mode, so several drivers (or a
``store rebuild``) can write one store at once without corrupting it; readers never block writers.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from datarecon.errors import CheckpointError, DataReconError
from datarecon.kernel.files import RUN_JSON, TASK_FILE
from datarecon.kernel.outdir import ARTEFACTS, identify, is_empty
from datarecon.kernel.status import FINISHED as STATUS_FINISHED
from datarecon.utils import manifest
from datarecon.utils.io import atomic_write_json, atomic_write_text, read_json

INDEX = "index.sqlite"
#: the index file and the files SQLite keeps beside it
INDEX_SUFFIXES = ("", "-wal", "-shm", "-journal")
#: where :meth:`Store.rebuild` moves an index SQLite cannot read (it is kept, never deleted)
DAMAGED_SUFFIX = ".damaged"
RUNS, POOLS, SWEEPS = "runs", "pools", "sweeps"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0

#: plain columns of the ``runs`` table, in display order
COLUMNS = ("key", "kind", "method", "status", "steps_done", "wall_time_s", "seed", "attempts", "error",
           "model_dir", "run_dir", "updated")
#: JSON columns; ``list --sort selection.<name>`` sorts by a field inside one of them
JSON_COLUMNS = ("params", "config", "final", "selection", "extra")
#: run.json statuses after which a run is not executed again
FINISHED = STATUS_FINISHED  # complete, stopped-early, diverged (datarecon.kernel.status)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
CREATE TABLE IF NOT EXISTS runs (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, method TEXT, status TEXT, steps_done INTEGER,
    wall_time_s REAL, seed INTEGER, attempts INTEGER, error TEXT, model_dir TEXT, run_dir TEXT NOT NULL,
    updated REAL, params TEXT, config TEXT, final TEXT, selection TEXT, extra TEXT
);
CREATE TABLE IF NOT EXISTS sweeps (id TEXT PRIMARY KEY, name TEXT, config TEXT, n_runs INTEGER, created REAL);
CREATE TABLE IF NOT EXISTS sweep_runs (
    sweep_id TEXT NOT NULL, key TEXT NOT NULL, idx INTEGER, PRIMARY KEY (sweep_id, key)
);
CREATE INDEX IF NOT EXISTS sweep_runs_key ON sweep_runs (key);
"""

_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


class Store:
    """A results store rooted at ``root`` (created on first write).

    Args:
        root: the store directory.
        timeout_s: how long a writer waits for another writer's transaction (SQLite busy timeout).
    """

    def __init__(self, root: str | Path, *, timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.root = Path(root)
        self.timeout_s = timeout_s

    # -- paths -------------------------------------------------------------------------------
    @property
    def index_path(self) -> Path:
        return self.root / INDEX

    def run_dir(self, key: str) -> Path:
        return self.root / RUNS / key

    def pool_dir(self, key: str) -> Path:
        return self.root / POOLS / key

    def sweep_file(self, sweep_id: str) -> Path:
        return self.root / SWEEPS / f"{sweep_id}.json"

    # -- connection --------------------------------------------------------------------------
    @contextmanager
    def connect(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection; with ``write=True`` the block is one ``BEGIN IMMEDIATE`` transaction."""
        if self.index_path.exists() and not self.index_path.is_file():
            raise DataReconError(f"{self.index_path} is not a file (a folder or a device); move it out of the store, "
                                 f"then run `datarecon store rebuild {self.root}`")
        if not write and not self.index_path.is_file():
            check_store(self.root)
            raise DataReconError(f"no results index at {self.index_path}; run `datarecon store rebuild {self.root}`")
        self.root.mkdir(parents=True, exist_ok=True)
        if write:  # SQLite writes these itself: record them as datarecon's (utils.manifest)

            for suffix in INDEX_SUFFIXES:
                manifest.record(self.root / (INDEX + suffix))
        con = sqlite3.connect(self.index_path, timeout=self.timeout_s, isolation_level=None)
        try:
            con.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            if write:
                _retry_locked(lambda: con.execute("PRAGMA journal_mode = WAL"), self.timeout_s)
                con.execute("PRAGMA synchronous = NORMAL")
                _retry_locked(lambda: con.execute("BEGIN IMMEDIATE"), self.timeout_s)
                try:
                    for stmt in filter(str.strip, _SCHEMA.split(";")):
                        con.execute(stmt)
                    con.execute("INSERT OR IGNORE INTO meta (k, v) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                    yield con
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
            else:
                yield con
        finally:
            con.close()

    # -- writes (drivers only) ---------------------------------------------------------------
    def upsert_runs(self, rows: Iterable[dict[str, Any]]) -> None:
        """Insert or replace index rows (as made by :func:`row_from_dir`) in one transaction."""
        rows = list(rows)
        if not rows:
            return
        with self.connect(write=True) as con:
            for row in rows:
                _upsert(con, row)

    def add_sweep(self, sweep_id: str, *, name: str, config: dict[str, Any], keys: list[str]) -> None:
        """Record a sweep (file ``sweeps/<id>.json`` + index rows) and its membership."""
        record = {"id": sweep_id, "name": name, "config": config, "keys": keys, "created": time.time()}
        path = self.sweep_file(sweep_id)
        if path.is_file():
            record["created"] = read_json(path).get("created", record["created"])
        atomic_write_json(path, record)
        with self.connect(write=True) as con:
            _insert_sweep(con, record)

    def rebuild(self) -> int:
        """Re-create the index from the run, pool and sweep directories; returns the number of runs.

        The directories are scanned while holding the write lock, so a driver that finishes a run
        meanwhile waits and then adds its row: nothing written concurrently is lost. Readers see
        the old index until the transaction commits.

        Raises:
            DataReconError: the folder is not a results store (:func:`check_store`).
        """
        check_store(self.root, create=True)
        self._set_aside_if_damaged()
        with self.connect(write=True) as con:
            rows = [r for r in (row_from_dir(d, root=self.root) for d in self.run_dirs()) if r is not None]
            sweeps = []
            for f in sorted((self.root / SWEEPS).glob("*.json")):
                try:
                    sweeps.append(read_json(f))
                except CheckpointError:
                    continue
            con.execute("DELETE FROM runs")
            con.execute("DELETE FROM sweeps")
            con.execute("DELETE FROM sweep_runs")
            for row in rows:
                _upsert(con, row)
            for record in sweeps:
                _insert_sweep(con, record)
        return len(rows)

    def _set_aside_if_damaged(self) -> None:
        """Move an index SQLite cannot read to ``index.sqlite.damaged`` (kept; the rebuild replaces it)."""
        if not self.index_path.is_file():
            return
        try:
            con = sqlite3.connect(self.index_path, timeout=self.timeout_s)
            try:
                con.execute("PRAGMA schema_version").fetchone()
            finally:
                con.close()
        except sqlite3.DatabaseError:
            for suffix in INDEX_SUFFIXES:
                src = self.root / (INDEX + suffix)
                if src.exists():
                    manifest.record(src.with_name(src.name + DAMAGED_SUFFIX))
                    src.replace(src.with_name(src.name + DAMAGED_SUFFIX))

    # -- reads -------------------------------------------------------------------------------
    def run_dirs(self) -> list[Path]:
        """Every run and pool directory of the store, sorted."""
        out = []
        for sub in (RUNS, POOLS):
            base = self.root / sub
            if base.is_dir():
                out.extend(sorted(p for p in base.iterdir() if p.is_dir()))
        return out

    def rows(self, *, sort: str | None = None, descending: bool = False, limit: int | None = None,
             sweep_id: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Index rows (JSON columns decoded), optionally sorted by a column or ``<json>.<field>``.

        Rows whose sort value is missing come last. Raises DataReconError for an unknown column.
        """
        where, args = [], []
        if sweep_id is not None:
            where.append("key IN (SELECT key FROM sweep_runs WHERE sweep_id = ?)")
            args.append(sweep_id)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        sql = f"SELECT {', '.join(COLUMNS + JSON_COLUMNS)} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        expr = sort_expression(sort) if sort else "key"
        sql += f" ORDER BY ({expr}) IS NULL, {expr} {'DESC' if descending else 'ASC'}, key"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self.connect() as con:
            cur = con.execute(sql, args)
            names = [c[0] for c in cur.description]
            return [_decode(dict(zip(names, r))) for r in cur.fetchall()]

    def sweep_keys(self, sweep_id: str) -> list[str]:
        with self.connect() as con:
            cur = con.execute("SELECT key FROM sweep_runs WHERE sweep_id = ? ORDER BY idx", (sweep_id,))
            return [r[0] for r in cur.fetchall()]

    def sweeps(self) -> list[dict[str, Any]]:
        with self.connect() as con:
            cur = con.execute("SELECT id, name, n_runs, created FROM sweeps ORDER BY created")
            return [dict(zip(("id", "name", "n_runs", "created"), r)) for r in cur.fetchall()]

    def export(self, out: str | Path, *, sort: str | None = None) -> Path:
        """Write the index as CSV (or Parquet when ``out`` ends in .parquet and pyarrow imports).

        JSON columns are flattened into dotted columns (``selection.residual_rel``, ``params.init.scale``);
        the plain columns (:data:`COLUMNS`) always come first, also for an empty store, which is how
        :func:`is_export` recognises the file. The CSV is replaced atomically.
        """
        out = Path(out)
        flat = [flatten_row(r) for r in self.rows(sort=sort)]
        cols: list[str] = list(COLUMNS)
        for r in flat:
            cols.extend(c for c in r if c not in cols)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".parquet":
            try:  # pyarrow is optional: only a Parquet export needs it
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise DataReconError("Parquet export needs pyarrow; `pip install pyarrow` or export to .csv") from None
            table = pa.table({c: [_export_cell(r.get(c)) for r in flat] for c in cols})
            pq.write_table(table, out)
            return out
        if out.suffix != ".csv":
            raise DataReconError(f"export file {out} must end in .csv or .parquet")
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for r in flat:
            w.writerow({c: _export_cell(r.get(c)) for c in cols})
        atomic_write_text(out, buf.getvalue())
        return out


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is an index export :meth:`Store.export` wrote (its columns start with :data:`COLUMNS`)."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq  # optional: only Parquet needs it

            names = pq.read_schema(path).names
        else:
            with open(path, encoding="utf-8", newline="") as fh:
                names = next(csv.reader([fh.readline()]), [])
    except Exception:  # unreadable, not UTF-8, not Parquet, no pyarrow: not recognisably ours
        return False
    return tuple(names[:len(COLUMNS)]) == COLUMNS


def check_store(root: str | Path, *, create: bool = False) -> None:
    """Refuse a folder that is not a results store (a model or run directory, a user's folder), so
    that neither ``store list`` nor ``store rebuild`` treats it as one (a rebuild would write an
    index into it).

    Args:
        root: the store folder.
        create: an empty (or missing) folder is accepted, to become a new store (``rebuild``).

    Raises:
        DataReconError: the folder does not exist, is another kind of datarecon folder, or holds
            neither an index nor ``runs/``, ``pools/`` or ``sweeps/`` (and, with ``create``, is not empty).
    """
    root = Path(root)
    where = "pass the --out of a `datarecon sweep`"
    if not root.is_dir():
        if create and not root.exists():
            return
        raise DataReconError(f"no results index at {root}: the folder does not exist; {where}")
    kind = identify(root)
    if kind not in (None, "store"):
        raise DataReconError(f"{root} is a datarecon {ARTEFACTS.get(kind).title}, not a results store; {where}")
    if kind is None and not any((root / d).is_dir() for d in (RUNS, POOLS, SWEEPS)) and not (create and is_empty(root)):
        raise DataReconError(f"{root} is not a results store (no {INDEX}, {RUNS}/ or {POOLS}/ in it); {where}")


# ---------------------------------------------------------------------------
# rows


def row_from_dir(path: str | Path, *, root: str | Path | None = None) -> dict[str, Any] | None:
    """The index row of one run or pool directory, from its files alone (None if it holds neither
    ``run.json`` nor ``task.json``).

    ``run.json`` (written by the run) wins over ``task.json`` (the driver's record); a directory with
    only a failed ``task.json`` gives a ``failed`` row carrying the error.
    """
    path = Path(path)
    run = _read_optional(path / RUN_JSON)
    task = _read_optional(path / TASK_FILE)
    if run is None and task is None:
        return None
    task = task or {}
    run = run or {}
    kind = "pool" if path.parent.name == POOLS else "run"
    status = run.get("status")
    if task.get("status") == "failed" and status not in FINISHED:
        status = "failed"
    status = status or task.get("status") or "unknown"
    spec = task.get("spec") or {}
    rel = str(path.relative_to(root)) if root is not None and path.is_relative_to(root) else str(path)
    return {
        "key": task.get("key") or path.name, "kind": kind, "method": run.get("method") or spec.get("method"),
        "status": status, "steps_done": run.get("steps_done"), "wall_time_s": _as_float(run.get("wall_time_s")),
        "seed": run.get("seed", spec.get("seed")), "attempts": task.get("attempts"),
        "error": task.get("error") if status == "failed" else None,
        "model_dir": run.get("model_dir") or spec.get("model_dir"), "run_dir": rel,
        "updated": task.get("updated") or _mtime(path / RUN_JSON),
        "params": spec.get("params") or {}, "config": run.get("config") or spec,
        "final": run.get("final") or {}, "selection": run.get("selection") or {}, "extra": run.get("extra") or {},
    }


def sort_expression(col: str) -> str:
    """SQL expression for a sort column: a plain column or ``<json column>.<field>[.<field>...]``.

    Raises:
        DataReconError: unknown column (the message lists the valid ones).
    """
    if col in COLUMNS:
        return col
    root, _, rest = col.partition(".")
    parts = rest.split(".") if rest else []
    if root in JSON_COLUMNS and parts and all(_NAME.match(p) for p in parts):
        path = "$" + "".join(f'."{p}"' for p in parts)
        return f"json_extract({root}, '{path}')"
    raise DataReconError(
        f"unknown sort column {col!r}; use one of {', '.join(COLUMNS)} or <{'|'.join(JSON_COLUMNS)}>.<field>"
    )


def flatten_row(row: dict[str, Any]) -> dict[str, Any]:
    """Row with JSON columns flattened into dotted keys."""
    out = {k: row.get(k) for k in COLUMNS}
    for col in JSON_COLUMNS:
        _flatten(row.get(col) or {}, col, out)
    return out


def _flatten(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}", out)
    else:
        out[prefix] = obj


def _export_cell(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def _upsert(con: sqlite3.Connection, row: dict[str, Any]) -> None:
    cols = COLUMNS + JSON_COLUMNS
    values = [row.get(c) for c in COLUMNS] + [json.dumps(row.get(c) or {}, sort_keys=True) for c in JSON_COLUMNS]
    con.execute(f"INSERT OR REPLACE INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", values)


def _insert_sweep(con: sqlite3.Connection, record: dict[str, Any]) -> None:
    keys = list(record.get("keys") or [])
    con.execute("INSERT OR REPLACE INTO sweeps (id, name, config, n_runs, created) VALUES (?, ?, ?, ?, ?)",
                (record["id"], record.get("name", ""), json.dumps(record.get("config", {}), sort_keys=True),
                 len(keys), record.get("created")))
    con.execute("DELETE FROM sweep_runs WHERE sweep_id = ?", (record["id"],))
    con.executemany("INSERT OR REPLACE INTO sweep_runs (sweep_id, key, idx) VALUES (?, ?, ?)",
                    [(record["id"], k, i) for i, k in enumerate(keys)])


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for c in JSON_COLUMNS:
        if isinstance(row.get(c), str):
            row[c] = json.loads(row[c])
    return row


def _read_optional(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except CheckpointError:
        return None
    return data if isinstance(data, dict) else None


def _as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _retry_locked(fn, timeout_s: float):
    """Retry ``fn`` while SQLite says the database is locked (WAL switch / BEGIN IMMEDIATE races)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
