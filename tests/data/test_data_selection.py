"""DataSpec, deterministic selection, splits and normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from datarecon.data import DataSpec, Normalisation, load_dataset, load_task, select_indices
from datarecon.errors import DataReconError


def _spec(**kw) -> DataSpec:
    base = dict(dataset="cifar10", task="vehicles-animals", n_per_class=25)
    base.update(kw)
    return DataSpec(**base)


# --------------------------------------------------------------------- DataSpec

def test_spec_defaults_and_frozen():
    s = _spec()
    # held-out: twice n_per_class, as many as the attacks' default m = 2n candidates (issue 25, item 11)
    assert (s.n_partition_per_class, s.n_heldout_per_class) == (25, 50)
    assert (s.selection, s.seed, s.normalisation) == ("first", 0, "unit-minus-mean")
    assert _spec(n_partition_per_class=0, n_heldout_per_class=7).n_heldout_per_class == 7
    with pytest.raises(ValidationError):
        s.n_per_class = 3  # frozen
    assert DataSpec.model_validate(s.model_dump()) == s


@pytest.mark.parametrize("bad", [dict(n_per_class=0), dict(n_per_class=-5),
                                 dict(selection="last"), dict(normalisation="zscore"),
                                 dict(n_heldout_per_class=-1), dict(colour=True)],
                         ids=["n0", "n-neg", "selection", "normalisation", "heldout-neg", "extra"])
def test_spec_rejects(bad):
    with pytest.raises(ValidationError):
        _spec(**bad)


def test_spec_resolved_task_errors():
    with pytest.raises(DataReconError, match="valid names: cifar10, digits, mnist"):
        _spec(dataset="svhn").resolved_task()
    with pytest.raises(DataReconError, match="valid tasks for mnist"):
        _spec(dataset="mnist").resolved_task()


# --------------------------------------------------------------------- selection

def _reference_first_k(labels: np.ndarray, groups, n: int) -> list[int]:
    """Haim et al.'s balancing loop: walk the data in order, keep while below quota."""
    count = [0] * len(groups)
    kept = []
    for i, lab in enumerate(labels.tolist()):
        for g, members in enumerate(groups):
            if lab in members and count[g] < n:
                count[g] += 1
                kept.append(i)
    return kept


def test_first_k_matches_reference_loop(data_dir):
    data = load_task(_spec(n_per_class=250, n_heldout_per_class=250), data_dir=data_dir)
    raw = load_dataset("cifar10", split="train", data_dir=data_dir)
    groups = [(2, 3, 4, 5, 6, 7), (0, 1, 8, 9)]
    assert data.train.indices.tolist() == _reference_first_k(raw.labels, groups, 250)
    assert len(data.train) == 500
    assert data.train.indices.dtype == torch.int64
    # partition = the next 250 of each side
    both = _reference_first_k(raw.labels, groups, 500)
    assert data.partition.indices.tolist() == sorted(set(both) - set(data.train.indices.tolist()))
    test = load_dataset("cifar10", split="test", data_dir=data_dir)
    assert data.heldout.indices.tolist() == _reference_first_k(test.labels, groups, 250)
    sources = (data.train.source, data.partition.source, data.heldout.source)
    assert sources == ("train", "train", "test")


def test_split_contents(data_dir):
    data = load_task(_spec(), data_dir=data_dir)
    raw = load_dataset("cifar10", split="train", data_dir=data_dir)
    idx = data.train.indices.numpy()
    assert torch.equal(data.train.x, torch.from_numpy(raw.images[idx].astype(np.float32)) / 255)
    assert data.train.x.dtype == torch.float32 and data.train.x.shape == (50, 3, 32, 32)
    assert data.train.y.dtype == torch.float32
    vehicles = np.isin(raw.labels[idx], [0, 1, 8, 9])
    expected_y = torch.from_numpy(np.where(vehicles, 1.0, -1.0).astype(np.float32))
    assert torch.equal(data.train.y, expected_y)
    assert torch.equal(data.train.source_labels, torch.from_numpy(raw.labels[idx]))
    assert (data.train.y == 1).sum() == 25 and (data.train.y == -1).sum() == 25
    assert data.input_shape == (3, 32, 32) and data.num_classes == 2
    assert data.label_kind == "binary" and data.class_names == ("animal", "vehicle")


@pytest.mark.parametrize("selection", ["first", "random"])
def test_disjoint_and_balanced(data_dir, selection):
    data = load_task(_spec(dataset="mnist", task="classes:3,8,1", n_per_class=40,
                           n_partition_per_class=30, n_heldout_per_class=20,
                           selection=selection, seed=3), data_dir=data_dir)
    tr, pa = set(data.train.indices.tolist()), set(data.partition.indices.tolist())
    assert len(tr) == 120 and len(pa) == 90 and not tr & pa
    assert len(data.heldout) == 60
    for split, n in ((data.train, 40), (data.partition, 30), (data.heldout, 20)):
        assert split.y.dtype == torch.int64
        assert torch.bincount(split.y).tolist() == [n, n, n]
        assert torch.equal(split.indices, torch.sort(split.indices).values)
        # label i is the i-th listed class
        assert torch.equal(torch.tensor([3, 8, 1])[split.y], split.source_labels)
    assert data.class_names == ("3", "8", "1") and data.num_classes == 3


