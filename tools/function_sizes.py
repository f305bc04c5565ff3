"""Functions of the package over the size limits: more than 80 lines or more than 8 parameters.

Lines count from the first decorator to the last line of the body (docstring included);
parameters are every named parameter but ``self`` / ``cls``, with ``*args`` and ``**kwargs`` one
each. ``report/`` is exempt (its renderers are long by nature). Pydantic models and dataclasses
carry their fields as class attributes, not parameters, so configs do not count.

    python tools/function_sizes.py                 # list every function over a limit
    python tools/function_sizes.py --check FILE    # exit 1 when one is not listed in FILE

FILE lists ``path:function`` entries still over a limit (the debt being paid down); the check
fails on a new one and on an entry that is no longer over (so the list only shrinks).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "datarecon"
MAX_LINES, MAX_PARAMS = 80, 8
EXEMPT = ("report/",)


def oversized(package: Path = PACKAGE) -> list[tuple[str, int, int]]:
    """``(path:qualified_name, lines, parameters)`` of every function over a limit, sorted."""
    rows = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(EXEMPT):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, qual in _functions(tree):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = node.end_lineno - start + 1
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            params = len(names) + (a.vararg is not None) + (a.kwarg is not None)
            if lines > MAX_LINES or params > MAX_PARAMS:
                rows.append((f"{rel}:{qual}", lines, params))
    return rows


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, prefix + node.name
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", type=Path, help="file of allowed entries; exit 1 on a new or a stale one")
    args = ap.parse_args(argv)
    rows = oversized()
    if not args.check:
        for name, lines, params in rows:
            print(f"{name}  {lines} lines, {params} parameters")
        print(f"{len(rows)} functions over {MAX_LINES} lines or {MAX_PARAMS} parameters (report/ exempt)")
        return 0
    allowed = {line.split("#")[0].strip() for line in args.check.read_text().splitlines()} - {""}
    found = {name for name, _, _ in rows}
    new, stale = sorted(found - allowed), sorted(allowed - found)
    for name in new:
        print(f"over the limits and not listed in {args.check}: {name}")
    for name in stale:
        print(f"listed in {args.check} but within the limits now: {name} (remove it from the list)")
    return 1 if new or stale else 0


if __name__ == "__main__":
    sys.exit(main())
