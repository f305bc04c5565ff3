"""datarecon.utils.io: CSV rows written atomically and read back."""

from __future__ import annotations

import math
from pathlib import Path
import csv

import pytest

from datarecon.utils.io import rows_to_csv, write_csv


def _read(path):
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def test_write_csv_round_trip_with_differing_keys(tmp_path):
    rows = [
        {"name": "a", "ssim": 0.123456789, "n": 3},
        {"name": "b", "flag": True},  # lacks ssim, n; adds flag
        {"n": 5, "ssim": 1.0, "note": None},
    ]
    path = tmp_path / "sub" / "rows.csv"  # parent folder is created
    write_csv(path, rows)
    raw = path.read_text(encoding="utf-8")
    assert raw.splitlines()[0] == "name,ssim,n,flag,note"  # union of keys, first-seen order
    assert "\r" not in raw
    assert _read(path) == [
        {"name": "a", "ssim": "0.123457", "n": "3", "flag": "", "note": ""},  # floats as .6g
        {"name": "b", "ssim": "", "n": "", "flag": "True", "note": ""},
        {"name": "", "ssim": "1", "n": "5", "flag": "", "note": ""},
    ]
    assert not [p for p in path.parent.iterdir() if p.name != "rows.csv"]  # no temp file left


def test_write_csv_overwrites_and_handles_no_rows(tmp_path):
    path = tmp_path / "rows.csv"
    write_csv(path, [{"x": 1}])
    write_csv(path, [])
    assert path.read_text(encoding="utf-8") == rows_to_csv([]) == "\n"
    assert _read(path) == []


def test_pipeline_common_reexports_write_csv():
    from datarecon.experiments.pipeline import common

    assert common.write_csv is write_csv


def test_load_tensors_gives_the_same_key_order_in_every_process(tmp_path):
    """safetensors hands keys back in a per-process hash order; load_tensors sorts them."""
    import subprocess
    import sys

    import torch

    from datarecon.utils.io import save_tensors

    names = ["x", "labels", "multipliers", "score_lambda", "score_margin", "score_contribution", "score_uniqueness"]
    save_tensors(tmp_path / "c.safetensors", {k: torch.zeros(2) for k in names})
    code = ("import sys; from datarecon.utils.io import load_tensors; "
            "print(','.join(load_tensors(sys.argv[1])))")
    orders = {subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.safetensors")], check=True,
                             capture_output=True, text=True).stdout.strip() for _ in range(3)}
    assert orders == {",".join(sorted(names))}


def test_a_full_disk_keeps_the_old_file_and_names_it(tmp_path, monkeypatch):
    import errno

    import pytest

    from datarecon.errors import DiskFullError
    from datarecon.utils.io import atomic_write_text

    path = tmp_path / "run.json"
    atomic_write_text(path, "old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("datarecon.utils.io.os.fsync", full)
    with pytest.raises(DiskFullError, match=f"no space left on device writing {path}; .*previous version .*intact"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_folder_that_cannot_be_written_is_named_by_the_file_asked_for(tmp_path, monkeypatch):
    """Not by the temporary file the atomic writer creates first (``.r.html.x1y2z3ab.tmp``)."""
    import errno
    import tempfile

    from datarecon.utils.io import atomic_write_text

    def refused(*, dir, prefix, suffix):  # noqa: A002 - tempfile's own keyword
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}x1y2z3ab{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError) as info:
        atomic_write_text(tmp_path / "r.html", "x")
    assert info.value.filename == str(tmp_path / "r.html") and info.value.errno == errno.EACCES


def test_undefined_numbers_are_written_as_json_null(tmp_path):
    import json
    import math

    import numpy as np
    import torch

    from datarecon.utils.io import atomic_write_json, to_jsonable

    obj = {"auc": float("nan"), "up": math.inf, "t": torch.tensor([1.0, float("nan")]),
           "a": np.array([-np.inf, 2.0]), "g": np.float64("nan"), "ok": 0.5}
    assert to_jsonable(obj) == {"auc": None, "up": None, "t": [1.0, None], "a": [None, 2.0], "g": None, "ok": 0.5}
    atomic_write_json(tmp_path / "m.json", obj)
    text = (tmp_path / "m.json").read_text()
    assert "NaN" not in text and '"nan"' not in text and "Infinity" not in text
    assert json.loads(text)["auc"] is None


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=["022", "027", "077"])
def test_atomic_writes_respect_the_umask(tmp_path, umask):
    import os

    from datarecon.utils.atomic import current_umask
    from datarecon.utils.io import atomic_write_text

    old = os.umask(umask)
    try:
        assert current_umask() == umask
        atomic_write_text(tmp_path / "f.txt", "x")
        with open(tmp_path / "plain.txt", "w") as fh:  # what open() gives: the reference
            fh.write("x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_as_float_reads_numbers_and_gives_nan_for_the_rest() -> None:
    from datarecon.utils.io import as_float

    assert as_float(3) == 3.0 and as_float("2.5") == 2.5 and as_float(float("inf")) == float("inf")
    assert all(math.isnan(as_float(v)) for v in (None, "n/a", [1], {}))


def test_history_lines_append_whole_and_a_torn_tail_is_dropped(tmp_path: Path) -> None:
    from datarecon.utils.io import append_json_line, read_json_lines

    path = tmp_path / "history.jsonl"
    for step in (1, 2, 3):
        append_json_line(path, {"step": step, "loss": 1.0 / step})
    assert [r["step"] for r in read_json_lines(path)] == [1, 2, 3]
    assert [r["step"] for r in read_json_lines(path, upto=2)] == [1, 2]
    with open(path, "a", encoding="utf-8") as fh:  # a writer killed inside its line
        fh.write('{"step": 4, "lo')
    assert [r["step"] for r in read_json_lines(path)] == [1, 2, 3]
    assert read_json_lines(tmp_path / "missing.jsonl") == []


def _append_many(path: str, tag: int) -> None:
    from datarecon.utils.io import append_json_line

    for i in range(300):
        append_json_line(path, {"step": i, "tag": tag, "pad": "x" * 2000})


def test_concurrent_appends_never_interleave_inside_a_line(tmp_path: Path) -> None:
    import multiprocessing as mp

    from datarecon.utils.io import read_json_lines

    path = tmp_path / "history.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), t)) for t in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    rows = read_json_lines(path)
    assert len(path.read_text().splitlines()) == len(rows) == 600
    assert sorted((r["tag"], r["step"]) for r in rows) == [(t, i) for t in (0, 1) for i in range(300)]
