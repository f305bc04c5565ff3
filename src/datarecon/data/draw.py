"""Which images of the selected pool a model trains on: all of them, n drawn across the classes, or named ones.

``DataSpec.n_per_class`` selects a *pool* of ``n_per_class`` images of every task class (the rules of
:mod:`datarecon.data.selection`); by default the model trains on the whole pool. Two fields train it
on part of the pool instead, any n ≥ 1, the task (and so a pretrained read-out) unchanged:

* ``n_train`` = n: the first n images of the pool's **draw order** (:func:`draw_order`): the classes
  in an order drawn from ``seed``, then round-robin over them, each class's images in an order drawn
  from the same generator. So n ≤ k images come from n different classes, larger n spread the
  images evenly (class counts differ by at most one), and the draw of n is the first n of the draw
  of n + 1 (nested, for a fixed seed).
* ``train_indices``: the images themselves, as indices into the dataset's train split; each must
  lie in the pool. A training records its draw this way (``datarecon train`` writes the drawn
  indices beside ``n_train`` into model.json's data spec); given with ``n_train``, the draw must
  give exactly these images, or the data are refused.

Partition and held-out images are selected as without the fields (per class, outside the pool).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from datarecon.errors import DataReconError

__all__ = ["draw_order", "pick_training", "train_count"]


def draw_order(classes: np.ndarray, *, seed: int) -> np.ndarray:
    """The pool's positions in draw order.

    One ``torch.Generator`` seeded with ``seed`` draws, in turn, a permutation of the classes present
    and, for each class in increasing class index, a permutation of its images; the order then walks
    the classes round-robin in the drawn class order, taking each class's next image.

    Args:
        classes: (P,) int task class of every pool image (any order; P ≥ 0).
        seed: the draw's seed.

    Returns:
        (P,) int64 permutation of ``range(P)``.
    """
    classes = np.asarray(classes, dtype=np.int64)
    g = torch.Generator().manual_seed(int(seed))
    present = np.unique(classes)
    class_order = present[torch.randperm(len(present), generator=g).numpy()]
    members = {}
    for c in present:
        pos = np.flatnonzero(classes == c)
        members[int(c)] = pos[torch.randperm(len(pos), generator=g).numpy()]
    rounds = max((len(p) for p in members.values()), default=0)
    order = [members[int(c)][r] for r in range(rounds) for c in class_order if r < len(members[int(c)])]
    return np.asarray(order, dtype=np.int64)


def pick_training(pool: np.ndarray, classes: np.ndarray, *, n_train: int | None,
                  train_indices: tuple[int, ...] | None, seed: int, where: str) -> np.ndarray:
    """The training images among the pool: all, the first ``n_train`` of the draw, or ``train_indices``.

    Args:
        pool: (P,) sorted int64 dataset indices of the pool (``n_per_class`` per task class).
        classes: (P,) their task classes.
        n_train: images to draw (None: not drawn).
        train_indices: the images named (None: none named); with ``n_train``, what the draw must give.
        seed: the draw's seed (``DataSpec.seed``).
        where: the pool's description for messages (e.g. "the 20 images n_per_class 2 selects").

    Returns:
        Sorted int64 dataset indices, a subset of ``pool``.

    Raises:
        DataReconError: ``n_train`` beyond the pool, a named index outside it, or a draw that is not the
            images named (one line each, with the fix).
    """
    if n_train is None and train_indices is None:
        return pool
    if n_train is not None and n_train > len(pool):
        raise DataReconError(f"n_train {n_train} exceeds {where}; lower n_train (--n-train) or raise n_per_class "
                             "(--n-per-class)")
    if n_train is not None:
        drawn = np.sort(pool[draw_order(classes, seed=seed)[:n_train]])
        if train_indices is not None and sorted(train_indices) != drawn.tolist():
            raise DataReconError(f"the training images named ({_listed(sorted(train_indices))}) are not the draw "
                                 f"of n_train {n_train} with seed {seed} ({_listed(drawn.tolist())}); pass "
                                 "train_indices alone to train on the images named, or n_train alone for its draw "
                                 "(a model directory's model.json that records both was changed after its "
                                 "training: train the model again)")
        return drawn.astype(np.int64)
    named = np.asarray(sorted(train_indices or ()), dtype=np.int64)
    outside = np.setdiff1d(named, pool)
    if outside.size:
        raise DataReconError(f"train index {int(outside[0])} is not among {where} ({_listed(pool.tolist())}); "
                             "pick train_indices among them, or raise n_per_class (--n-per-class) so the pool holds it")
    return named


def train_count(data: Mapping[str, Any], *, num_classes: int) -> int:
    """How many images a data spec (a model.json ``data`` mapping) trains on: the images named, else ``n_train``,
    else ``n_per_class`` · ``num_classes`` (0 for a spec without ``n_per_class``)."""
    if data.get("train_indices"):
        return len(data["train_indices"])
    if data.get("n_train"):
        return int(data["n_train"])
    return int(data.get("n_per_class", 0) or 0) * num_classes


def _listed(values: list[int], limit: int = 12) -> str:
    """``values`` as text, the first ``limit`` and a count of the rest."""
    head = ", ".join(str(v) for v in values[:limit])
    return head + (f", ... ({len(values) - limit} more)" if len(values) > limit else "")
