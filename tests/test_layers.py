"""The package's layers: nothing imports upward and no import cycle exists (package ``__init__`` edges included).

The layer order is written here once (docs/DESIGN.md describes each layer). Every ``import`` and
``from ... import`` statement is read from the source with :mod:`ast`, including those inside
functions and ``TYPE_CHECKING`` blocks, so a lazy import cannot hide an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "datarecon"

#: lowest first; a package may import its own modules and any package of a lower layer, never a
#: package of its own layer (``training`` and ``attacks``, the victim and the attacker, are peers)
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("registry", "config"),
    ("utils",),
    ("kernel",),
    ("data", "models"),
    ("training", "attacks"),
    ("evaluation",),
    ("report",),
    ("experiments",),
    ("cli",),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """The datarecon modules ``path`` imports, each with the line of its import statement."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imported_by(path.read_text(), package, modules)


def imported_by(source: str, package: str, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """The datarecon modules ``source`` (a module of ``package``) imports, with their lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            # ``from pkg import sub`` imports the module pkg.sub when there is one
            targets = [f"{root}.{a.name}" if f"{root}.{a.name}" in modules else root for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import datarecon.x.y`` names a module, maybe a parent
                target = target.rpartition(".")[0]
            if target.startswith("datarecon.") or target == "datarecon":
                found.append((target, node.lineno))
    return found


def layer(module: str) -> tuple[str, int | None]:
    top = module.split(".")[1] if "." in module else ""
    return top, LAYER_OF.get(top)


def test_every_package_has_a_layer() -> None:
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.glob("*")
            if p.suffix == ".py" or (p / "__init__.py").is_file()} - {"__init__"}
    assert tops == set(LAYER_OF), f"packages without a layer: {sorted(tops - set(LAYER_OF))}; " \
                                  f"layers without a package: {sorted(set(LAYER_OF) - tops)}"


def test_no_import_runs_upward_or_sideways() -> None:
    modules = all_modules()
    bad = []
    for name, path in modules.items():
        top, level = layer(name)
        if level is None:
            continue
        for target, line in imported(path, modules):
            other, other_level = layer(target)
            if other == top or other_level is None:
                continue
            if other_level >= level:
                bad.append(f"{path.relative_to(SRC)}:{line} imports {target} ({top} -> {other})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def import_edges(name: str, targets: list[str], modules: dict[str, Path]) -> set[str]:
    """The modules that importing ``targets`` runs from module ``name``: each target and every package
    above it (``import a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first), less ``name`` and
    the packages that hold ``name`` (they are imported before ``name`` itself, so importing them
    again runs nothing)."""
    parts = name.split(".")
    own = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    out: set[str] = set()
    for target in targets:
        pieces = target.split(".")
        out |= {".".join(pieces[:i]) for i in range(1, len(pieces) + 1)} & set(modules)
    return out - own


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: import_edges(name, [t for t, _ in imported(path, modules)], modules)
            for name, path in modules.items()}


def test_no_import_cycle() -> None:
    """Package ``__init__`` edges included: a module importing ``pkg.sub`` runs ``pkg/__init__``,
    and a cycle through it is a cycle (what a lazy import inside a function only postpones)."""
    cycles = strongly_connected(import_graph(all_modules()))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_a_cycle_through_a_package_init_is_found() -> None:
    """``a.x`` imports ``b.y``, whose package ``b/__init__`` imports ``a.x``: no module imports
    the other's module directly both ways, but importing ``b.y`` runs ``b/__init__``."""
    modules = {m: Path(m) for m in ("datarecon", "datarecon.a", "datarecon.a.x", "datarecon.b",
                                    "datarecon.b.y")}
    imports = {"datarecon.a.x": ["datarecon.b.y"], "datarecon.b": ["datarecon.a.x"], "datarecon.b.y": [],
               "datarecon.a": [], "datarecon": []}
    graph = {name: import_edges(name, imports[name], modules) for name in modules}
    assert graph["datarecon.a.x"] == {"datarecon.b", "datarecon.b.y"}
    assert strongly_connected(graph) == [{"datarecon.a.x", "datarecon.b"}]
    # a module's own packages are not edges: datarecon.b.y importing datarecon.b.z runs nothing new
    assert import_edges("datarecon.b.y", ["datarecon.b.z"], {**modules, "datarecon.b.z": Path("z")}) == \
        {"datarecon.b.z"}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from datarecon.cli._common import x\n", ["datarecon.cli._common"]),
    ("from datarecon.kernel import files\n", ["datarecon.kernel.files"]),
    ("from . import engine\n", ["datarecon.kernel.engine"]),
    ("import datarecon.experiments.sweep.pool as p\n", ["datarecon.experiments.sweep.pool"]),
    ("from datarecon.experiments.sweep import pool, run_sweep\n",
     ["datarecon.experiments.sweep.pool", "datarecon.experiments.sweep"]),
    ("import torch\n", []),
])
def test_the_reader_finds_lazy_relative_and_submodule_imports(source: str, expected: list[str]) -> None:
    assert [t for t, _ in imported_by(source, "datarecon.kernel", all_modules())] == expected


def test_an_upward_import_is_reported() -> None:
    modules = all_modules()
    found = imported_by("def f():\n    from datarecon.cli._common import x\n", "datarecon.kernel", modules)
    assert [layer(t)[1] for t, _ in found] == [LAYER_OF["cli"]] and LAYER_OF["cli"] > LAYER_OF["kernel"]
