"""The package's readability rules (tools/code_rules.py): dependencies visible at the top of each
module, no private name shared across modules, docstrings without history.

* at most ``MAX_LOCAL_IMPORTS`` imports of datarecon's own modules inside functions (each one left
  says why: an import cycle it breaks, or a heavy dependency kept out of start-up);
* no ``from datarecon.x import _name`` in another module;
* no issue numbers or dates in docstrings (measurements and history belong in docs/).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rules():
    spec = importlib.util.spec_from_file_location("code_rules", ROOT / "tools" / "code_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_few_function_local_imports_of_the_package() -> None:
    rules = _rules()
    found = rules.local_imports()
    assert len(found) <= rules.MAX_LOCAL_IMPORTS, "\n".join(found)


def test_no_private_name_is_imported_from_another_module() -> None:
    assert _rules().private_imports() == []


def test_docstrings_carry_no_issue_numbers_or_dates() -> None:
    assert _rules().history_in_docstrings() == []


def test_the_rules_find_what_they_look_for(tmp_path: Path) -> None:
    """Planted cases: each rule reports its own and nothing else."""
    pkg = tmp_path / "datarecon"
    pkg.mkdir()
    (pkg / "a.py").write_text('"""Measured on 2026-11-27 (issue 35)."""\n\nfrom datarecon.b import _hidden\n\n\n'
                              'def f():\n    """Fine."""\n    from datarecon.b import g\n    import os\n    return g, os\n')
    (pkg / "b.py").write_text('"""Fine: 3 x 3 patches, #channels."""\n\n_hidden = 1\n\n\ndef g():\n    return 2\n')
    rules = _rules()
    assert rules.local_imports(pkg) == ["a.py:8"]
    assert rules.private_imports(pkg) == ["a.py:3 _hidden"]
    assert [row.split()[0] for row in rules.history_in_docstrings(pkg)] == ["a.py:1"]
