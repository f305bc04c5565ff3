"""``datarecon audit``: how much do weight decay, training length and DP-SGD protect a target?

``datarecon audit --scale smoke|small|gpu --out DIR`` trains a grid of defended targets, attacks each
with several KKT runs (attacker-side selection), evaluates against the held-out and noise nulls,
and writes ``DIR/report.html`` (count, mean best SSIM and held-out accuracy against ε, weight decay
and epochs, with the DP-SGD bound). Rerunning the same command skips finished pieces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def audit_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output folder (rerun into it to resume).")],
    scale: Annotated[str, typer.Option("--scale", help="smoke (CI, seconds) | small (CPU, minutes) | gpu "
                                       "(--device cuda)")] = "small",
    config: Annotated[Path | None, typer.Option("--config", help="YAML/TOML overrides over the scale preset "
                                                "(one-to-one with datarecon.experiments.audit.AuditConfig).")] = None,
    data_dir: Annotated[str | None, typer.Option("--data-dir", envvar="DATARECON_DATA", help="Data folder.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu | cuda[:N].")] = "cpu",
    backend: Annotated[str, typer.Option("--backend", help="local (process pool) | ray")] = "local",
    workers: Annotated[int, typer.Option("--workers", "-j", min=1, help="targets in flight (1: in-process)")] = 1,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster address (auto or "
                                                    "HOST:PORT); default: embedded Ray")] = None,
    threads: Annotated[int, typer.Option("--threads", min=0, help="torch threads per target (0: default)")] = 1,
    resume: Annotated[bool, typer.Option("--resume", help="Continue unfinished trainings and attacks from checkpoints.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an --out folder of another "
                                            "audit configuration.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress inside each target "
                                           "(training, attacks) when targets run in-process (--workers 1).")] = True,
) -> None:
    """Defence audit: reconstruction against weight decay, training length and DP-SGD (Opacus)."""
    from datarecon.cli._common import parse_device
    from datarecon.config import read_config_mapping
    from datarecon.experiments.audit import load_audit_config, run_audit
    from datarecon.experiments.backends import BACKENDS

    parse_device(device)
    BACKENDS.get(backend)
    overrides = read_config_mapping(config) if config is not None else None
    cfg = load_audit_config(scale=scale, overrides=overrides)
    options = {"address": ray_address} if ray_address else {}
    report = run_audit(cfg, out=out, scale=scale, data_dir=data_dir, device=device, backend=backend, workers=workers,
                       threads=threads, resume=resume, overwrite=overwrite, backend_options=options, log=typer.echo,
                       progress=progress)
    typer.echo(f"report: {report}")


def register(root: typer.Typer) -> None:
    """Add the ``audit`` command to ``root``."""
    root.command("audit")(audit_cmd)
