"""``datarecon demo``: train → attack → evaluate → report on bundled digits, in about a minute."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli._common import check_threads
from datarecon.cli.options import default_text
from datarecon.config import build_config, merge, read_config_mapping
from datarecon.experiments.demo import DemoConfig, run_demo
from datarecon.models.checkpoint import load_model_dir
from datarecon.training.target import model_card


def register(app: typer.Typer) -> None:
    """Add ``demo`` to ``app``."""

    @app.command("demo")
    def demo_cmd(
        out: Annotated[Path, typer.Option(help="Output folder.")] = Path("demo-out"),
        steps: Annotated[int | None, typer.Option(help="Attack steps." + default_text(DemoConfig, "attack_steps"))] = None,
        seed: Annotated[int, typer.Option(help="Seed of data selection, training and attack.")] = 0,
        config: Annotated[Path | None, typer.Option(help="YAML/TOML file of DemoConfig fields.")] = None,
        overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
        progress: Annotated[bool, typer.Option("--progress/--no-progress",
                                               help="Show progress (a bar on a terminal, plain lines in a log).")] = True,
        quiet: Annotated[bool, typer.Option("--quiet", hidden=True, help="Deprecated: --no-progress.")] = False,
        threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for PyTorch (0: its default, all "
                                                    "cores; 1: fastest for the demo's tiny model)."
                                                    + default_text(DemoConfig, "threads"))] = None,
    ) -> None:
        """Train a homogeneous MLP on digits odd/even, reconstruct its training data with the KKT attack,
        and write reconstructions.png and report.html."""
        if threads is not None:
            check_threads(threads)
        fields = read_config_mapping(config) if config is not None else {}
        cfg = build_config(DemoConfig, merge(fields, {"attack_steps": steps, "seed": seed, "threads": threads}),
                           where="demo config")
        result = run_demo(cfg, out=out, progress=progress and not quiet, overwrite=overwrite)
        typer.echo(model_card(load_model_dir(result.model_dir)))
        typer.echo("")
        rel = result.relative_residual
        typer.echo(f"KKT attack: relative residual {rel:.3g} (||theta* - g||^2 / ||theta*||^2 of the final candidates; "
                   "converged below 0.05)" if rel is not None else "KKT attack done")
        for line in result.headline_lines():
            typer.echo(line)
        typer.echo(f"wrote {result.picture} and {result.report}")
