"""``datarecon examples [NAME]``: list the shipped example files, or copy one out."""

from __future__ import annotations

from typing import Annotated

import typer

from datarecon.experiments.examples import copy_example, list_examples


def register(app: typer.Typer) -> None:
    """Add ``examples`` to ``app``."""

    @app.command("examples")
    def examples_cmd(
        name: Annotated[str | None, typer.Argument(help="Example file to copy; omit to list them.")] = None,
        out: Annotated[str | None, typer.Option(help="Destination file or folder (default: ./NAME); a folder "
                                                "given as DIR/ is created.", metavar="PATH")] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an unchanged copy of a shipped "
                                                "example (never an edited copy or another file).")] = False,
    ) -> None:
        """List the example configuration files shipped with datarecon, or copy one (sweeps,
        reproduction overrides)."""
        if name is None:
            for file, summary in list_examples().items():
                typer.echo(f"{file:<32} {summary}")
            typer.echo("copy one with: datarecon examples NAME [--out PATH]")
            return
        typer.echo(f"wrote {copy_example(name, out=out, overwrite=overwrite)}")
