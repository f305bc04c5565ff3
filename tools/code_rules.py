"""Readability rules of the package, read from the source with :mod:`ast`.

* **local imports**: ``import`` statements of datarecon's own modules inside a function. Allowed
  only where a module says why (an optional dependency, or an import that must stay out of start-up);
  the total is capped (``MAX_LOCAL_IMPORTS``) so dependencies stay visible at the top of a module.
* **private imports**: ``from datarecon.x import _name`` from another module (a private name is the
  module's own; share it under a public name instead).
* **history in docstrings**: issue numbers (``issue 35``, ``#35``) and dates (``2026-11-27``) in
  docstrings: a docstring says what and why; measurements and history belong in docs/.

    python tools/code_rules.py            # list every finding, with the counts
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "datarecon"
MAX_LOCAL_IMPORTS = 30
HISTORY = re.compile(r"\bissues?\s+#?\d+|(?<![\w&])#\d{1,3}\b|\b20\d\d-\d\d-\d\d\b")


def _own(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "datarecon"
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "datarecon" for a in node.names)
    return False


def _files(package: Path) -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(package).as_posix(), ast.parse(p.read_text(), filename=str(p)))
            for p in sorted(package.rglob("*.py"))]


def local_imports(package: Path = PACKAGE) -> list[str]:
    """``path:line`` of every import of a datarecon module inside a function."""
    found = []
    for rel, tree in _files(package):
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{rel}:{n.lineno}" for n in ast.walk(fn) if _own(n)]
    return sorted(set(found))


def private_imports(package: Path = PACKAGE) -> list[str]:
    """``path:line name`` of every private name imported from another datarecon module."""
    found = []
    for rel, tree in _files(package):
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and _own(n):
                found += [f"{rel}:{n.lineno} {a.name}" for a in n.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(found)


def history_in_docstrings(package: Path = PACKAGE) -> list[str]:
    """``path:line text`` of every docstring naming an issue number or a date."""
    found = []
    for rel, tree in _files(package):
        for n in ast.walk(tree):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(n, clean=False)
                if doc and (m := HISTORY.search(doc)):
                    line = (n.body[0].lineno if n.body else 1) + doc[:m.start()].count("\n")
                    found.append(f"{rel}:{line} {m.group(0)!r}")
    return sorted(found)


def main() -> int:
    local, private, history = local_imports(), private_imports(), history_in_docstrings()
    for title, rows in (("local imports", local), ("private imports", private), ("history in docstrings", history)):
        print(f"# {title}: {len(rows)}")
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
