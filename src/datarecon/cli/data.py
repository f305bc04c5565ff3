"""``datarecon data``: download datasets and show which are available.

The main CLI calls :func:`register`; user errors are raised as
:class:`~datarecon.errors.DataReconError` and turned into one-line messages there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from datarecon.data import DATASETS, dataset_counts, download_dataset, resolve_data_dir
from datarecon.errors import DataMissingError, DataReconError

DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Data folder (default: $DATARECON_DATA, else the user cache)."),
]


def download_cmd(
    name: Annotated[str, typer.Argument(help=f"Dataset: {', '.join(DATASETS.names())}.")],
    data_dir: DataDirOpt = None,
) -> None:
    """Download a dataset from its canonical source (md5-verified)."""
    path = download_dataset(name, data_dir=data_dir, progress=typer.echo)
    typer.echo(f"{name}: ready under {path}")


def info_cmd(data_dir: DataDirOpt = None) -> None:
    """List the datasets found in the data folder, with image counts."""
    root = resolve_data_dir(data_dir)
    typer.echo(f"data folder: {root}")
    for name in DATASETS.names():
        info = DATASETS.get(name)
        try:
            counts = dataset_counts(name, data_dir=root)
        except DataMissingError as exc:
            typer.echo(f"  {name:<8} missing  ({exc})")
            continue
        except DataReconError as exc:  # present but truncated or corrupt
            typer.echo(f"  {name:<8} damaged  ({exc})")
            continue
        where = "bundled" if not info.needs_files else "found"
        shape = "x".join(str(s) for s in info.input_shape)
        typer.echo(f"  {name:<8} {where:<8} train {counts['train']:>6}  test {counts['test']:>6}"
                   f"  images {shape}")


def register(app: typer.Typer) -> None:
    """Add the ``data`` sub-command group (``download``, ``info``) to ``app``."""
    data_app = typer.Typer(rich_markup_mode=None, help="Datasets: download them, show what is available.",
                           no_args_is_help=True)
    data_app.command("download")(download_cmd)
    data_app.command("info")(info_cmd)
    app.add_typer(data_app, name="data")
