"""Training on part of the selected pool: n images drawn across the classes (``n_train``) or named (``train_indices``)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from datarecon.data import DataSpec, load_task
from datarecon.data.draw import draw_order, pick_training, train_count
from datarecon.errors import DataReconError

POOL = {"dataset": "cifar10", "task": "all", "n_per_class": 2, "n_heldout_per_class": 4, "normalisation": "unit"}


def _reference_order(classes: np.ndarray, seed: int) -> list[int]:
    """The documented rule written as a plain loop: a class order, then each class's images, from one generator;
    then rounds over the classes in that order, one image of each class that has one left."""
    g = torch.Generator().manual_seed(seed)
    present = sorted(set(classes.tolist()))
    perm = torch.randperm(len(present), generator=g).tolist()
    class_order = [present[i] for i in perm]
    queues = {}
    for c in present:
        mine = [i for i in range(len(classes)) if classes[i] == c]
        queues[c] = [mine[j] for j in torch.randperm(len(mine), generator=g).tolist()]
    out: list[int] = []
    while any(queues.values()):
        for c in class_order:
            if queues[c]:
                out.append(queues[c].pop(0))
    return out


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_draw_order_follows_its_rule_and_spreads_the_classes(seed: int) -> None:
    classes = np.repeat(np.arange(10), 3)[np.random.default_rng(seed).permutation(30)]
    order = draw_order(classes, seed=seed)
    assert order.tolist() == _reference_order(classes, seed)
    assert sorted(order.tolist()) == list(range(30))  # a permutation
    for n in range(1, 31):  # every prefix: class counts differ by at most one; n <= 10: n different classes
        counts = Counter(classes[order[:n]].tolist())
        assert max(counts.values()) - (min(counts.values()) if len(counts) == 10 else 0) <= 1
        assert len(counts) == min(n, 10)


def test_the_draw_is_reproducible_and_the_seed_changes_it() -> None:
    classes = np.repeat(np.arange(10), 2)
    assert draw_order(classes, seed=3).tolist() == draw_order(classes, seed=3).tolist()
    assert len({tuple(draw_order(classes, seed=s)[:4].tolist()) for s in range(5)}) > 1
    # unequal classes: a class with fewer images drops out of the later rounds
    uneven = np.array([0, 0, 0, 1])
    order = draw_order(uneven, seed=0)
    assert order.tolist() == _reference_order(uneven, 0) and set(uneven[order[:2]].tolist()) == {0, 1}
    assert draw_order(np.zeros(0, dtype=np.int64), seed=0).tolist() == []


def test_n_train_draws_a_nested_subset_of_the_pool_and_leaves_partition_and_heldout_alone(data_dir) -> None:
    full = load_task(DataSpec(**POOL), data_dir=data_dir)
    earlier: set[int] = set()
    for n in (1, 2, 4, 8, 20):
        part = load_task(DataSpec(**POOL, n_train=n), data_dir=data_dir)
        drawn = part.train.indices.tolist()
        assert len(drawn) == n and drawn == sorted(drawn) and set(drawn) <= set(full.train.indices.tolist())
        assert earlier <= set(drawn)  # nested: the draw of n holds the draw of every smaller n
        earlier = set(drawn)
        labels = part.train.y.tolist()
        assert len(set(labels)) == min(n, 10) and max(Counter(labels).values()) <= -(-n // 10)
        assert torch.equal(part.train.x, full.train.x[torch.isin(full.train.indices, part.train.indices)])
        assert torch.equal(part.partition.indices, full.partition.indices)
        assert torch.equal(part.heldout.indices, full.heldout.indices)
    assert torch.equal(load_task(DataSpec(**POOL, n_train=20), data_dir=data_dir).train.indices, full.train.indices)
    other = load_task(DataSpec(**POOL, n_train=4, seed=1), data_dir=data_dir).train.indices
    assert not torch.equal(other, load_task(DataSpec(**POOL, n_train=4), data_dir=data_dir).train.indices)


def test_named_images_and_a_recorded_draw(data_dir) -> None:
    drawn = load_task(DataSpec(**POOL, n_train=4), data_dir=data_dir).train.indices.tolist()
    # the record of a training (n_train and the indices it drew) loads the same images
    pinned = load_task(DataSpec(**POOL, n_train=4, train_indices=tuple(reversed(drawn))), data_dir=data_dir)
    assert pinned.train.indices.tolist() == drawn
    named = load_task(DataSpec(**POOL, train_indices=(2, 0)), data_dir=data_dir)
    assert named.train.indices.tolist() == [0, 2] and len(named.partition) == 20
    wrong = [i for i in load_task(DataSpec(**POOL), data_dir=data_dir).train.indices.tolist() if i not in drawn][:4]
    with pytest.raises(DataReconError, match=r"^the training images named \(.*\) are not the draw of n_train 4 "
                                             r"with seed 0 .*; pass train_indices alone"):
        load_task(DataSpec(**POOL, n_train=4, train_indices=tuple(wrong)), data_dir=data_dir)
    with pytest.raises(DataReconError, match=r"^train index 12 is not among the 20 images n_per_class 2 selects for "
                                             r"the 10 classes of cifar10 all \(0, 1, .*\); pick train_indices"):
        load_task(DataSpec(**POOL, train_indices=(0, 12)), data_dir=data_dir)
    with pytest.raises(DataReconError, match=r"^n_train 21 exceeds the 20 images n_per_class 2 selects .*; lower "
                                             r"n_train \(--n-train\) or raise n_per_class"):
        load_task(DataSpec(**POOL, n_train=21), data_dir=data_dir)


@pytest.mark.parametrize(("fields", "message"), [
    ({"n_train": 0}, "greater than 0"),
    ({"train_indices": ()}, "at least 1 item"),
    ({"train_indices": (3, -1)}, "greater than or equal to 0"),
    ({"train_indices": (3, 5, 3)}, "train_indices name index 3 more than once; list each image once"),
    ({"n_train": 3, "train_indices": (1, 2)}, "n_train 3 and the 2 train_indices disagree; pass one of them"),
])
def test_bad_subsets_are_refused_by_the_spec(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DataSpec(**POOL, **fields)


def test_unset_fields_leave_the_dump_and_the_count() -> None:
    assert "n_train" not in DataSpec(**POOL).model_dump() and "train_indices" not in DataSpec(**POOL).model_dump()
    assert DataSpec(**POOL, n_train=3).model_dump()["n_train"] == 3
    assert train_count(DataSpec(**POOL).model_dump(), num_classes=10) == 20
    assert train_count(DataSpec(**POOL, n_train=3).model_dump(), num_classes=10) == 3
    assert train_count({**POOL, "n_train": 3, "train_indices": [1, 2, 3]}, num_classes=10) == 3
    assert train_count({"train_indices": [4, 9]}, num_classes=10) == 2 and train_count({}, num_classes=2) == 0


def test_pick_training_without_a_subset_is_the_pool() -> None:
    pool = np.array([3, 8, 11])
    assert pick_training(pool, np.array([0, 1, 0]), n_train=None, train_indices=None, seed=0, where="x") is pool
