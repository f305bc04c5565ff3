"""Results store: rebuild from directories, sorting, export, and concurrent writers."""

from __future__ import annotations

import csv
import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from datarecon.errors import DataReconError
from datarecon.experiments.store import TASK_FILE, Store, row_from_dir
from datarecon.utils.io import atomic_write_json


def fake_run(root: Path, key: str, *, residual: float, status: str = "complete", failed: bool = False) -> Path:
    """A run directory with the files the store reads (run.json + the driver's task.json)."""
    d = root / "runs" / key
    spec = {"method": "kkt", "seed": 0, "model_dir": "/m", "params": {"attack.lr_x": residual}}
    atomic_write_json(d / TASK_FILE, {"key": key, "status": "failed" if failed else "done", "attempts": 1,
                                      "error": "boom" if failed else None, "spec": spec, "updated": 1.0})
    if not failed:
        atomic_write_json(d / "run.json", {
            "model_dir": "/m", "method": "kkt", "config": {"lr_x": residual}, "seed": 0, "status": status,
            "steps_done": 10, "wall_time_s": 0.5, "final": {"loss": residual * 2},
            "selection": {"relative_residual": {"value": residual, "better": "lower", "doc": ""}}, "extra": {}})
    return d


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "updated"} for r in rows]


def test_rebuild_reproduces_index_and_sorts(tmp_path):
    store = Store(tmp_path)
    rows = [row_from_dir(fake_run(tmp_path, f"k{i}", residual=r), root=tmp_path)
            for i, r in enumerate([0.3, 0.1, 0.2])]
    row_from_dir(fake_run(tmp_path, "bad", residual=0, failed=True), root=tmp_path)
    store.upsert_runs(rows + [row_from_dir(tmp_path / "runs" / "bad", root=tmp_path)])
    store.add_sweep("s1", name="x", config={"a": 1}, keys=["k0", "k1", "k2", "bad"])
    before = store.rows(sort="selection.relative_residual.value")
    assert [r["key"] for r in before] == ["k1", "k2", "k0", "bad"]  # missing value last
    assert before[-1]["status"] == "failed" and before[-1]["error"] == "boom"
    assert [r["key"] for r in store.rows(sort="final.loss", descending=True, limit=2)] == ["k0", "k2"]
    for f in tmp_path.glob("index.sqlite*"):
        f.unlink()
    assert Store(tmp_path).rebuild() == 4
    assert _strip(Store(tmp_path).rows(sort="selection.relative_residual.value")) == _strip(before)
    assert Store(tmp_path).sweep_keys("s1") == ["k0", "k1", "k2", "bad"]


def test_bad_sort_column_and_missing_index(tmp_path):
    with pytest.raises(DataReconError, match="is not a results store .*pass the --out of a `datarecon sweep`"):
        Store(tmp_path).rows()  # an empty folder is no store: rebuilding it would index nothing
    (tmp_path / "runs").mkdir()
    with pytest.raises(DataReconError, match="store rebuild"):
        Store(tmp_path).rows()
    Store(tmp_path).rebuild()
    with pytest.raises(DataReconError, match="unknown sort column"):
        Store(tmp_path).rows(sort="key; DROP TABLE runs")
    with pytest.raises(DataReconError, match="unknown sort column"):
        Store(tmp_path).rows(sort="selection.a'b")


def test_export_csv_flattens_json(tmp_path):
    store = Store(tmp_path)
    store.upsert_runs([row_from_dir(fake_run(tmp_path, "k", residual=0.5), root=tmp_path)])
    out = store.export(tmp_path / "x.csv")
    (row,) = list(csv.DictReader(out.open()))
    assert row["key"] == "k" and float(row["selection.relative_residual.value"]) == 0.5
    assert float(row["params.attack.lr_x"]) == 0.5 and float(row["final.loss"]) == 1.0
    with pytest.raises(DataReconError, match=r"\.csv or \.parquet"):
        store.export(tmp_path / "x.txt")


def _writer(root: str, prefix: str, n: int) -> None:
    store = Store(root)
    for i in range(n):
        d = fake_run(Path(root), f"{prefix}{i:03d}", residual=i / n)
        store.upsert_runs([row_from_dir(d, root=root)])  # one transaction per run, as the driver does
        if i % 25 == 0:
            store.add_sweep(f"sweep-{prefix}", name=prefix, config={}, keys=[f"{prefix}{j:03d}" for j in range(i + 1)])


def test_two_processes_write_one_store_concurrently(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    n = 120
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), p, n)) for p in ("a", "b")]
    for p in procs:
        p.start()
    rebuilds = 0
    while any(p.is_alive() for p in procs):  # a third writer: rebuilds while the two drivers write
        Store(tmp_path).rebuild()
        rebuilds += 1
        time.sleep(0.05)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    con = sqlite3.connect(tmp_path / "index.sqlite")
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    keys = {r["key"] for r in Store(tmp_path).rows()}
    assert keys == {f"{p}{i:03d}" for p in "ab" for i in range(n)}
    before = _strip(Store(tmp_path).rows())
    Store(tmp_path).rebuild()
    assert _strip(Store(tmp_path).rows()) == before
