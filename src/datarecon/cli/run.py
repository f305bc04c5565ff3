"""``datarecon run``: execute an experiment file (train → attack → evaluate → report) into one folder.

The file maps one-to-one to :class:`datarecon.experiments.experiment.Experiment` (docs/RUNS.md).
Re-running the same command skips the finished stages and resumes an interrupted one.
"""

from __future__ import annotations

from pathlib import Path

import typer


def run(
    experiment: Path = typer.Argument(..., help="experiment file (YAML/TOML; docs/RUNS.md)"),
    out: Path = typer.Option(..., "--out", help="experiment folder (re-running resumes it)"),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="data folder (default $DATARECON_DATA)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing experiment folder"),
    progress: bool = typer.Option(True, "--progress/--no-progress",
                                  help="show progress (a bar on a terminal, plain lines in a log)"),
) -> None:
    """Run an experiment file: train the target, attack it, evaluate and report, resumably."""
    from datarecon.experiments.experiment import load_experiment, run_experiment

    exp = load_experiment(experiment)
    stages = run_experiment(exp, out, data_dir=data_dir, overwrite=overwrite, progress=progress)
    typer.echo(", ".join(f"{k}: {v}" for k, v in stages.items()) + f"; wrote {out}")


def register(app: typer.Typer) -> None:
    """Add ``run`` to ``app``."""
    app.command("run")(run)
