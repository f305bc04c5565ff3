"""``datarecon run``: execute an experiment file (train → attack → evaluate → report) into one folder.

The file maps one-to-one to :class:`datarecon.experiments.experiment.Experiment` (docs/RUNS.md).
Re-running the same command skips the finished stages and resumes an interrupted one.
"""

from __future__ import annotations

from pathlib import Path

import typer

from datarecon.cli._common import command_line
from datarecon.cli.options import Common, common_options
from datarecon.experiments.demo import headline_lines
from datarecon.experiments.experiment import REPORT, RUN_SUBDIR, finished_stages, load_experiment, run_experiment
from datarecon.kernel.files import METRICS_FILE, RUN_JSON
from datarecon.utils.io import read_json


@common_options()
def run(
    experiment: Path = typer.Argument(..., help="experiment file (YAML/TOML; docs/RUNS.md)"),
    out: Path = typer.Option(..., "--out", help="experiment folder (re-running resumes it)"),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="data folder (default $DATARECON_DATA)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing experiment folder"),
    *,
    common: Common,
) -> None:
    """Run an experiment file: train the target, attack it, evaluate and report, resumably."""
    exp = load_experiment(experiment)
    before = [] if overwrite else finished_stages(out, exp)
    stages = run_experiment(exp, out, data_dir=data_dir, overwrite=overwrite, progress=common.progress,
                            record={"resume_command": command_line()})
    if before:
        typer.echo(f"{out}: {', '.join(before)} already finished there, not run again"
                   + ("; nothing left to do (--overwrite starts afresh)" if len(before) == sum(
                       v != "skipped" for v in stages.values()) else ""))
    typer.echo(", ".join(f"{k}: {v}" for k, v in stages.items()) + f"; wrote {out}")
    for line in result_lines(out, stages):
        typer.echo(line)


def result_lines(out: Path, stages: dict[str, str]) -> list[str]:
    """What the experiment found: the attack's final state, the headline beside its nulls, the report."""
    lines = []
    run_json = out / RUN_SUBDIR / RUN_JSON
    if run_json.is_file():
        run = read_json(run_json)
        rel = ((run.get("selection") or {}).get("relative_residual") or {}).get("value")
        shown = f", relative residual {rel:.4g}" if isinstance(rel, (int, float)) else ""
        lines.append(f"attack: {run.get('method')} {run.get('status')} after {run.get('steps_done')} steps{shown}")
    metrics = out / RUN_SUBDIR / METRICS_FILE
    if stages.get("evaluate") not in ("skipped", None) and metrics.is_file():
        lines.extend(headline_lines(read_json(metrics).get("headline") or {}))
    if (out / REPORT).is_file() and stages.get("report") != "skipped":
        lines.append(f"report: {out / REPORT}")
    return lines


def register(app: typer.Typer) -> None:
    """Add ``run`` to ``app``."""
    app.command("run")(run)
