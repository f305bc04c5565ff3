"""How one reference model trains: the recipe the attacker knows, repeated with the model's own seeds.

* :class:`RecipeTrainer`: a model directory's recorded training config, run by datarecon's own training
  (:func:`~datarecon.training.target.fit_on_images`) with a new initialisation and batch order per model;
* :class:`FunctionTrainer`: a user's own training function ``train(x, y, seed) -> nn.Module``, given the inputs in
  the dtype of the user's model (that of its weights) and the labels as the model's loss takes them (class indices
  as int64, ±1 of a one-output model in the model's dtype).

Both rebuild in a worker process from their :meth:`payload` (:func:`trainer_from_payload`). The seed of reference
model k's initialisation and of its training subset follow from SHA-256 of (seed, k) (:func:`reference_seed`).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from datarecon.config import MAX_SEED
from datarecon.errors import DataReconError
from datarecon.models.spec import build_model
from datarecon.training.target import TrainConfig, fit_on_images
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.io import config_hash

__all__ = ["Fitted", "FunctionTrainer", "RecipeTrainer", "Trainer", "import_callable", "recipe_inputs",
           "reference_config", "reference_seed", "trainer_from_payload"]


def reference_seed(seed: int, index: int, what: str) -> int:
    """The seed of reference model ``index``'s ``what`` ("subset", "init"): SHA-256 of (seed, index), below MAX_SEED."""
    digest = hashlib.sha256(f"datarecon-reference-{what}:{int(seed)}:{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % MAX_SEED


def reference_config(config: TrainConfig, *, seed: int, index: int, device: str) -> TrainConfig:
    """The target's training config for reference model ``index``: its own initialisation and batch-order
    seed, the given device, no checkpoints and no KKT score (the recipe is otherwise the target's)."""
    return config.model_copy(update={"seed": reference_seed(seed, index, "init"), "device": device, "checkpoint_every": 0,
                                     "kkt_score": False, "log_every": max(config.epochs, 1)})


def import_callable(spec: str, *, what: str) -> Callable[..., Any]:
    """``package.module:name`` imported (the user's own code; the current folder is searched first, as ``python -m``
    does).

    Raises:
        DataReconError: not of the form package.module:name, a module that cannot be imported, no such name, or
            not callable.
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise DataReconError(f"{what} {spec!r} must be package.module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        raise DataReconError(f"{what} {spec!r}: module {exc.name!r} not found; run from the folder that holds "
                             "it or install it") from None
    except AttributeError:
        raise DataReconError(f"{what} {spec!r}: {module} has no {name!r}") from None
    if not callable(found):
        raise DataReconError(f"{what} {spec!r} is not callable")
    return found


@dataclass(frozen=True)
class Fitted:
    """A trained reference model: the network (eval mode, CPU), the shift of its inputs (model input = pool image −
    shift) and what its training reported."""

    model: nn.Module
    shift: torch.Tensor
    record: dict[str, Any]


@dataclass(frozen=True)
class RecipeTrainer:
    """Reference models trained by datarecon's own training with a model directory's recorded recipe
    (:func:`~datarecon.training.target.fit_on_images`, a new initialisation and batch order per model).

    Attributes:
        config: the target's training config (the recipe the attacker knows).
    """

    config: TrainConfig

    @property
    def loss(self) -> Any:
        return self.config.loss

    @property
    def label(self) -> str:
        """How the reference models train, in words."""
        return "the model's recorded training recipe"

    def identity(self) -> dict[str, Any]:
        """What the reference models' piece hash covers of the recipe."""
        recipe = self.config.model_dump(mode="json", exclude={"device", "checkpoint_every", "log_every", "kkt_score",
                                                               "seed"})
        return {"recipe": config_hash(recipe)}

    def payload(self) -> dict[str, Any] | None:
        return {"kind": "recipe", "config": self.config.model_dump(mode="json")}

    def fit(self, x: torch.Tensor, y: torch.Tensor, *, seed: int, index: int, device: str) -> Fitted:
        cfg = reference_config(self.config, seed=seed, index=index, device=device)
        fitted = fit_on_images(cfg, x, y, device=device)
        return Fitted(model=fitted.model, shift=fitted.normalisation.mean.to(torch.float64),
                      record={"train_accuracy": fitted.fit.metrics["train_acc"], "train_loss": fitted.fit.metrics["loss"],
                              "epochs_done": fitted.fit.epochs_done})

    def build(self) -> nn.Module:
        return build_model(self.config.arch_spec(), dtype=torch_dtype(self.config.dtype))


def recipe_inputs(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a user's training function receives: inputs (n, ...) in the model's dtype, and labels as its loss takes
    them: class indices as int64, ±1 labels of a one-output model (floating point) in the model's dtype."""
    if dtype is None:
        return x, y
    return x.to(dtype), (y.to(dtype) if y.dtype.is_floating_point else y.to(torch.int64))


def _shapes(x: torch.Tensor, y: torch.Tensor) -> str:
    return f"x {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)}, y {str(y.dtype).removeprefix('torch.')} " \
           f"{tuple(y.shape)}"


@dataclass(frozen=True)
class FunctionTrainer:
    """Reference models of a user's own model, trained by the user's function ``train(x, y, seed) -> nn.Module`` on
    the model's own inputs (:func:`recipe_inputs`: in the model's dtype).

    Attributes:
        train: the training function (the seed is drawn per model from the reference seed).
        blank: ``blank() -> nn.Module`` of the architecture (to load kept weights into).
        loss: the training loss (a ``LOSSES`` name or a callable).
        name: ``package.module:function`` when the function can be imported by name (reference models may then
            train in worker processes), else its qualified name (trained in this process).
        factory: ``package.module:factory`` of the architecture when importable (for the workers), else None.
        dtype: the dtype of the user's model (its weights'): the inputs the function receives (None: as stored).
    """

    train: Callable[..., nn.Module]
    blank: Callable[[], nn.Module]
    loss: Any
    name: str
    factory: str | None = None
    dtype: torch.dtype | None = None

    @property
    def label(self) -> str:
        """How the reference models train, in words."""
        return f"your training function {self.name}"

    def identity(self) -> dict[str, Any]:
        return {"train": self.name, "loss": self.loss if isinstance(self.loss, str) else getattr(self.loss,
                                                                                                  "__qualname__", "")}

    def payload(self) -> dict[str, Any] | None:
        if ":" not in self.name or self.factory is None or not isinstance(self.loss, str):
            return None
        dtype = None if self.dtype is None else str(self.dtype).removeprefix("torch.")
        return {"kind": "function", "train": self.name, "factory": self.factory, "loss": self.loss, "cwd": os.getcwd(),
                "dtype": dtype}

    def fit(self, x: torch.Tensor, y: torch.Tensor, *, seed: int, index: int, device: str) -> Fitted:
        """Reference model ``index`` trained by the user's function.

        Raises:
            DataReconError: the function failed (one line naming it, the model and the inputs it was given), or
                returned no ``nn.Module``.
        """
        x, y = recipe_inputs(x, y, self.dtype)
        try:
            model = self.train(x, y, reference_seed(seed, index, "init"))
        except Exception as exc:  # noqa: BLE001 - the user's code: its failure is named as theirs, in one line
            first = (str(exc).splitlines() or [""])[0]
            raise DataReconError(f"your training function {self.name} failed on reference model {index}, given "
                                 f"{_shapes(x, y)}: {type(exc).__name__}: {first}") from None
        if not isinstance(model, nn.Module):
            raise DataReconError(f"the training function {self.name} returned {type(model).__name__}, not an "
                                 "nn.Module; return the trained network")
        _check_returned(model, self.blank(), name=self.name, index=index)
        return Fitted(model=model.to("cpu").eval(), shift=torch.zeros(x.shape[1:], dtype=torch.float64), record={})

    def build(self) -> nn.Module:
        return self.blank()


def _check_returned(model: nn.Module, blank: nn.Module, *, name: str, index: int) -> None:
    """The network a user's training function returned is the model's architecture (the parameters and buffers of
    its factory, by name and shape) with finite weights; else one line naming the function (the seventh trial: a
    network of another architecture ended in "mat1 and mat2 shapes cannot be multiplied", NaN weights in "a reference
    model's statistics are not finite; retrain the reference models")."""
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in blank.state_dict().items()}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:2]
        raise DataReconError(f"the training function {name} returned a network that is not --model's architecture "
                             f"(reference model {index}; first differences in (name, shape): {diff}); return the "
                             "factory's network, trained")
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DataReconError(f"the training function {name} returned a network with non-finite weights ({bad[0]}; "
                             f"reference model {index}); fix its training (a lower learning rate, fewer steps)")


Trainer = RecipeTrainer | FunctionTrainer


def trainer_from_payload(payload: dict[str, Any]) -> Trainer:
    """The trainer a worker process rebuilds from :meth:`RecipeTrainer.payload` / :meth:`FunctionTrainer.payload`."""
    if payload["kind"] == "recipe":
        return RecipeTrainer(TrainConfig.model_validate(payload["config"]))
    if payload.get("cwd") and payload["cwd"] not in sys.path:
        sys.path.insert(0, payload["cwd"])
    factory = import_callable(payload["factory"], what="--model")
    dtype = getattr(torch, payload["dtype"]) if payload.get("dtype") else None
    return FunctionTrainer(train=import_callable(payload["train"], what="--recipe"), blank=factory,
                           loss=payload["loss"], name=payload["train"], factory=payload["factory"], dtype=dtype)
