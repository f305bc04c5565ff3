"""The members, non-members and population samples of a membership evaluation, and LiRA's half-in pool among them.

A model directory's members are its training images; its non-members are drawn from the unused part of its
training split (never the images of the pretrained model it was fine-tuned from), its population samples (RMIA's z)
from the test split (:func:`draw_candidates`). A user's own model gives them as tensors
(:func:`assemble_candidates`). The reference models train on the **half-in pool**, the members and as many
non-members of each class (:func:`half_in_pool`), each on a random half of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datarecon.data import DataSpec
from datarecon.data.selection import draw_outside
from datarecon.errors import DataReconError
from datarecon.experiments.membership.settings import MembershipSettings
from datarecon.models.pretrained import load_recorded_pretrained

__all__ = ["Candidates", "assemble_candidates", "draw_candidates", "half_in_pool", "pretraining_images",
           "task_classes"]


@dataclass(frozen=True)
class Candidates:
    """The members and non-members of an evaluation, the half-in pool and the population samples of RMIA.

    Attributes:
        x: (N, C, H, W) images, members first (display images of a model directory, the inputs of a user's model);
            y: (N,) labels; classes: (N,) task-class index.
        is_member: (N,) bool.
        indices: (N,) int64 index of each image in its split (its position in the given files for a user's model).
        eligible: (N,) bool: the half-in pool, the members and as many non-members of each class, which the
            reference models train on (:func:`half_in_pool`).
        per_class: task class → how many images of it each reference model trains on (the members' count).
        z_x, z_y: (M, ...) population samples (test split), z_indices (M,).
        provenance: JSON-ready: where each set came from (sources, counts, what was available).
        shortfall: why the half-in pool could not hold as many non-members as members of a class ("" when it can).
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: torch.Tensor
    is_member: np.ndarray
    indices: torch.Tensor
    eligible: np.ndarray
    per_class: dict[int, int]
    z_x: torch.Tensor
    z_y: torch.Tensor
    z_indices: torch.Tensor
    provenance: dict[str, Any]
    shortfall: str = ""


def task_classes(y: torch.Tensor) -> torch.Tensor:
    """The task-class index of labels: ±1 → 0/1, class indices as they are."""
    return (y > 0).to(torch.int64) if y.dtype.is_floating_point else y.to(torch.int64).clone()


def half_in_pool(classes: torch.Tensor, is_member: np.ndarray, *, seed: int) -> tuple[np.ndarray, dict[int, int], str]:
    """LiRA's half-in pool: every member and, for each class, as many non-members as it has members (a seeded draw),
    so that reference models trained on the members' count of each class from it hold each of these candidates with
    probability one half.

    Returns:
        ((N,) bool pool, class → the members' count, why a class has fewer non-members than members or "").
    """
    c = np.asarray(classes, dtype=np.int64)
    mem = np.asarray(is_member, dtype=bool)
    pool = mem.copy()
    per_class = {int(k): int(((c == k) & mem).sum()) for k in np.unique(c[mem])}
    gen = torch.Generator().manual_seed(int(seed) + 2)
    short = []
    for k, m in per_class.items():
        non = np.flatnonzero((c == k) & ~mem)
        pick = non[torch.randperm(non.size, generator=gen).numpy()[:m]] if non.size else non
        pool[pick] = True
        if non.size < m:
            short.append(f"class {k} has {non.size} non-members for {m} members")
    why = ("the half-in pool needs as many non-members as members of each class, and " + "; ".join(short) +
           "; draw more --nonmembers") if short else ""
    return pool, per_class, why


def pretraining_images(meta: dict[str, Any], dataset: str) -> torch.Tensor | None:
    """The training-split indices the pretrained model of a fine-tuning trained on (same dataset), or None: they
    shaped the weights too, so they are no non-members of the fine-tuned model."""
    pre = meta.get("pretrained") or {}
    if not pre.get("path") or (pre.get("data") or {}).get("dataset") != dataset:
        return None
    try:
        seen = load_recorded_pretrained(meta).indices.get("train")
    except DataReconError as exc:
        raise DataReconError(f"the model was fine-tuned from {pre['path']}, whose training images cannot be read "
                             f"({exc}); they must be left out of the non-members: restore that directory") from None
    return None if seen is None else seen.to(torch.int64)


def assemble_candidates(members: tuple[torch.Tensor, torch.Tensor], nonmembers: tuple[torch.Tensor, torch.Tensor],
                        population: tuple[torch.Tensor, torch.Tensor], *, indices: tuple[torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor],
                        provenance: dict[str, Any], seed: int) -> Candidates:
    """Candidates from members, non-members and population samples (each (x, y)), with the half-in pool drawn."""
    y = torch.cat([members[1], nonmembers[1]])
    classes = task_classes(y)
    is_member = np.r_[np.ones(members[0].shape[0], bool), np.zeros(nonmembers[0].shape[0], bool)]
    eligible, per_class, shortfall = half_in_pool(classes, is_member, seed=seed)
    prov = {**provenance, "half_in": {"count": int(eligible.sum()), "members": int(members[0].shape[0]),
                                      "nonmembers": int(eligible.sum()) - int(members[0].shape[0]),
                                      "source": "the members and as many non-members of each class (seed "
                                                f"{seed + 2}), the pool the reference models train on"}}
    return Candidates(x=torch.cat([members[0], nonmembers[0]]), y=y, classes=classes, is_member=is_member,
                      indices=torch.cat([indices[0], indices[1]]), eligible=eligible, per_class=per_class,
                      z_x=population[0], z_y=population[1], z_indices=indices[2], provenance=prov, shortfall=shortfall)


def draw_candidates(meta: dict[str, Any], task: Any, settings: MembershipSettings, *,
                    data_dir: str | Path | None) -> Candidates:
    """The model's training images (members), ``settings.nonmembers`` images of the same classes from the unused
    part of its training split (non-members), the half-in pool among them, and ``settings.population`` test-split
    images (RMIA's population).

    Raises:
        DataReconError: no non-member is left in the training split.
    """
    spec = DataSpec.model_validate(meta["data"])
    members = task.train
    seen = pretraining_images(meta, spec.dataset)
    exclude = members.indices if seen is None else torch.cat([members.indices, seen])
    non, available = draw_outside(spec, split="train", exclude=exclude, count=settings.nonmembers,
                                  seed=settings.seed, data_dir=data_dir)
    if len(non) == 0:
        raise DataReconError(f"every {spec.dataset} training image of the task's classes trained the model: no "
                             "non-member is left to measure against")
    pop, pop_available = draw_outside(spec, split="test", count=settings.population, seed=settings.seed + 1,
                                      data_dir=data_dir)
    prov = {
        "members": {"count": len(members), "source": f"the model's {len(members)} training images (its data spec)"},
        "nonmembers": {"count": len(non), "available": available, "requested": settings.nonmembers,
                       "source": f"drawn uniformly (seed {settings.seed}) from the {available} {spec.dataset} "
                                 "training-split images of the task's classes that did not train the model"
                                 + (" (nor the pretrained model it was fine-tuned from)" if seen is not None else "")},
        "population": {"count": len(pop), "available": pop_available,
                       "source": f"drawn uniformly (seed {settings.seed + 1}) from the {pop_available} {spec.dataset} "
                                 "test-split images of the task's classes (never a candidate, never in a reference "
                                 "model's training set)"},
    }
    return assemble_candidates((members.x, members.y), (non.x, non.y), (pop.x, pop.y),
                               indices=(members.indices, non.indices, pop.indices), provenance=prov,
                               seed=settings.seed)
