"""``datarecon train`` (train a target model) and ``datarecon info`` (show a model card).

Options override the fields of ``--config FILE`` (YAML/TOML mapping one-to-one to
:class:`datarecon.training.target.TrainConfig`); without a config file, ``--dataset``,
``--task`` and ``--n-per-class`` are required. User errors are raised as
:class:`~datarecon.errors.DataReconError`; the main CLI prints them on one line (exit 2).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from datarecon.cli.options import (Common, Flag, Output, comma_ints, common_options, config_options, flags,
                                   number_or_none, output_options)
from datarecon.config import load_config_file, read_config_mapping
from datarecon.errors import DataReconError
from datarecon.experiments.identifiability import kkt_gap_probe
from datarecon.models.checkpoint import load_model_dir
from datarecon.training.target import TargetMeasures, TrainConfig, build_train_config, model_card, train_target


def _flags() -> tuple[Flag, ...]:
    """One flag per field of :class:`~datarecon.training.target.TrainConfig` (data and architecture
    fields unprefixed, DP fields ``--dp-*``, a few renamed to their short names)."""
    return flags(
        TrainConfig, prefix={"data": "", "arch": "", "stop": ""},
        rename={"data.seed": "--data-seed", "arch.name": "--arch", "arch.hidden": ("--hidden", "--channels"),
                "stop.zero_error": "--stop-at-zero-error", "dp.noise_multiplier": "--dp-noise",
                "stop.margin_stable_rtol": ("--margin-stable-rtol", "--margin-rtol"),  # its name before
                "dp.target_epsilon": "--dp-epsilon", "dp.max_grad_norm": "--dp-clip",
                "pretrained.path": "--pretrained"},
        parse={"arch.hidden": comma_ints("--hidden", "widths"),
               "data.train_indices": comma_ints("--train-indices", "indices into the dataset's train split"),
               "max_lr_factor": number_or_none("--max-lr-factor", "a number >= 1")},
    )


@output_options(out="Model directory to write.", resume="Continue from OUT/checkpoint.",
                overwrite="Replace an existing --out directory.")
@config_options(_flags())
@common_options(quiet="Deprecated: --no-progress, and no model card.")
def train_cmd(
    config: Annotated[Path | None, typer.Option("--config", help="YAML/TOML training config; options override it.")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="DATARECON_DATA",
                                                  help="Data folder (default $DATARECON_DATA).")] = None,
    *,
    output: Output,
    common: Common,
    overrides: dict[str, Any],
) -> None:
    """Train a target model and write its model directory.

    Every field of the training config (docs/RUNS.md) has its flag below; flags override --config.
    The DP-SGD flags (--dp-*) need Opacus: pip install 'datarecon[dp]'.
    """
    _check_pretrained_flags(overrides, config)
    if config is not None:
        cfg = load_config_file(config, TrainConfig, overrides=overrides)
    else:
        given = overrides.get("data", {})
        missing = [f"--{k.replace('_', '-')}" for k in ("dataset", "task", "n_per_class") if k not in given]
        if missing:
            raise DataReconError(f"missing {', '.join(missing)}; pass them or a --config FILE")
        cfg = build_train_config(overrides)
    cfg.check_applies()
    probe = partial(kkt_gap_probe, loss=cfg.loss)  # the ascent curve's identifiability gap at its points
    result = train_target(cfg, data_dir=data_dir, out=output.out, resume=output.resume, overwrite=output.overwrite,
                          progress=common.progress, measures=TargetMeasures(ascent_probe=probe))
    if not common.quiet:
        typer.echo(model_card(load_model_dir(result.out)))
    typer.echo(f"wrote {result.out}")


def _check_pretrained_flags(overrides: dict[str, Any], config: Path | None) -> None:
    """Refuse ``--pretrained-sha256`` without a pretrained directory (flag or config file) in the flags' words."""
    given = overrides.get("pretrained") or {}
    if given.get("sha256") is None or given.get("path") is not None:
        return
    if config is not None and read_config_mapping(config).get("pretrained") is not None:
        return
    raise DataReconError("--pretrained-sha256 names the weights of a pretrained model; pass --pretrained DIR too "
                         "(the model directory that holds them)")


def info_cmd(model_dir: Annotated[Path, typer.Argument(help="A model directory (from datarecon train).")]) -> None:
    """Print the model card of a model directory (architecture, data, loss, metrics, versions)."""
    typer.echo(model_card(load_model_dir(model_dir)))


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``info`` to ``app``."""
    app.command("train")(train_cmd)
    app.command("info")(info_cmd)
