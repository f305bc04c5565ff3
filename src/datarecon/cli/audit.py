"""``datarecon audit``: how much do weight decay, training length and DP-SGD protect a target?

``datarecon audit --scale smoke|small|gpu --out DIR`` trains a grid of defended targets, attacks each
with several KKT runs (attacker-side selection), evaluates against the held-out and noise nulls,
and writes ``DIR/report.html`` (count, mean best SSIM and held-out accuracy against ε, weight decay
and epochs, with the DP-SGD bound). ``datarecon audit --model M --out DIR`` audits one trained model
instead (:mod:`datarecon.experiments.audit_model`: membership with the reference attacks, the scale's KKT
runs) and prints the answer, after the model's place on the leakage map (its n, fine-tuning steps and width
beside the nearest measured cells: :mod:`datarecon.experiments.leakage_placement`). Rerunning the same command
skips finished pieces.
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
from datarecon.experiments.audit_model import audit_model, with_model_references
from datarecon.experiments.execution import Execution
from datarecon.experiments.leakage_placement import placement_lines
from datarecon.experiments.membership.settings import parse_references
from datarecon.experiments.pipeline.pieces import Runtime
from datarecon.models.checkpoint import read_model_meta
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


@dataclass(frozen=True)
class ModelReferences:
    """What ``audit --model`` reads beside the model: its membership's reference models (None: the scale's) and the
    leakage map it is placed on.

    Attributes:
        references: ``auto`` or a number of reference models.
        budget_minutes: with ``auto``, the wall time they may take.
        leakage_map: the leakage map's results JSON (None: :func:`~datarecon.experiments.leakage_placement.
            default_results`).
    """

    references: str | None
    budget_minutes: float | None
    leakage_map: Path | None


MODEL_REFERENCES = {
    "references": (str | None, None, typer.Option(
        "--references", metavar="<int|auto>", show_default=False,
        help="With --model: the reference models of its membership audit (LiRA, RMIA): auto (as many as "
             "--budget-minutes allows; none, with their cost, where not even 16 fit) or a number K (0: none). "
             "Default: the scale's (auto).")),
    "budget_minutes": (float | None, None, typer.Option(
        "--budget-minutes", show_default=False,
        help="With --model and --references auto: the wall time the reference models may take. Default: the "
             "scale's (smoke 0.5, small and gpu 3).")),
    "leakage_map": (Path | None, None, typer.Option(
        "--leakage-map", show_default=False,
        help="With --model: the leakage map's results JSON (benchmarks/leakage_map.py table) the model is placed on. "
             "Default: $DATARECON_LEAKAGE_MAP, else the checkout's benchmarks/results/leakage_map.json.")),
}


@output_options(out="Output folder (rerun into it to resume).",
                resume="Continue unfinished trainings and attacks from checkpoints.",
                overwrite="Replace an --out folder of another audit configuration.")
@backend_options(workers="Targets in flight (1: in-process).", default_workers=1)
@option_group("references", ModelReferences, MODEL_REFERENCES)
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
    references: ModelReferences,
    output: Output,
    backend: Execution,
) -> None:
    """Defence audit: reconstruction against weight decay, training length and DP-SGD (Opacus); or one model."""
    parse_device(compute.device)
    check_threads(compute.threads)
    overrides = read_config_mapping(config) if config is not None else None
    cfg = load_audit_config(scale=scale, overrides=overrides)
    if model is None and references.leakage_map is not None:
        raise DataReconError("--leakage-map places the model of audit --model on the leakage map; pass --model DIR "
                             "or drop --leakage-map")
    if model is None and (references.references is not None or references.budget_minutes is not None):
        raise DataReconError("--references and --budget-minutes set the reference models of audit --model's "
                             "membership; the grid's targets take theirs from --config (membership: {references: "
                             "{count: K}})")
    cfg = with_model_references(cfg, count=None if references.references is None else
                                parse_references(references.references), budget_minutes=references.budget_minutes)
    runtime = Runtime(data_dir=data_dir, device=compute.device, resume=output.resume, progress=compute.progress)
    if model is not None:
        if backend.backend != "local" or (backend.workers or 1) != 1:
            raise DataReconError("--model audits one model in this process; drop --backend and --workers")
        set_threads(compute.threads)
        for line in placement_lines(read_model_meta(model), references.leakage_map):  # before the hours of the audit
            typer.echo(line)
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
