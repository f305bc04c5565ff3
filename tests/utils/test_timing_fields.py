"""Every wall-time field is a timing field: a JSON key the package writes that names a time (``*_time_s``,
``*_seconds*``, ``*_at``, ...) is in :data:`datarecon.utils.io.TIMING_FIELDS`, so comparing two runs' records
(faults/faultlib.assert_same_tree, a resume's no-change checks) leaves exactly the clocks out. Read from the
source with :mod:`ast`: the string keys of dict literals and of subscript assignments."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from datarecon.utils.io import TIMING_FIELDS, strip_timing

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "datarecon"
#: a key that names a time: a word time/seconds/elapsed/clock/timestamp, or a seconds, milliseconds or "at" suffix
TIME_WORD = re.compile(r"(^|_)(time|times|seconds|elapsed|clock|timestamp)(_|$)|_s$|_ms$|_at$")
#: keys that match the pattern and are no clock: the step a diverged try ended at (docs/RUNS.md)
NOT_TIMES = {"diverged_at"}


def written_keys() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys = [node.slice.value]
            else:
                continue
            for key in keys:
                found.setdefault(key, set()).add(str(path.relative_to(PACKAGE)))
    return found


def test_every_time_key_written_is_a_timing_field() -> None:
    keys = written_keys()
    times = {k for k in keys if TIME_WORD.search(k)} - NOT_TIMES
    assert "wall_time_s" in times and "margin_ascent_wall_time_s" in times  # the scan sees what it should
    missing = {k: sorted(keys[k]) for k in times if k not in TIMING_FIELDS}
    assert not missing, f"time fields missing from TIMING_FIELDS: {missing}"


def test_strip_timing_drops_them_at_any_depth() -> None:
    record = {"metrics": {"margin_ascent_wall_time_s": 1.5, "loss": 0.2}, "references": {"seconds_per_model": 3.0},
              "rows": [{"wall_time_s": 1.0, "step": 2}]}
    assert strip_timing(record) == {"metrics": {"loss": 0.2}, "references": {}, "rows": [{"step": 2}]}
