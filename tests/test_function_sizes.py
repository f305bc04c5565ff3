"""No new function over 80 lines or 8 parameters (outside report/), and the list of old ones only shrinks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from function_sizes import MAX_LINES, MAX_PARAMS, oversized  # noqa: E402


def test_no_new_oversized_function_and_the_allowed_list_is_current() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "function_sizes.py"), "--check",
                          str(ROOT / "tools" / "function_sizes_allowed.txt")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_counter_sees_long_functions_and_many_parameters(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    params = ", ".join(f"p{i}" for i in range(MAX_PARAMS + 1))
    (pkg / "m.py").write_text(f"def long():\n{body}\n\n\nclass C:\n    def wide(self, {params}):\n        pass\n\n\n"
                              f"def fine(self, a, *b, **c):\n    pass\n")
    (pkg / "report").mkdir()
    (pkg / "report" / "r.py").write_text(f"def long():\n{body}\n")
    assert oversized(pkg) == [("m.py:long", MAX_LINES + 1, 0), ("m.py:C.wide", 2, MAX_PARAMS + 1)]
