"""ruff (pyflakes + statement checks, settings in pyproject.toml) finds nothing in src, tests, benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "benchmarks", "tools"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
