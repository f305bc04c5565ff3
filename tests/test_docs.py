"""User documents read as documentation: a licence, and no development notes (issue 25, item 7).

The README, the documents under docs/ (docs/dev/ is for developers and exempt) and the shipped
example files must not carry work-log phrases, issue numbers or paths of the machine they were
written on; the package ships a LICENSE that matches its declared licence.
"""

from __future__ import annotations

import functools
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


# -- the documents' examples run as written (issue 50: docs/RUNS.md's run file repeated a key, so it was refused) --

#: the user documents whose command blocks are read here (the README's also run in tests/test_readme.py)
COMMAND_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path, *langs: str) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [b for lang in langs for b in re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)]


def doc_commands() -> list[tuple[str, list[str]]]:
    """Every ``datarecon ...`` command of the user documents' bash and console blocks, as ``(where, argv)``:
    continuation lines joined, comments dropped, a placeholder such as ``<hash>`` filled with a name."""
    import shlex

    found = []
    for path in COMMAND_DOCS:
        for block in _blocks(path, "bash", "console"):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"<[a-z_-]+>", "placeholder", line.split(" #", 1)[0]).strip()
                if line.startswith("datarecon "):
                    found.append((f"{path.name}: {line[:60]}", shlex.split(line)[1:]))
    return found


def parse_command(argv: list[str]) -> object:
    """The click context of ``datarecon argv`` (its command resolved, every option parsed and typed), without
    running it. Raises click's usage errors: an option that does not exist, a value of the wrong type."""
    from datarecon.cli.main import module_for

    cmd = _command_tree(module_for(argv))
    ctx = cmd.make_context("datarecon", list(argv))
    while hasattr(cmd, "resolve_command"):
        args = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not args:
            break
        name, cmd, rest = cmd.resolve_command(ctx, args)
        ctx = cmd.make_context(name, rest, parent=ctx)
    return ctx


@functools.cache
def _command_tree(module: str | None) -> object:
    """The command line's click tree for the commands of one command module (built once per module)."""
    from datarecon.cli.main import COMMAND_MODULE, build_command

    name = next((k for k, v in COMMAND_MODULE.items() if v == module), None)
    return build_command([name] if name else [])


def test_the_documents_show_commands() -> None:
    where = {w.split(":")[0] for w, _ in doc_commands()}
    assert {"README.md", "SWEEPS.md", "PERFORMANCE.md", "RESULTS.md"} <= where, where
    with pytest.raises(Exception, match="No such option: --bogus"):  # the check can fail
        parse_command(["train", "--dataset", "digits", "--bogus", "1"])


@pytest.mark.parametrize("argv", [a for _, a in doc_commands()], ids=[w for w, _ in doc_commands()])
def test_every_documented_command_parses(argv: list[str]) -> None:
    """Each documented command names options that exist, with values of their types (a renamed or removed flag
    fails here; what the commands compute is checked where they run: tests/test_readme.py, the examples' tests)."""
    ctx = parse_command(argv)
    assert ctx.command.callback is not None, argv  # a command, not a bare group


def test_the_run_files_documented_load_as_their_models(tmp_path: Path) -> None:
    """docs/RUNS.md's two settings files, written to disk as shown, load as a run file and as membership settings:
    each key once, every key known, every value of its type."""
    from datarecon.config import load_config_file
    from datarecon.experiments.membership.settings import MembershipSettings
    from datarecon.experiments.reconstruct import load_run

    run_file, membership = _blocks(ROOT / "docs" / "RUNS.md", "yaml")
    (tmp_path / "run.yaml").write_text(run_file, encoding="utf-8")
    (tmp_path / "membership.yaml").write_text(membership, encoding="utf-8")
    run = load_run(tmp_path / "run.yaml")
    assert run.step_probe == 50 and run.knowledge.n == 100 and run.attack.steps == 1000
    settings = load_config_file(tmp_path / "membership.yaml", MembershipSettings)
    assert settings == MembershipSettings()  # "All fields, with their defaults"


@pytest.mark.slow
def test_the_sweeps_document_runs_as_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """docs/SWEEPS.md's commands, then its Python block, in a folder holding the shipped examples and the model
    sweep-tiny.yaml names (trained as its header says); ``<hash>`` is the pool the commands wrote."""
    import shutil

    import shlex

    from datarecon.cli.main import main

    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    header = " ".join(line[1:].strip() for line in (ROOT / "examples" / "sweep-tiny.yaml").read_text().splitlines()
                      if line.startswith("#")).replace("\\ ", "")
    train = shlex.split(re.search(r"datarecon (train .*?--out \S+)", header).group(1))
    assert main([*train, "--no-progress", "--quiet"]) == 0
    for where, argv in [(w, a) for w, a in doc_commands() if w.startswith("SWEEPS.md")]:
        if any(a.endswith("placeholder") for a in argv):
            pools = sorted(p for p in (tmp_path / "sweeps" / "tiny" / "pools").iterdir() if p.is_dir())
            argv = [str(pools[0]) if a.endswith("placeholder") else a for a in argv]
        assert main([*argv, *(["--no-progress"] if argv[0] in ("sweep", "evaluate") and argv[1] != "pool" else [])]) \
            == 0, (where, capsys.readouterr().err[-2000:])
    (block,) = _blocks(ROOT / "docs" / "SWEEPS.md", "python")
    namespace: dict = {}
    exec(compile(block, "SWEEPS.md", "exec"), namespace)  # noqa: S102 - our own document
    assert namespace["pool_dir"].is_dir() and (tmp_path / "runs.csv").is_file()


def test_performance_sections_are_numbered_in_order_and_every_reference_names_one() -> None:
    """docs/PERFORMANCE.md numbers its sections 1, 2, 3, ... with subsections N.1, N.2, ... in order (it read 4, 6, 8),
    and every "PERFORMANCE.md §N" / "PERFORMANCE §N.M" in the repository names a section it has."""
    heads = re.findall(r"^#{2,3} (\d+)(?:\.(\d+))?\.? ", (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8"),
                       flags=re.M)
    tops = [int(a) for a, b in heads if not b]
    assert tops == list(range(1, len(tops) + 1)), tops
    for top in tops:
        subs = [int(b) for a, b in heads if b and int(a) == top]
        assert subs == list(range(1, len(subs) + 1)), (top, subs)
    sections = {a for a, b in heads if not b} | {f"{a}.{b}" for a, b in heads if b}
    bad = []
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py"),
                 *(ROOT / "src").rglob("*.yaml"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*")]:
        if not path.is_file() or path.suffix not in (".md", ".py", ".yaml", ".sh"):
            continue
        for ref in re.findall(r"PERFORMANCE(?:\.md)?,? §\s?(\d+(?:\.\d+)?)", path.read_text(encoding="utf-8")):
            if ref not in sections:
                bad.append(f"{path.relative_to(ROOT)}: §{ref}")
    assert not bad, bad
