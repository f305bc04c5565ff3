"""``datarecon report``: one self-contained HTML file from evaluated runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli._common import ThreadsOption
from datarecon.kernel.files import METRICS_FILE, REPORT_HTML


#: what every ``metrics.json`` of ``datarecon evaluate`` holds (a report needs them)
REQUIRED_METRICS = ("nearest", "metric")


def check_evaluated(run: Path) -> None:
    """Refuse a run folder whose ``metrics.json`` is not an evaluation (``{}``, another tool's file).

    Raises:
        DataReconError: one line naming the missing fields and the fix (``datarecon evaluate RUN``).
    """
    from datarecon.errors import DataReconError
    from datarecon.utils.io import read_json

    path = Path(run) / METRICS_FILE
    if not path.is_file():
        return  # render_report names the missing file
    metrics = read_json(path)
    missing = [k for k in REQUIRED_METRICS if not isinstance(metrics, dict) or k not in metrics]
    if missing:
        raise DataReconError(f"{path} is not an evaluation by datarecon (no {', '.join(missing)}); rerun "
                             f"`datarecon evaluate {run}` to write it")


def register(app: typer.Typer) -> None:
    """Add ``report`` to ``app``."""

    @app.command("report")
    def report_cmd(
        runs: Annotated[list[Path], typer.Argument(help="Evaluated run directories.")],
        out: Annotated[Path, typer.Option(help="Output HTML file.")] = Path(REPORT_HTML),
        title: Annotated[str, typer.Option(help="Report title.")] = "datarecon report",
        overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out file that "
                                                "datarecon did not write.")] = False,
        threads: ThreadsOption = 0,
    ) -> None:
        """Write a self-contained HTML report (images embedded; opens offline)."""
        from datarecon.cli._common import check_out_file, set_threads
        from datarecon.report import render_report
        from datarecon.report.html import is_report

        set_threads(threads)
        for run in runs:
            check_evaluated(run)
        check_out_file(out, overwrite=overwrite, ours=is_report(out))
        path = render_report(runs, out=out, title=title)
        typer.echo(f"wrote {path}")