def test_random_deterministic_by_seed(data_dir):
    a = load_task(_spec(selection="random", seed=7), data_dir=data_dir)
    b = load_task(_spec(selection="random", seed=7), data_dir=data_dir)
    c = load_task(_spec(selection="random", seed=8), data_dir=data_dir)
    for name in ("train", "partition", "heldout"):
        assert torch.equal(getattr(a, name).indices, getattr(b, name).indices)
        assert torch.equal(getattr(a, name).x, getattr(b, name).x)
    assert not torch.equal(a.train.indices, c.train.indices)
    first = load_task(_spec(), data_dir=data_dir)
    assert not torch.equal(a.train.indices, first.train.indices)
    # the partition size never changes the training set
    d = load_task(_spec(selection="random", seed=7, n_partition_per_class=3), data_dir=data_dir)
    assert torch.equal(a.train.indices, d.train.indices)
    assert set(d.partition.indices.tolist()) <= set(a.partition.indices.tolist())


def test_select_indices_pure():
    task_class = np.array([0, 1, -1, 0, 1, 0, 1, 0])
    tr, pa = select_indices(task_class, [2, 1], num_classes=2)
    assert tr.tolist() == [0, 1, 3, 4] and pa.tolist() == [5, 6]
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    r1 = select_indices(task_class, [2, 1], num_classes=2, selection="random", generator=g1)
    r2 = select_indices(task_class, [2, 1], num_classes=2, selection="random", generator=g2)
    assert all(np.array_equal(a, b) for a, b in zip(r1, r2, strict=True))
    assert not set(r1[0]) & set(r1[1]) and 2 not in set(r1[0]) | set(r1[1])


def test_too_many_requested(data_dir):
    with pytest.raises(DataReconError) as err:
        load_task(_spec(dataset="digits", task="odd-even", n_per_class=700), data_dir=data_dir)
    assert str(err.value) == (
        "n_per_class=700 + n_partition_per_class=700 needs 1400 images of class 'even' from "
        "digits train, but only 746 are available; lower the counts"
    )
    with pytest.raises(DataReconError, match=r"n_heldout_per_class=200 needs 200 images of class "
                                             r"'0' from digits test, but only 27 are available"):
        load_task(_spec(dataset="digits", task="all", n_per_class=10, n_heldout_per_class=200))


def test_no_heldout_skips_test_split(data_dir):
    data = load_task(_spec(dataset="digits", task="all", n_per_class=5, n_heldout_per_class=0))
    assert data.heldout.x.shape == (0, 1, 8, 8) and data.heldout.y.dtype == torch.int64
    assert len(data.heldout) == 0
    assert set(data.index_tensors()) == {"train_indices", "partition_indices", "heldout_indices"}


# --------------------------------------------------------------------- normalisation

def test_normalisation_unit_minus_mean(data_dir):
    data = load_task(_spec(), data_dir=data_dir)
    norm = data.normalisation
    assert norm.kind == "unit-minus-mean" and norm.mean.shape == (3, 32, 32)
    assert torch.allclose(norm.mean, data.train.x.double().mean(0).float())
    z = norm.to_model(data.train.x)
    assert torch.allclose(z.mean(0), torch.zeros(3, 32, 32), atol=1e-6)
    assert torch.allclose(norm.to_display(z), data.train.x, atol=1e-6)
    lo, hi = norm.model_range()
    assert torch.all(z >= lo - 1e-6) and torch.all(z <= hi + 1e-6)
    assert torch.allclose(hi - lo, torch.ones(3, 32, 32))
    rebuilt = Normalisation.from_mean("unit-minus-mean", norm.mean.clone())
    assert torch.equal(rebuilt.to_model(data.heldout.x), norm.to_model(data.heldout.x))
    # one image (C, H, W) works too
    assert torch.equal(norm.to_model(data.train.x[0]), z[0])


def test_normalisation_unit(data_dir):
    data = load_task(_spec(normalisation="unit"), data_dir=data_dir)
    norm = data.normalisation
    assert torch.equal(norm.mean, torch.zeros(3, 32, 32))
    assert torch.equal(norm.to_model(data.train.x), data.train.x)
    lo, hi = norm.model_range()
    assert torch.equal(lo, torch.zeros(3, 32, 32)) and torch.equal(hi, torch.ones(3, 32, 32))


def test_normalisation_misuse():
    with pytest.raises(DataReconError, match="unknown normalisation 'zscore'"):
        Normalisation.from_mean("zscore", torch.zeros(1, 2, 2))
    with pytest.raises(DataReconError, match=r"must be a \(C, H, W\) tensor, got \(4,\)"):
        Normalisation.from_mean("unit-minus-mean", torch.zeros(4))
    with pytest.raises(DataReconError, match="'unit' needs a zero mean"):
        Normalisation.from_mean("unit", torch.ones(1, 2, 2))
    norm = Normalisation.from_mean("unit-minus-mean", torch.zeros(1, 2, 2))
    with pytest.raises(DataReconError,
                       match=r"do not match the normalisation's \(C, H, W\) = \(1, 2, 2\)"):
        norm.to_model(torch.zeros(3, 1, 3, 3))
