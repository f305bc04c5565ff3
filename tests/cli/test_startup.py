"""The command line's start-up: a command imports its own module only, and figures load matplotlib when drawn."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from datarecon.cli import main as cli_main


def _registered(module: str) -> set[str]:
    """The top-level commands ``datarecon.cli.<module>`` registers."""
    import importlib

    app = typer.Typer()
    importlib.import_module(f"datarecon.cli.{module}").register(app)
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    return {n for n in names if n}


def test_the_command_map_names_every_command_of_every_module() -> None:
    expected = {name: module for module in cli_main._COMMAND_MODULES for name in _registered(module)}
    assert cli_main.COMMAND_MODULE == expected


@pytest.mark.parametrize("args, module", [(["train", "--help"], "train"), (["store", "list"], "sweep"),
                                          (["--version"], ""), (["version"], ""), (["--help"], None),
                                          (["trian"], None), ([], None)],
                         ids=["train", "store", "--version", "version", "--help", "typo", "nothing"])
def test_a_command_line_needs_one_module(args, module) -> None:
    assert cli_main.module_for(args) == module


def test_a_command_imports_neither_the_other_commands_nor_matplotlib() -> None:
    script = ("import sys\nfrom datarecon.cli.main import main\n"
              "assert main(['train', '--help']) == 0\n"
              "print(sorted(m for m in sys.modules if m.startswith(('matplotlib', 'datarecon.cli.', "
              "'datarecon.experiments'))))\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded = eval(res.stdout.strip().splitlines()[-1])  # noqa: S307 - our own printed list
    assert not [m for m in loaded if m.startswith("matplotlib")], loaded
    assert "datarecon.cli.membership" not in loaded and "datarecon.cli.reconstruct" not in loaded, loaded
    assert "datarecon.cli.train" in loaded


def test_the_whole_help_still_lists_every_command(capsys) -> None:
    assert cli_main.main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in cli_main.COMMAND_MODULE:
        assert name in text, name
