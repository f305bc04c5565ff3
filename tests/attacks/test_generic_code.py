"""Generic code reads what an attack declares, never one method's metric names (issue 49).

The KKT family's own names are generated from the registry: what the KKT-family attacks declare (their progress
keys, the metric, final criterion and initial value of their convergence rule, their early-stop metric) and no
other built-in attack declares. No string constant in a generic module (``attacks/`` outside the attacks' own
modules, ``kernel/``, ``evaluation/``, ``report/``) may equal one of them: the convergence verdict, the early stop,
the progress line and the report read the attack's declarations (``Attack.convergence``,
``Attack.early_stop_metric``, ``Attack.progress_keys``) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

from datarecon.attacks import ATTACKS
from datarecon.attacks.kkt_target import SurrogateAttack

SRC = Path(__file__).resolve().parents[2] / "src" / "datarecon"
#: the attacks' own modules (the KKT family's files, gradient norm, the KKT family's selection criteria, dynamics
#: matching; the bilevel package is a folder of its own): they may name their own metrics
OWN = ("kkt", "gradnorm", "selection", "dynamics")
#: string constants that are not an attack's metric though they share a name: (module, function) → why
NOT_METRICS = {("report/html.py", "_identifiability_card"): "the identifiability result's own field (the fit of the "
                                                             "KKT objective on a set of images), not a run's metric"}


def _declared(cls: type) -> set[str]:
    rule = cls.convergence
    return {n for n in (*cls.progress_keys, rule.metric, rule.final, rule.initial, cls.early_stop_metric or "") if n}


def kkt_only_names() -> set[str]:
    """Names the KKT family declares and no other built-in attack does."""
    family = [ATTACKS.get(n) for n in ATTACKS.names() if issubclass(ATTACKS.get(n), SurrogateAttack)]
    others = [ATTACKS.get(n) for n in ATTACKS.names() if not issubclass(ATTACKS.get(n), SurrogateAttack)]
    assert family and others
    return set().union(*map(_declared, family)) - set().union(*map(_declared, others))


def generic_modules() -> list[Path]:
    attacks = [p for p in (SRC / "attacks").glob("*.py") if not p.stem.startswith(OWN)]
    return attacks + [p for d in ("kernel", "evaluation", "report") for p in (SRC / d).rglob("*.py")]


def _constants(path: Path) -> list[tuple[str, int, str]]:
    """(function, line, value) of every string constant of ``path`` that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Constant) and isinstance(child.value, str) and id(child) not in docstrings:
                found.append((where, child.lineno, child.value))
            visit(child, inner)

    visit(tree, "")
    return found


def test_the_kkt_family_declares_names_of_its_own() -> None:
    assert {"rel_residual", "relative_residual", "lambda_hinge"} <= kkt_only_names()


def test_generic_modules_name_no_metric_of_the_kkt_family() -> None:
    names = kkt_only_names()
    hits = []
    for path in generic_modules():
        rel = str(path.relative_to(SRC))
        hits += [f"{rel}:{line} ({where}) {value!r}" for where, line, value in _constants(path)
                 if value in names and (rel, where) not in NOT_METRICS]
    assert not hits, "generic code branches on KKT-only metric names:\n" + "\n".join(hits)


def test_the_check_sees_a_kkt_name_in_generic_code(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""A docstring naming rel_residual is fine."""\n\ndef f(rows):\n    return rows["rel_residual"]\n')
    assert [(w, v) for w, _, v in _constants(module)] == [("f", "rel_residual")]
