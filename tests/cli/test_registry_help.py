"""Help texts that list registry keys are generated from the registries, so they list exactly those keys."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from datarecon.cli import audit as audit_cli
from datarecon.cli import reproduce as reproduce_cli
from datarecon.cli.main import main
from datarecon.cli.options import backend_help, backend_options
from datarecon.experiments import audit as audit_mod
from datarecon.experiments.backends import BACKENDS
from datarecon.experiments.execution import Execution
from datarecon.experiments.reproduce import REPRODUCTIONS, SCALES


def _listed(text: str, sep: str) -> list[str]:
    """The leading word of every ``sep``-separated item of ``text`` (``"a (x) | b"`` → ``["a", "b"]``)."""
    return [item.strip().split()[0] for item in text.split(sep)]


def test_backend_help_lists_exactly_the_registered_backends() -> None:
    text = backend_help()
    assert text.startswith("Execution backend: ") and text.endswith(".")
    assert _listed(text.removeprefix("Execution backend: ").removesuffix("."), "|") == BACKENDS.ordered()


def test_backend_options_show_the_generated_help() -> None:
    @backend_options(workers="Units.", default_workers=1)
    def cmd(*, backend: Execution) -> None:
        """A command."""

    app = typer.Typer()
    app.command()(cmd)
    app.command("other")(lambda: None)
    shown = " ".join(CliRunner().invoke(app, ["cmd", "--help"], env={"COLUMNS": "400"}).output.split())
    assert backend_help() in shown


def test_reproduce_help_lists_exactly_the_registered_reproductions(capsys) -> None:
    assert main(["reproduce", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    listed = re.search(r"Reproduce a paper's experiments \(([^)]*)\)", out).group(1)
    assert listed.split(", ") == REPRODUCTIONS.ordered()
    assert [c.name for c in reproduce_cli.app.registered_commands] == REPRODUCTIONS.ordered()


@pytest.mark.parametrize("command, scales", [(reproduce_cli, SCALES), (audit_cli, audit_mod.SCALES)],
                         ids=["reproduce", "audit"])
def test_scale_help_lists_exactly_the_scales(command, scales) -> None:
    assert _listed(command.SCALE_HELP, "|") == list(scales)


@pytest.mark.parametrize("argv", [["reproduce", "haim2022", "--help"], ["audit", "--help"]], ids=["reproduce", "audit"])
def test_scale_help_is_shown(argv, capsys) -> None:
    command = reproduce_cli if argv[0] == "reproduce" else audit_cli
    assert main(argv) == 0
    assert "".join(command.SCALE_HELP.split()) in "".join(capsys.readouterr().out.split())  # wrapped at any width
