"""Task strings: which classes, which labels, and the errors for misuse."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from datarecon.data import TASKS, resolve_task, valid_tasks
from datarecon.errors import DataReconError


def test_registry_names():
    assert TASKS.names() == ["all", "classes", "odd-even", "pair", "vehicles-animals"]


def test_vehicles_animals():
    t = resolve_task("cifar10", "vehicles-animals")
    assert t.label_kind == "binary" and t.num_classes == 2
    assert t.class_names == ("animal", "vehicle")
    labels = np.arange(10)
    y = t.encode(t.task_class_of(labels))
    assert y.dtype == torch.float32
    # airplane, automobile, ship, truck -> +1; the six animals -> -1
    assert y.tolist() == [1, 1, -1, -1, -1, -1, -1, -1, 1, 1]


@pytest.mark.parametrize("dataset", ["mnist", "digits"])
def test_odd_even(dataset):
    t = resolve_task(dataset, "odd-even")
    y = t.encode(t.task_class_of(np.arange(10)))
    assert y.tolist() == [-1, 1, -1, 1, -1, 1, -1, 1, -1, 1]
    assert t.class_names == ("even", "odd")


def test_classes_by_name_and_index():
    t = resolve_task("cifar10", "classes:cat,dog,ship")
    assert t.label_kind == "multiclass" and t.num_classes == 3
    assert t.class_names == ("cat", "dog", "ship")
    tc = t.task_class_of(np.arange(10))
    assert tc.tolist() == [-1, -1, -1, 0, -1, 1, -1, -1, 2, -1]
    assert t.encode(tc[tc >= 0]).dtype == torch.int64
    t2 = resolve_task("cifar10", "classes:3, 5")
    assert t2.class_names == ("cat", "dog")
    t3 = resolve_task("mnist", "classes:7,1")
    assert t3.task_class_of(np.array([1, 7, 2])).tolist() == [1, 0, -1]


def test_all():
    t = resolve_task("mnist", "all")
    assert t.num_classes == 10 and t.label_kind == "multiclass"
    assert t.task_class_of(np.arange(10)).tolist() == list(range(10))


def test_unknown_task_lists_valid_names():
    with pytest.raises(DataReconError) as err:
        resolve_task("mnist", "parity")
    assert str(err.value) == (
        "unknown task 'parity'; valid names: all, classes, odd-even, pair, vehicles-animals"
    )


def test_task_not_fitting_dataset():
    with pytest.raises(DataReconError) as err:
        resolve_task("mnist", "vehicles-animals")
    assert str(err.value) == (
        "task 'vehicles-animals' does not fit dataset 'mnist'; valid tasks for mnist: "
        "all, classes:<c1>,<c2>,..., odd-even, pair:<negative>,<positive>"
    )
    assert valid_tasks("cifar10") == ["all", "classes:<c1>,<c2>,...", "pair:<negative>,<positive>", "vehicles-animals"]


@pytest.mark.parametrize("task,msg", [
    ("classes", "task 'classes' needs an argument: write classes:<c1>,<c2>,..."),
    ("classes:cat", "needs at least two comma-separated classes, e.g. classes:airplane,automobile"),
    ("classes:cat,,dog", "needs at least two comma-separated classes"),
    ("classes:cat,zebra", "unknown class 'zebra' for cifar10; valid classes: airplane, automobile"),
    ("classes:cat,12", "unknown class '12'"),
    ("classes:cat,3", "class '3' is listed twice"),
    ("all:5", "task 'all' takes no argument: write all"),
], ids=["no-arg", "one-class", "empty-item", "bad-name", "bad-index", "duplicate", "extra-arg"])
def test_bad_task_strings(task, msg):
    with pytest.raises(DataReconError, match=re.escape(msg)):
        resolve_task("cifar10", task)


def test_pair_is_binary_over_two_chosen_classes():
    """Haim's setting (one ±1 output) from any two classes: the first listed is -1, the second +1."""
    t = resolve_task("cifar10", "pair:cat,dog")
    assert t.label_kind == "binary" and t.groups == ((3,), (5,)) and t.class_names == ("cat", "dog")
    assert t.task_class_of(np.arange(10)).tolist() == [-1, -1, -1, 0, -1, 1, -1, -1, -1, -1]
    assert t.encode(np.array([0, 1])).tolist() == [-1.0, 1.0]
    assert resolve_task("mnist", "pair:5,3").groups == ((5,), (3,))


def test_pair_task_trains_a_one_output_model():
    from datarecon.data import DataSpec, load_task

    task = load_task(DataSpec(dataset="digits", task="pair:3,5", n_per_class=4, n_heldout_per_class=0,
                              n_partition_per_class=0))
    assert task.label_kind == "binary" and task.train.y.dtype == torch.float32
    assert sorted(set(task.train.y.tolist())) == [-1.0, 1.0] and len(task.train) == 8
