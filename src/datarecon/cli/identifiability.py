"""``datarecon identifiability MODEL``: which attack objective does the model's training set minimise?

The defender's check (:mod:`datarecon.experiments.identifiability`): for each objective of the KKT family
(weights only, θ_init known, Loo et al., gradients along the training path) and dynamics matching, the
relative residual of the training set with its optimal multipliers beside held-out images, means of two
training images and partition images. No attack runs; the training data are read from the model's data spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from datarecon.cli.options import Common, OutFile, common_options, config_options, flags, out_file_options
from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.experiments.identifiability import IdentifiabilitySettings, identifiability, identifiability_lines
from datarecon.utils.io import atomic_write_json, read_json


def _flags() -> Any:
    def names(text: str) -> list[str]:
        return [s.strip() for s in str(text).split(",") if s.strip()]

    return flags(IdentifiabilitySettings, parse={"objectives": names})


def _is_result(path: Path) -> bool:
    """Whether ``path`` is a result this command wrote (its JSON keys), which ``--overwrite`` may replace."""
    try:
        found = read_json(path)
    except (DataReconError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(found, dict) and {"objectives", "formulation", "sets"} <= set(found)


@config_options(_flags(), into="settings")
@out_file_options(out="write the full result as JSON")
@common_options()
def identifiability_cmd(
    model: Annotated[Path, typer.Argument(help="model directory (from `datarecon train`)")],
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="DATARECON_DATA", help="data folder")] = None,
    *,
    settings: dict[str, Any],
    output: OutFile,
    common: Common,
) -> None:
    """Which attack objective does the training set minimise? Residuals of the truth and of fakes."""
    cfg = build_config(IdentifiabilitySettings, settings, where="identifiability settings")
    out = output.check(ours=_is_result, what="identifiability result")  # before any work
    result = identifiability(model, cfg, data_dir=data_dir, progress=common.progress)
    typer.echo(f"{model}: n = {result['n']} training images, {result['formulation']} margins; relative residual "
               "with optimal multipliers (lower fits better)")
    for line in identifiability_lines(result):
        typer.echo("  " + line)
    for note in [*result["notes"], *([result["weight_decay_note"]] if result["weight_decay_note"] else [])]:
        typer.echo(f"note: {note}")
    if out is not None:
        atomic_write_json(out, result)
        typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Add ``identifiability`` to ``app``."""
    app.command("identifiability")(identifiability_cmd)
