"""User documents read as documentation: a licence, and no development notes (issue 25, item 7).

The README, the documents under docs/ (docs/dev/ is for developers and exempt) and the shipped
example files must not carry work-log phrases, issue numbers or paths of the machine they were
written on; the package ships a LICENSE that matches its declared licence.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.yaml"),
                    *(ROOT / "src" / "datarecon" / "examples").glob("*.yaml")])

#: what a development note looks like: issue numbers, the sessions that wrote the text, machine paths
DEV_NOTES = {
    "issue number": r"\bissues?\s*#?\d+|\bissue #",
    "work-log phrase": r"\bsessions?\b|\blead engineer\b|\b(other|the) helpers\b|\bTODO\b|\bFIXME\b",
    "machine path": r"/work/|\.\./shared|(?<![\w.])/shared/|/tmp/rep|/home/\w",
}


def test_a_licence_matching_pyproject_ships() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]
    assert isinstance(declared, str), "an SPDX string: setuptools deprecates the TOML table (a warning at set-up)"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert declared == "MIT" and text.startswith("MIT License") and "Permission is hereby granted" in text


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_documents_hold_no_development_notes(path: Path) -> None:
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for what, pattern in DEV_NOTES.items():
            m = re.search(pattern, line, flags=re.I)
            if m:
                found.append(f"{path.name}:{n}: {what} {m.group(0)!r}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_readme_says_how_to_activate_the_environment() -> None:
    assert "source .venv/bin/activate" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_run_file_lists_the_registered_methods_and_inits() -> None:
    """docs/RUNS.md names every attack and initialisation of the registries, in registry order."""
    from datarecon.attacks import ATTACKS, INITS

    text = (ROOT / "docs" / "RUNS.md").read_text(encoding="utf-8")
    methods = re.search(r"method: kkt +# (.*) \(the ATTACKS registry\)", text)
    inits = re.search(r"name: gaussian +# (.*) \(INITS\)", text)
    builtin = [m for m in ATTACKS.ordered() if ATTACKS.get(m).__module__.startswith("datarecon.")]
    assert methods is not None and methods.group(1).split(" | ") == builtin
    assert inits is not None and inits.group(1).split(" | ") == INITS.ordered()


def test_the_readmes_first_screen_states_findings_with_their_nulls_and_sources() -> None:
    """The first screen (before "## Set up") says what datarecon found, membership and reconstruction side by side,
    each number beside its null; the numbers of targets too large for the test suite are those docs/RESULTS.md
    records with their commands (the README's own targets are re-run by tests/test_readme.py)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = readme.split("## Set up", 1)[0]
    assert len(first.splitlines()) <= 50
    assert "membership" in first and "reconstruction" in first and "loss threshold" in first and "null" in first
    assert "create-graph" not in first  # implementation details belong further down
    results = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    for number in ("0.916", "0.808", "12 of 20", "0.429", "0.129"):  # the fine-tuned CNN's row
        assert number in first and number in results, number
    default_row = [line for line in first.splitlines() if "no flags" in line]
    assert default_row, "the first screen lost the no-flag membership measurement"
    section = results.split("## Membership with the defaults", 1)[1]
    for number in re.findall(r"TPR \*\*([0-9.]+) at 1 %\*\*", default_row[0]):
        assert number in section, number
