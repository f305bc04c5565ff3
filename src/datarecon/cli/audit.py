"""``datarecon audit``: how much do weight decay, training length and DP-SGD protect a target?

``datarecon audit --scale smoke|small|gpu --out DIR`` trains a grid of defended targets, attacks each
with several KKT runs (attacker-side selection), evaluates against the held-out and noise nulls,
and writes ``DIR/report.html`` (count, mean best SSIM and held-out accuracy against ε, weight decay
and epochs, with the DP-SGD bound). Rerunning the same command skips finished pieces.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli._common import DEFAULT_THREADS, DeviceOption, check_threads, threads_help
from datarecon.cli.options import Output, backend_options, output_options
from datarecon.config import read_config_mapping
from datarecon.experiments.audit import SCALES, load_audit_config, run_audit
from datarecon.experiments.execution import Execution
from datarecon.experiments.reproduce import Runtime
from datarecon.utils.device import parse_device

#: what each audit scale is for (one entry per scale with a preset), shown by ``--scale``'s help
SCALE_NOTES = {"smoke": "CI, seconds", "small": "CPU, minutes", "gpu": "--device cuda"}
SCALE_HELP = " | ".join(f"{scale} ({SCALE_NOTES[scale]})" for scale in SCALES)


@output_options(out="Output folder (rerun into it to resume).",
                resume="Continue unfinished trainings and attacks from checkpoints.",
                overwrite="Replace an --out folder of another audit configuration.")
@backend_options(workers="Targets in flight (1: in-process).", default_workers=1)
def audit_cmd(
    scale: Annotated[str, typer.Option("--scale", help=SCALE_HELP)] = "small",
    config: Annotated[Path | None, typer.Option("--config", help="YAML/TOML overrides over the scale preset "
                                                "(one-to-one with datarecon.experiments.audit.AuditConfig).")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="DATARECON_DATA", help="Data folder.")] = None,
    device: DeviceOption = "cpu",
    threads: Annotated[int, typer.Option("--threads", min=0, help=threads_help(per=" per target",
                                                                               zero="PyTorch's default"))
                       ] = DEFAULT_THREADS,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress inside each target "
                                           "(training, attacks) when targets run in-process (--workers 1).")] = True,
    *,
    output: Output,
    backend: Execution,
) -> None:
    """Defence audit: reconstruction against weight decay, training length and DP-SGD (Opacus)."""
    parse_device(device)
    check_threads(threads)
    overrides = read_config_mapping(config) if config is not None else None
    cfg = load_audit_config(scale=scale, overrides=overrides)
    runtime = Runtime(data_dir=data_dir, device=device, resume=output.resume, progress=progress)
    execution = replace(backend, threads=threads)
    report = run_audit(cfg, out=output.out, scale=scale, runtime=runtime, execution=execution,
                       overwrite=output.overwrite, log=typer.echo)
    typer.echo(f"report: {report}")


def register(root: typer.Typer) -> None:
    """Add the ``audit`` command to ``root``."""
    root.command("audit")(audit_cmd)
