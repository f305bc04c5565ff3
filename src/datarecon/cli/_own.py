"""A user's own model on the command line, for every command that takes one (``reconstruct``, ``membership``,
``identifiability``): ``--model package.module:factory --weights FILE`` and what a model directory would record
(``--input-shape``, ``--value-range``, ``--loss``, ``--weight-decay``), and the user's own examples as safetensors
files of tensors ``x`` (inputs in the model's input space) and ``y`` (labels).
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import typer

from datarecon.attacks.base import Target
from datarecon.errors import DataReconError
from datarecon.models.byom import build_from_factory, check_outputs, load_weights
from datarecon.utils.io import load_tensors

__all__ = ["OWN_OPTIONS", "OwnFields", "OwnOptions", "is_own_model", "labelled", "own_model_target", "own_options_refused"]


@dataclass(frozen=True)
class OwnOptions:
    """What a model directory would record, for a model given as ``package.module:factory``.

    Attributes:
        weights: your model's weights (a safetensors state dict).
        input_shape: the shape of one input (``3,32,32``).
        value_range: ``lower,upper`` of valid inputs.
        loss: its training loss (None: logistic for one output, cross-entropy for several).
        weight_decay: its training weight decay.
    """

    weights: Path | None
    input_shape: str | None
    value_range: str
    loss: str | None
    weight_decay: float

    def given(self) -> list[str]:
        """The options given that only a model given as package.module:factory takes."""
        given = {"--weights": self.weights, "--input-shape": self.input_shape, "--loss": self.loss}
        return [k for k, v in given.items() if v is not None] + (["--weight-decay"] if self.weight_decay else [])


@dataclass(frozen=True)
class OwnFields:
    """The own-model fields of a command's option group (``weights`` … ``weight_decay``, those of
    :data:`OWN_OPTIONS`) as one :class:`OwnOptions`."""

    weights: Path | None
    input_shape: str | None
    value_range: str
    loss: str | None
    weight_decay: float

    @property
    def own(self) -> OwnOptions:
        return OwnOptions(weights=self.weights, input_shape=self.input_shape, value_range=self.value_range,
                          loss=self.loss, weight_decay=self.weight_decay)


OWN_OPTIONS = {
    "weights": (Path | None, None, typer.Option("--weights", help="your model's weights (safetensors state dict; "
                                                "with --model package.module:factory)")),
    "input_shape": (str | None, None, typer.Option("--input-shape", help="your model: shape of one input, e.g. 3,32,32")),
    "value_range": (str, "0,1", typer.Option("--value-range", help="your model: lower,upper of valid inputs")),
    "loss": (str | None, None, typer.Option("--loss", help="your model: training loss (default logistic for one "
                                            "output, cross-entropy for several)")),
    "weight_decay": (float, 0.0, typer.Option("--weight-decay", help="your model: training weight decay")),
}


def is_own_model(model: str, weights: Path | None) -> bool:
    """Whether ``--model`` names a user's factory (``package.module:factory``, or any model with ``--weights``)
    rather than a model directory."""
    return weights is not None or (":" in model and not Path(model).is_dir())


def _floats(text: str, option: str, *, kind: type = float) -> tuple:
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise DataReconError(f"{option} must be comma-separated numbers like 3,32,32 or 0,1; got {text!r}") from None


def own_model_target(spec: str, options: OwnOptions, *, homogeneity: bool = True) -> Target:
    """The :class:`~datarecon.attacks.base.Target` of ``--model package.module:factory --weights FILE``.

    Imports the factory (the user's own code; the current folder is searched first, as ``python -m``
    does), loads the safetensors weights (never a pickle) and checks the module with
    :meth:`Target.from_module`. ``homogeneity``: keep its warning about a model that is not homogeneous (the KKT
    attacks' assumption; membership does not need it).

    Raises:
        DataReconError: missing --weights / --input-shape, unknown module or factory, weights that do
            not match the module (first tensor named), outputs or loss that do not fit.
    """
    if options.weights is None:
        raise DataReconError(f"--model {spec} needs --weights FILE.safetensors (the trained state dict)")
    if Path(spec).is_dir():  # --weights made a model directory read as a factory
        raise DataReconError(f"--model {spec} is a folder, and --weights goes with --model package.module:factory "
                             "(your own module); drop --weights to use the model directory")
    if options.input_shape is None:
        raise DataReconError(f"--model {spec} needs --input-shape, the shape of one input, e.g. 3,32,32")
    shape = _floats(options.input_shape, "--input-shape", kind=int)
    lo_hi = _floats(options.value_range, "--value-range")
    if len(lo_hi) != 2:
        raise DataReconError(f"--value-range must be lower,upper like 0,1; got {options.value_range!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = build_from_factory(spec)
    params = load_weights(module, options.weights)
    loss = options.loss
    if loss is None:
        outputs = check_outputs(module, params, shape, value_range=(lo_hi[0], lo_hi[1]))
        loss = "logistic" if outputs == 1 else "cross-entropy"
    with warnings.catch_warnings():
        if not homogeneity:
            warnings.filterwarnings("ignore", message=".*not positively homogeneous.*")
        return Target.from_module(module, loss=loss, input_shape=shape, value_range=(lo_hi[0], lo_hi[1]),
                                  weight_decay=options.weight_decay)


def labelled(path: Path, option: str, *, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of a safetensors file of a user's examples: inputs ``x`` (N, *input_shape) in the model's input space,
    labels ``y`` (N,): class indices, or ±1 for one output (never a pickle).

    Raises:
        DataReconError: a missing file, no ``x`` or ``y``, shapes that do not fit the model or each other.
    """
    if not Path(path).is_file():
        raise DataReconError(f"{option} file {path} not found; pass a safetensors file with inputs 'x' and labels 'y'")
    tensors = load_tensors(path)
    missing = [k for k in ("x", "y") if k not in tensors]
    if missing:
        raise DataReconError(f"{path} has no tensor {missing[0]!r}; {option} takes a safetensors file with the inputs "
                             "as 'x' (N, C, H, W) in the model's input space and their labels as 'y' (N,)")
    x, y = tensors["x"], tensors["y"]
    if tuple(x.shape[1:]) != tuple(input_shape) or y.shape != (x.shape[0],):
        raise DataReconError(f"{path}: x is {tuple(x.shape)} and y {tuple(y.shape)}; {option} needs x of shape "
                             f"(N, {', '.join(map(str, input_shape))}) and one label per input")
    return x.to(torch.float64), (y.to(torch.float64) if y.dtype.is_floating_point else y.to(torch.int64))


def own_options_refused(options: OwnOptions) -> None:
    """Refuse the options of a user's model given with a model directory (it records them itself).

    Raises:
        DataReconError: naming the options given.
    """
    given = options.given()
    if given:
        raise DataReconError(f"{', '.join(given)} apply to --model package.module:factory only; a model directory "
                             "records them itself")
