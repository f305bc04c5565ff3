"""``datarecon report``: one self-contained HTML file from evaluated runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli._common import DEFAULT_THREADS, ThreadsOption, set_threads
from datarecon.cli.options import OutFile, out_file_options
from datarecon.errors import DataReconError
from datarecon.evaluation.records import read_metrics
from datarecon.kernel.files import METRICS_FILE, REPORT_HTML
from datarecon.report import render_report
from datarecon.report.html import is_report
from datarecon.report.membership import is_membership_folder, membership_sections
from datarecon.utils.io import read_json

#: what every ``metrics.json`` of ``datarecon evaluate`` holds (a report needs them)
REQUIRED_METRICS = ("nearest", "metric")


def check_evaluated(run: Path) -> None:
    """Refuse a run folder whose ``metrics.json`` is not an evaluation (``{}``, another tool's file) or
    holds a field of the wrong type or range (:func:`datarecon.evaluation.records.read_metrics`).

    Raises:
        DataReconError: one line naming the missing or bad field and the fix (``datarecon evaluate RUN``).
    """
    path = Path(run) / METRICS_FILE
    if not path.is_file():
        return  # render_report names the missing file
    metrics = read_json(path)
    missing = [k for k in REQUIRED_METRICS if not isinstance(metrics, dict) or k not in metrics]
    if missing:
        raise DataReconError(f"{path} is not an evaluation by datarecon (no {', '.join(missing)}); rerun "
                             f"`datarecon evaluate {run}` to write it")
    read_metrics(run)


def check_distinct(runs: list[Path]) -> None:
    """Refuse a run named twice (``report RE RE``, or ``RE`` and ``./RE``): the report would show it twice.

    Raises:
        DataReconError: one line naming the run given twice.
    """
    seen: dict[Path, Path] = {}
    for run in runs:
        key = Path(run).resolve()
        if key in seen:
            raise DataReconError(f"run {run} is given twice (as {seen[key]} and {run}); name each run once")
        seen[key] = Path(run)


def register(app: typer.Typer) -> None:
    """Add ``report`` to ``app``."""

    @app.command("report")
    @out_file_options(out="Output HTML file.", default=Path(REPORT_HTML))
    def report_cmd(
        runs: Annotated[list[Path], typer.Argument(help="Evaluated run directories and membership folders "
                                                        "(datarecon membership --evaluate --out DIR).")],
        title: Annotated[str, typer.Option(help="Report title.")] = "datarecon report",
        threads: ThreadsOption = DEFAULT_THREADS,
        *,
        output: OutFile,
    ) -> None:
        """Write a self-contained HTML report (images embedded; opens offline) of evaluated runs and membership
        folders."""
        set_threads(threads)
        check_distinct(runs)
        for run in runs:
            if not is_membership_folder(run):
                check_evaluated(run)
        out = output.check(ours=is_report, what="report")
        items = [membership_sections(run) if is_membership_folder(run) else run for run in runs]
        path = render_report(items, out=out, title=title)
        typer.echo(f"wrote {path}")
