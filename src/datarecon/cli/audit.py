"""``datarecon audit``: how much do weight decay, training length and DP-SGD protect a target?

``datarecon audit --scale smoke|small|gpu --out DIR`` trains a grid of defended targets, attacks each
with several KKT runs (attacker-side selection), evaluates against the held-out and noise nulls,
and writes ``DIR/report.html`` (count, mean best SSIM and held-out accuracy against ε, weight decay
and epochs, with the DP-SGD bound). ``datarecon audit --model M --out DIR`` audits one trained model
instead (:mod:`datarecon.experiments.audit_model`: membership with the reference attacks, the scale's KKT
runs) and prints the answer. Rerunning the same command skips finished pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer

from datarecon.cli._common import DEFAULT_THREADS, check_threads, set_threads, threads_help
from datarecon.cli.options import Output, backend_options, option_group, output_options
from datarecon.config import read_config_mapping
from datarecon.errors import DataReconError
from datarecon.experiments.audit import SCALES, load_audit_config, run_audit, summary_lines
from datarecon.experiments.audit_model import audit_model
from datarecon.experiments.execution import Execution
from datarecon.experiments.pipeline.pieces import Runtime
from datarecon.utils.device import parse_device

#: what each audit scale is for (one entry per scale with a preset), shown by ``--scale``'s help
SCALE_NOTES = {"smoke": "CI, seconds", "small": "CPU, minutes", "gpu": "--device cuda"}
SCALE_HELP = " | ".join(f"{scale} ({SCALE_NOTES[scale]})" for scale in SCALES)


@dataclass(frozen=True)
class Compute:
    """Where and how the audit computes.

    Attributes:
        device: torch device of the targets' training and attacks.
        threads: CPU threads for PyTorch per target.
        progress: progress inside each target when targets run in-process.
    """

    device: str
    threads: int
    progress: bool


COMPUTE = {
    "device": (str, "cpu", typer.Option("--device", help="cpu, cuda or cuda:N.")),
    "threads": (int, DEFAULT_THREADS, typer.Option("--threads", min=0, help=threads_help(per=" per target",
                                                                                         zero="PyTorch's default"))),
    "progress": (bool, True, typer.Option("--progress/--no-progress", help="Progress inside each target (training, "
                                          "attacks) when targets run in-process (--workers 1).")),
}


@output_options(out="Output folder (rerun into it to resume).",
                resume="Continue unfinished trainings and attacks from checkpoints.",
                overwrite="Replace an --out folder of another audit configuration.")
@backend_options(workers="Targets in flight (1: in-process).", default_workers=1)
@option_group("compute", Compute, COMPUTE)
def audit_cmd(
    scale: Annotated[str, typer.Option("--scale", help=SCALE_HELP)] = "small",
    config: Annotated[Path | None, typer.Option("--config", help="YAML/TOML overrides over the scale preset "
                                                "(one-to-one with datarecon.experiments.audit.AuditConfig).")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="DATARECON_DATA", help="Data folder.")] = None,
    model: Annotated[Path | None, typer.Option("--model", help="Audit this trained model (a model directory) "
                                               "instead of the scale's grid: membership with the reference attacks "
                                               "and the scale's KKT runs.")] = None,
    *,
    compute: Compute,
    output: Output,
    backend: Execution,
) -> None:
    """Defence audit: reconstruction against weight decay, training length and DP-SGD (Opacus); or one model."""
    parse_device(compute.device)
    check_threads(compute.threads)
    overrides = read_config_mapping(config) if config is not None else None
    cfg = load_audit_config(scale=scale, overrides=overrides)
    runtime = Runtime(data_dir=data_dir, device=compute.device, resume=output.resume, progress=compute.progress)
    if model is not None:
        if backend.backend != "local" or (backend.workers or 1) != 1:
            raise DataReconError("--model audits one model in this process; drop --backend and --workers")
        set_threads(compute.threads)
        report, lines = audit_model(model, cfg, out=output.out, runtime=runtime, overwrite=output.overwrite,
                                    log=typer.echo, scale=scale)
        for line in lines:
            typer.echo(line)
        typer.echo(f"report: {report}")
        return
    execution = replace(backend, threads=compute.threads)
    report = run_audit(cfg, out=output.out, scale=scale, runtime=runtime, execution=execution,
                       overwrite=output.overwrite, log=typer.echo)
    for line in ["per target:", *summary_lines(output.out, scale=scale)]:
        typer.echo(line)
    typer.echo(f"report: {report}")


def register(root: typer.Typer) -> None:
    """Add the ``audit`` command to ``root``."""
    root.command("audit")(audit_cmd)
