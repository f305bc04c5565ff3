"""Membership of a user's own model (bring your own model): the evaluation of
:mod:`datarecon.experiments.membership.evaluate` on a ``torch.nn.Module`` with members and non-members given as
tensors.

:func:`membership_of_module` (Python) and ``datarecon membership --model package.module:factory --weights FILE``
(:func:`evaluate_own_membership`) build one :class:`~datarecon.experiments.membership.case.MembershipCase` from the
module, its members and non-members (inputs in the model's own input space, with labels), RMIA's population
samples when given, and the user's training function for the reference models (``train(x, y, seed) ->
nn.Module``, run on the half-in pool like the recipe of a model directory; it receives the inputs in the dtype of
the model's weights and the labels as its loss takes them, :func:`~datarecon.experiments.membership.trainers.
recipe_inputs`), with the reference models' count, budget and seed from the one
:class:`~datarecon.experiments.membership.settings.ReferenceSettings`. Everything else is the model directory's
evaluation: every signal (the subspace signal where the first dense layer reads the inputs), the reference attacks
by default within a time budget, the strongest signal beside the loss threshold, the empirical ε bound, and with
``out`` a membership folder that keeps the reference models, the scores, the ROC and the most exposed members for
``datarecon report``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datarecon.attacks.base import Target
from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.errors import DataReconError
from datarecon.experiments.membership.candidates import assemble_candidates
from datarecon.experiments.membership.case import MembershipCase, setup_of
from datarecon.experiments.membership.evaluate import evaluate_case
from datarecon.experiments.membership.folder import TARGET_FORMAT
from datarecon.experiments.membership.settings import MembershipSettings, Runtime
from datarecon.experiments.membership.trainers import FunctionTrainer, import_callable
from datarecon.kernel.outdir import OutDir
from datarecon.utils.io import config_hash, params_digest, sha256_file

__all__ = ["OwnModel", "OwnSets", "evaluate_own_membership", "membership_of_module", "own_case", "own_record"]

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class OwnSets:
    """The images of a user's own evaluation, as (x, y) in the model's input space.

    Attributes:
        members: examples the model trained on; nonmembers: examples it did not (≥ 1000 resolve a TPR at 0.1 % FPR);
        population: further examples it did not train on, never a candidate (RMIA's z); None: the RMIA signals
            are not measured.
        sources: where each set came from, in words (for the record).
    """

    members: Pair
    nonmembers: Pair
    population: Pair | None = None
    sources: tuple[str, str, str] = ("given as tensors", "given as tensors", "given as tensors")


def own_record(name: str, *, weights: str | Path | None = None,
               params: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """What a membership folder records of a user's model: its name (the factory, or the module's class) and content
    identity (the weights file's SHA-256, else the parameters' digest)."""
    identity = sha256_file(Path(weights)) if weights is not None else params_digest(params or {})
    return {"format": TARGET_FORMAT, "model": name, "identity": config_hash({"own": name, "weights": identity})}


def _dtype(target: Target) -> torch.dtype:
    """The dtype of a user's model (its weights'): the inputs its training function receives."""
    return next(iter(target.params.values())).dtype


def _check_sets(sets: OwnSets) -> None:
    for what, pair in (("members", sets.members), ("nonmembers", sets.nonmembers), ("population", sets.population)):
        if pair is None:
            continue
        x, y = pair
        if x.shape[0] == 0 or x.shape[0] != y.shape[0]:
            raise DataReconError(f"pass {what} as (x, y) with one label per example, not empty; got {x.shape[0]} "
                                 f"inputs and {y.shape[0]} labels")
    if sets.members[0].shape[1:] != sets.nonmembers[0].shape[1:]:
        raise DataReconError(f"members are {tuple(sets.members[0].shape[1:])} and non-members "
                             f"{tuple(sets.nonmembers[0].shape[1:])}; pass inputs of one shape")


def own_case(target: Target, sets: OwnSets, *, trainer: FunctionTrainer | None, record: dict[str, Any],
             knowledge: KnowledgeSettings | None = None, seed: int = 0) -> MembershipCase:
    """The evaluation of a user's model: its target, candidates (the half-in pool drawn with ``seed``) and trainer.

    Raises:
        DataReconError: empty or mismatched sets, a bad known initialisation.
    """
    _check_sets(sets)
    (xm, ym), (xn, yn) = sets.members, sets.nonmembers
    pop = sets.population if sets.population is not None else (xn[:0], yn[:0])
    prov = {"members": {"count": int(xm.shape[0]), "source": f"your {xm.shape[0]} training examples ({sets.sources[0]})"},
            "nonmembers": {"count": int(xn.shape[0]), "available": int(xn.shape[0]), "requested": int(xn.shape[0]),
                           "source": f"examples your model did not train on ({sets.sources[1]})"},
            "population": {"count": int(pop[0].shape[0]), "available": int(pop[0].shape[0]),
                           "source": (f"population samples ({sets.sources[2]})" if sets.population is not None else
                                      "none given: the RMIA signals need population samples")}}
    arange = [torch.arange(n, dtype=torch.int64) for n in (xm.shape[0], xn.shape[0], pop[0].shape[0])]
    cand = assemble_candidates((xm.to(torch.float64), ym), (xn.to(torch.float64), yn),
                               (pop[0].to(torch.float64), pop[1]), indices=(arange[0], arange[1], arange[2]),
                               provenance=prov, seed=seed)
    setup = setup_of(target, knowledge=knowledge, meta=None, mean=torch.zeros(target.input_shape, dtype=torch.float64))
    why = "" if trainer is not None else ("no training function was given for the reference models (--recipe "
                                          "package.module:train, or recipe=train in Python)")
    return MembershipCase(setup=setup, candidates=cand, trainer=trainer, record=record, no_trainer=why,
                          knowledge=knowledge or KnowledgeSettings())


def membership_of_module(model: nn.Module, *, loss: Any, members: Pair, nonmembers: Pair, population: Pair | None = None,
                         recipe: Callable[..., nn.Module] | None = None,
                         settings: MembershipSettings = MembershipSettings(),
                         out: str | Path | None = None) -> dict[str, Any]:
    """Every membership signal on a user's own ``nn.Module`` (bring your own model), from tensors.

    Args:
        model: the trained network (copied, eval mode); inputs in its own input space.
        loss: a ``LOSSES`` name or ``loss(outputs, labels) -> scalar``.
        members: (x, y) of examples it trained on; nonmembers: (x, y) of examples it did not (≥ 1000 resolve a TPR
            at 0.1 % FPR).
        population: (x, y) of further examples it did not train on, never a candidate (RMIA's z); None: the RMIA
            signals are not measured.
        recipe: your training recipe, ``recipe(x, y, seed) -> nn.Module``: trains a fresh model on (x, y) as the
            target was trained (x in the dtype of the model's weights; y as given: class indices as int64, ±1 labels
            in the model's dtype); the reference models train with it on the half-in pool (the members and as many
            non-members of each class, each model on a random half); None: no reference signals.
        settings: how many reference models (``references``: a count, or auto within its budget; its seed), the
            calibration part and its seed (when the strongest signal is not chosen on reference models) and the
            reference attacks' settings (its ``nonmembers`` and ``population`` are the tensors given).
        out: a membership folder (the result, scores, ROC, the most exposed members and the reference models, which
            a second call reuses); None: nothing is kept (reference models train in a temporary folder).

    Returns:
        JSON-ready, as :func:`datarecon.experiments.membership.evaluate.evaluate_membership`.

    Raises:
        DataReconError: empty or mismatched inputs, a model or loss that does not fit them, a fixed number of
            reference models without a ``recipe``.
    """
    x = torch.cat([members[0], nonmembers[0]])
    lo_hi = (float(x.min()), float(x.max()))  # the range of valid inputs the model's checks draw from
    with warnings.catch_warnings():  # homogeneity is the KKT attacks' assumption; membership does not need it
        warnings.filterwarnings("ignore", message=".*not positively homogeneous.*")
        target = Target.from_module(model, loss=loss, input_shape=tuple(x.shape[1:]), value_range=lo_hi)
    net = target.model
    trainer = None
    if recipe is not None:
        trainer = FunctionTrainer(train=recipe, blank=lambda: copy.deepcopy(net), loss=loss,
                                  name=f"{recipe.__module__}.{recipe.__qualname__}", dtype=_dtype(target))
    record = own_record(f"{type(model).__module__}.{type(model).__qualname__}", params=dict(target.params))
    case = own_case(target, OwnSets(members, nonmembers, population), trainer=trainer, record=record,
                    seed=settings.seed)
    settings = settings.model_copy(update={"nonmembers": int(nonmembers[0].shape[0])})
    return evaluate_case(case, settings=settings, out=out, runtime=Runtime(log=lambda _: None))


@dataclass(frozen=True)
class OwnModel:
    """A user's model on the command line.

    Attributes:
        factory: ``package.module:factory`` returning the architecture (rebuilds it for kept reference models).
        weights: its weights file (a safetensors state dict; the folder's record of the model).
        recipe: ``package.module:train`` of the training function ``train(x, y, seed) -> nn.Module`` for the
            reference models, or None (no reference attacks).
    """

    factory: str
    weights: Path
    recipe: str | None = None


def evaluate_own_membership(target: Target, sets: OwnSets, model: OwnModel, *,
                            settings: MembershipSettings = MembershipSettings(),
                            knowledge: KnowledgeSettings | None = None, out: str | Path | OutDir | None = None,
                            runtime: Runtime = Runtime()) -> dict[str, Any]:
    """``datarecon membership --model package.module:factory --weights FILE``: every signal of a user's model.

    Args:
        target: the model as :meth:`~datarecon.attacks.base.Target.from_module` checked it.
        sets: its members, non-members and population samples (inputs in its input space, with labels).
        model: its factory, weights file and training function.
        settings, knowledge, out, runtime: as :func:`~datarecon.experiments.membership.evaluate.evaluate_membership`.

    Raises:
        DataReconError: a recipe that cannot be imported, empty or mismatched sets.
    """
    trainer = None
    if model.recipe is not None:
        factory = import_callable(model.factory, what="--model")
        trainer = FunctionTrainer(train=import_callable(model.recipe, what="--recipe"), blank=factory,
                                  loss=target.loss, name=model.recipe, factory=model.factory, dtype=_dtype(target))
    record = own_record(model.factory, weights=model.weights)
    case = own_case(target, sets, trainer=trainer, record=record, knowledge=knowledge, seed=settings.seed)
    return evaluate_case(case, settings=settings, out=out, runtime=runtime)
