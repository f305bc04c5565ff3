"""``datarecon reproduce <paper>``: run a paper's experiments end to end and write a report.

``datarecon reproduce runkel2024 --scale smoke --data-dir D --out DIR`` trains the targets, runs
every attack, evaluates, draws the figures and writes ``DIR/report.html`` plus the raw artefacts.
Rerunning the same command skips finished pieces (each has a ``DONE.json`` marker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli._common import DeviceOption
from datarecon.cli.options import Common, Output, common_options, output_options
from datarecon.config import read_config_mapping
from datarecon.experiments.reproduce import REPRODUCTIONS, SCALES, Runtime, plan_reproduction, reproduce
from datarecon.experiments.reproduce.cost import device_note
from datarecon.experiments.pipeline.pieces import format_plan
from datarecon.utils.device import parse_device

#: the help of ``datarecon reproduce NAME``, one entry per registered reproduction
PAPER_HELP = {
    "runkel2024": "Runkel et al. 2024: Table 1, Figures 1-12 and the privacy measurement.",
    "haim2022": "Haim et al. 2022: KKT attack on MNIST odd/even and CIFAR-10 vehicles/animals.",
}
#: what each rung of the scale ladder is for, shown by ``--scale``'s help
SCALE_NOTES = {"smoke": "CI, minutes on CPU", "small": "CPU, minutes",
               "medium": "CPU, <= 1 h; runkel2024: one-hidden width 1024, n = 100", "paper": "GPU"}
SCALE_HELP = " | ".join(f"{scale} ({SCALE_NOTES[scale]})" for scale in SCALES)

app = typer.Typer(rich_markup_mode=None, no_args_is_help=True,
                  help=f"Reproduce a paper's experiments ({', '.join(REPRODUCTIONS.ordered())}) and write an HTML "
                  "report.")


def _run(name: str, *, scale: str, output: Output, data_dir: str | None, device: str, config: Path | None,
         dry_run: bool = False, progress: bool = True) -> None:
    parse_device(device, require_available=not dry_run)  # refuses cuda without a GPU (a dry run only estimates)
    overrides = read_config_mapping(config) if config is not None else None
    if dry_run:
        planned = plan_reproduction(name, out=output.out, scale=scale, data_dir=data_dir, device=device,
                                    overrides=overrides)
        for line in format_plan(planned, device=device):
            typer.echo(line)
        typer.echo(device_note(device))
        return
    runtime = Runtime(data_dir=data_dir, device=device, resume=output.resume, progress=progress)
    report = reproduce(name, out=output.out, scale=scale, runtime=runtime, overwrite=output.overwrite,
                       overrides=overrides, log=typer.echo)
    typer.echo(f"report: {report}")


_Scale = Annotated[str, typer.Option("--scale", help=f"{SCALE_HELP}; see --dry-run.")]
_OUTPUT = output_options(out="Output folder (rerun into it to resume).",
                         resume="Continue unfinished trainings and attacks from their checkpoints.",
                         overwrite="Replace an --out folder of another configuration.")
_Data = Annotated[str | None, typer.Option("--data-dir", envvar="DATARECON_DATA", help="Data folder.")]
_Device = DeviceOption
_Config = Annotated[Path | None, typer.Option("--config", help="YAML/TOML overrides over the scale preset.")]
_DryRun = Annotated[bool, typer.Option("--dry-run", help="List the pieces, which are done in --out, and the "
                                        "estimated time and memory of each on --device; run nothing.")]
_PROGRESS = "Progress inside long pieces (a bar on a terminal, plain lines with rate and ETA in a log)."


def _paper_command(name: str, doc: str) -> None:
    """Register ``datarecon reproduce NAME``: the same options for every paper, its own docstring."""

    @_OUTPUT
    @common_options(progress=_PROGRESS)
    def command(scale: _Scale = "smoke", data_dir: _Data = None, device: _Device = "cpu", config: _Config = None,
                dry_run: _DryRun = False, *, output: Output, common: Common) -> None:
        _run(name, scale=scale, output=output, data_dir=data_dir, device=device, config=config, dry_run=dry_run,
             progress=common.progress)

    command.__doc__ = doc
    app.command(name, short_help=doc.split(":")[0])(command)


for _name in REPRODUCTIONS.ordered():
    _paper_command(_name, PAPER_HELP[_name])


def register(root: typer.Typer) -> None:
    """Add the ``reproduce`` command group to ``root``."""
    root.add_typer(app, name="reproduce")
