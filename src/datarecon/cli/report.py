"""``datarecon report``: one self-contained HTML file from evaluated runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add ``report`` to ``app``."""

    @app.command("report")
    def report_cmd(
        runs: Annotated[list[Path], typer.Argument(help="Evaluated run directories.")],
        out: Annotated[Path, typer.Option(help="Output HTML file.")] = Path("report.html"),
        title: Annotated[str, typer.Option(help="Report title.")] = "datarecon report",
    ) -> None:
        """Write a self-contained HTML report (images embedded; opens offline)."""
        from datarecon.report import render_report

        path = render_report(runs, out=out, title=title)
        typer.echo(f"wrote {path}")
