"""What one membership evaluation measures: the model as the attacker sees it (:class:`MembershipSetup`: the
target, its first dense layer's subspace, its input shift), its candidates and how its reference models train
(:class:`MembershipCase`), for a model directory (:func:`prepare_membership`) and a user's own model alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.knowledge import KnowledgeSettings, attacker_knowledge
from datarecon.config import build_config
from datarecon.data import DataSpec, load_task
from datarecon.data.selection import check_fingerprint
from datarecon.errors import DataReconError
from datarecon.experiments.membership.candidates import Candidates
from datarecon.experiments.membership.trainers import Trainer
from datarecon.models.checkpoint import EXTRAS, read_model_meta
from datarecon.training.target import TrainConfig
from datarecon.utils.io import load_tensors

__all__ = ["MembershipCase", "MembershipSetup", "model_task", "prepare_membership", "setup_of", "training_config"]


@dataclass(frozen=True)
class MembershipSetup:
    """The model as the attacker sees it, its subspace and its input shift.

    Attributes:
        target: the attacker's view (float64).
        analysis: :class:`~datarecon.attacks.subspace.SubspaceAnalysis` of the first dense layer, or None.
        mean: (C, H, W) display → model shift (model input = display − mean; zeros for a user's own model, whose
            images are its inputs).
        meta: model.json ({} for a user's own model).
        threat: the threat-model record (:func:`~datarecon.attacks.knowledge.threat_model`).
    """

    target: Any
    analysis: Any
    mean: torch.Tensor
    meta: dict[str, Any]
    threat: dict[str, Any]

    @property
    def subspace_applies(self) -> bool:
        """Whether the first dense layer reads the images themselves (an MLP), so that the subspace test means
        what it says; a CNN's first dense layer reads features."""
        return self.analysis is not None and bool(self.analysis.layer.on_input)

    @property
    def subspace(self) -> Any:
        """The analysis the ``subspace`` signal reads: where the first dense layer reads the images, else None."""
        return self.analysis if self.subspace_applies else None

    def inputs(self, display: torch.Tensor) -> torch.Tensor:
        """Display-space images as model inputs, in the dtype of the model's parameters (float64 for a model
        directory; a user's model as its weights are)."""
        dtype = next(iter(self.target.params.values())).dtype
        return (display.to(torch.float64) - self.mean.to(torch.float64)).to(dtype)

    def subspace_note(self) -> str:
        """Why the subspace signal is not measured ("" where it is)."""
        if self.subspace_applies:
            return ""
        if self.analysis is not None:
            return "not applicable: the first dense layer reads the features of earlier layers, not the images"
        return "not applicable: the model has no dense layer"


def setup_of(target: Target, *, knowledge: KnowledgeSettings | None, meta: dict[str, Any] | None,
             mean: torch.Tensor) -> MembershipSetup:
    """Resolve the attacker's knowledge for ``target`` and analyse its first dense layer."""
    prior = AttackerPrior.balanced(m=1, num_outputs=target.num_outputs, input_shape=target.input_shape)
    prior, threat = attacker_knowledge(target, prior, knowledge or KnowledgeSettings(), model_meta=meta)
    return MembershipSetup(target=target, analysis=prior.subspace, mean=mean, meta=dict(meta or {}), threat=threat)


def prepare_membership(model_dir: str | Path, *, knowledge: KnowledgeSettings | None = None) -> MembershipSetup:
    """Load the model directory, resolve the attacker's knowledge and analyse the first dense layer.

    Raises:
        DataReconError: a bad model directory or known initialisation; a known n larger than the layer allows.
    """
    meta = read_model_meta(model_dir)
    target = Target.from_model_dir(model_dir, dtype=torch.float64)
    mean = load_tensors(Path(model_dir) / EXTRAS)["input_mean"].to(torch.float64)
    return setup_of(target, knowledge=knowledge, meta=meta, mean=mean)


def model_task(meta: dict[str, Any], data_dir: str | Path | None) -> Any:
    """The task a model directory's data spec names, checked against the data it was trained on."""
    task = load_task(DataSpec.model_validate(meta["data"]), data_dir=data_dir)
    check_fingerprint(task, meta.get("data_fingerprint"), where="the model", splits=("train",))
    return task


def training_config(meta: dict[str, Any]) -> TrainConfig:
    """The model's recorded training config (the recipe reference models repeat).

    Raises:
        DataReconError: a model directory that records no training config.
    """
    training = dict(meta.get("training") or {})
    if not training:
        raise DataReconError("reference models repeat the recipe a model directory records, and this one records "
                             "none; pass --references 0")
    training.pop("config_hash", None)
    return build_config(TrainConfig, training, where="the model's recorded training config")


@dataclass(frozen=True)
class MembershipCase:
    """What one evaluation measures: the model as the attacker sees it, the candidates, how reference models train.

    Attributes:
        setup: the target, its subspace analysis and input shift (:class:`MembershipSetup`).
        candidates: members, non-members, the half-in pool and the population
            (:class:`~datarecon.experiments.membership.candidates.Candidates`).
        trainer: how a reference model trains (:class:`~datarecon.experiments.membership.trainers.RecipeTrainer` for
            a model directory, :class:`~datarecon.experiments.membership.trainers.FunctionTrainer` for a user's
            model), or None.
        record: what the membership folder records of the model
            (:func:`~datarecon.experiments.membership.folder.target_record`).
        no_trainer: why there is no trainer (said where reference models were asked for).
        knowledge: the attacker's knowledge (the subspace signal of the pseudo-targets is made the same way).
    """

    setup: MembershipSetup
    candidates: Candidates
    trainer: Trainer | None
    record: dict[str, Any]
    no_trainer: str = ""
    knowledge: KnowledgeSettings = KnowledgeSettings()
