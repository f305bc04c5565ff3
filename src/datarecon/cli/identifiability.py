"""``datarecon identifiability MODEL``: which attack objective does the model's training set minimise?

The defender's check (:mod:`datarecon.experiments.identifiability`): for each objective of the KKT family
(weights only, θ_init known, Loo et al., gradients along the training path) and dynamics matching, the
relative residual of the training set with its optimal multipliers beside held-out images, means of two
training images and partition images. No attack runs; the training data are read from the model's data spec,
or, for a user's own model (``--model package.module:factory --weights FILE``), from ``--train`` and
``--heldout`` files (θ_init from ``--known-init FILE`` for the objectives that need it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from datarecon.attacks.knowledge import resolve_known_init
from datarecon.cli._own import OWN_OPTIONS, OwnFields, is_own_model, labelled, own_model_target
from datarecon.cli.options import Common, OutFile, common_options, config_options, flags, option_group, out_file_options
from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.experiments.identifiability import (
    Examined,
    IdentifiabilitySettings,
    identifiability,
    identifiability_lines,
    measure,
    module_sets,
)
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


@dataclass(frozen=True)
class OwnModel(OwnFields):
    """A user's own model: what a model directory would record, its examples and its initialisation.

    Attributes:
        weights, input_shape, value_range, loss, weight_decay: as :class:`~datarecon.cli._own.OwnOptions`.
        train: its training examples (safetensors: inputs x, labels y).
        heldout: examples it did not train on, the held-out fake (the same form), or None.
        known_init: its initial weights (a safetensors state dict), for the objectives that need θ_init, or None.
    """

    train: Path | None
    heldout: Path | None
    known_init: Path | None


OWN_MODEL = {**OWN_OPTIONS,
             "train": (Path | None, None, typer.Option("--train", help="your model: its training examples "
                                                       "(safetensors: inputs x, labels y)")),
             "heldout": (Path | None, None, typer.Option("--heldout", help="your model: examples it did not train "
                                                         "on, the held-out fake (safetensors: x, y)")),
             "known_init": (Path | None, None, typer.Option("--known-init", help="your model: its initial weights "
                                                            "(safetensors state dict), for kkt-init, loo, path"))}


def _own_examined(model: str, own: OwnModel, seed: int) -> Examined:
    """The check of a user's own model: its target, its examples and fakes, and θ_init when given.

    Raises:
        DataReconError: no --train, a bad factory, weights or examples, an initialisation that does not fit.
    """
    target = own_model_target(model, own.own)
    if own.train is None:
        raise DataReconError(f"--model {model} needs --train FILE: its training examples (safetensors: inputs x, "
                             "labels y); --heldout FILE adds the held-out fake")
    shape = tuple(target.input_shape)
    sets, notes = module_sets(labelled(own.train, "--train", input_shape=shape),
                              None if own.heldout is None else labelled(own.heldout, "--heldout", input_shape=shape),
                              seed=seed)
    params = {k: v.detach().to(torch.float64) for k, v in target.params.items()}
    init = None
    if own.known_init is not None:
        init = {k: v.to(torch.float64) for k, v in
                resolve_known_init(str(own.known_init), params, model_meta=None).params.items()}
    return Examined(model=target.model.to(torch.float64), params=params, num_outputs=target.num_outputs,
                    loss=target.loss, weight_decay=target.weight_decay, sets=sets, init=init,
                    init_missing="pass --known-init FILE, your model's initial weights", dynamics=None,
                    dynamics_missing="a model given as package.module:factory records no training recipe to replay",
                    notes=tuple(notes))


@config_options(_flags(), into="settings")
@out_file_options(out="write the full result as JSON")
@option_group("own", OwnModel, OWN_MODEL)
@common_options()
def identifiability_cmd(
    model: Annotated[str, typer.Argument(help="model directory (from `datarecon train`), or package.module:factory "
                                              "returning your nn.Module (with --weights)")],
    data_dir: Annotated[Path | None, typer.Option("--data-dir", envvar="DATARECON_DATA", help="data folder")] = None,
    *,
    own: OwnModel,
    settings: dict[str, Any],
    output: OutFile,
    common: Common,
) -> None:
    """Which attack objective does the training set minimise? Residuals of the truth and of fakes."""
    cfg = build_config(IdentifiabilitySettings, settings, where="identifiability settings")
    out = output.check(ours=_is_result, what="identifiability result")  # before any work
    if is_own_model(model, own.weights):
        result = {**measure(_own_examined(model, own, cfg.seed), cfg, progress=common.progress), "model": model}
    else:
        given = own.own.given() + [k for k, v in {"--train": own.train, "--heldout": own.heldout,
                                                  "--known-init": own.known_init}.items() if v is not None]
        if given:
            raise DataReconError(f"{', '.join(given)} apply to a model given as package.module:factory; a model "
                                 "directory records its data and initialisation itself")
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
