"""Learning tasks: which dataset classes take part and what label each gets.

A task string is ``name`` or ``name:argument``. Registered tasks (:data:`TASKS`):

* ``vehicles-animals`` (CIFAR-10 only), binary, as in Haim et al. 2022:
  vehicles {airplane, automobile, ship, truck} -> +1, animals {bird, cat,
  deer, dog, frog, horse} -> -1.
* ``odd-even`` (MNIST, digits), binary: odd digits -> +1, even digits -> -1.
* ``classes:a,b,c`` (any dataset), multiclass over the listed classes, label
  i for the i-th listed class (0..k-1, k >= 2). Classes are given by name
  ("cat,dog") or by index ("3,5").
* ``pair:a,b`` (any dataset), binary over two listed classes: a -> -1,
  b -> +1 (one ±1 output: Haim et al.'s setting from two chosen classes).
* ``all`` (any dataset), 10-class multiclass with the dataset's own labels.

Binary convention: a binary task has two task classes; task class 0 is the
-1 side and task class 1 the +1 side, i.e. ``y = 2 * class_index - 1`` and
``class_names[(y + 1) / 2]`` names a label. Binary labels are float32 in
{-1., +1.}; multiclass labels are int64 in [0, k).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from datarecon.data.datasets import DATASETS
from datarecon.errors import DataReconError
from datarecon.registry import Registry

LabelKind = Literal["binary", "multiclass"]


@dataclass(frozen=True)
class ResolvedTask:
    """A task applied to one dataset.

    Attributes:
        task: the task string as given (e.g. "classes:cat,dog").
        dataset: dataset name.
        label_kind: "binary" or "multiclass".
        groups: for each task class, the dataset labels it is made of
            (binary: (negative side, positive side)).
        class_names: one name per task class.
    """

    task: str
    dataset: str
    label_kind: LabelKind
    groups: tuple[tuple[int, ...], ...]
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        """Number of task classes (2 for binary tasks)."""
        return len(self.groups)

    def task_class_of(self, labels: np.ndarray) -> np.ndarray:
        """Task-class index (0..k-1) of each dataset label, -1 where not in the task."""
        lut = np.full(256, -1, dtype=np.int64)
        for i, group in enumerate(self.groups):
            lut[list(group)] = i
        return lut[np.asarray(labels, dtype=np.int64)]

    def encode(self, task_class: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Model labels from task-class indices.

        Returns:
            binary: float32 in {-1., +1.}; multiclass: int64 in [0, k).
        """
        t = torch.as_tensor(np.asarray(task_class), dtype=torch.int64)
        if self.label_kind == "binary":
            return (2 * t - 1).to(torch.float32)
        return t


@dataclass(frozen=True)
class TaskDef:
    """A registered task.

    Attributes:
        name: registry key (the part before ":").
        usage: how to write it, for messages ("classes:<c1>,<c2>,...").
        description: one line.
        datasets: datasets it fits; None means any.
        build: ``(argument, dataset, class_names) -> (label_kind, groups, task class names)``.
    """

    name: str
    usage: str
    description: str
    datasets: tuple[str, ...] | None
    build: Callable[[str | None, str, tuple[str, ...]],
                    tuple[LabelKind, tuple[tuple[int, ...], ...], tuple[str, ...]]]
    takes_argument: bool = False

    def fits(self, dataset: str) -> bool:
        """Whether the task applies to ``dataset``."""
        return self.datasets is None or dataset in self.datasets


TASKS: Registry[TaskDef] = Registry("task")

CIFAR_VEHICLES = ("airplane", "automobile", "ship", "truck")


def _vehicles_animals(arg, dataset, names):
    vehicles = tuple(names.index(n) for n in CIFAR_VEHICLES)
    animals = tuple(i for i in range(len(names)) if i not in vehicles)
    return "binary", (animals, vehicles), ("animal", "vehicle")


def _odd_even(arg, dataset, names):
    evens = tuple(i for i in range(len(names)) if i % 2 == 0)
    odds = tuple(i for i in range(len(names)) if i % 2 == 1)
    return "binary", (evens, odds), ("even", "odd")


def _class_indices(arg, dataset, names, *, task: str) -> list[int]:
    """Dataset class indices of a comma-separated list of class names or indices (>= 2, distinct)."""
    items = [s.strip() for s in (arg or "").split(",")]
    if len(items) < 2 or any(not s for s in items):
        raise DataReconError(
            f"task '{task}:{arg or ''}' needs at least two comma-separated classes, "
            f"e.g. {task}:{names[0]},{names[1]}"
        )
    idx: list[int] = []
    for s in items:
        if s in names:
            i = names.index(s)
        elif s.isdigit() and int(s) < len(names):
            i = int(s)
        else:
            raise DataReconError(
                f"unknown class {s!r} for {dataset}; valid classes: {', '.join(names)} "
                f"(or indices 0..{len(names) - 1})"
            )
        if i in idx:
            raise DataReconError(f"class {s!r} is listed twice in task '{task}:{arg}'")
        idx.append(i)
    return idx


def _classes(arg, dataset, names):
    idx = _class_indices(arg, dataset, names, task="classes")
    return "multiclass", tuple((i,) for i in idx), tuple(names[i] for i in idx)


def _pair(arg, dataset, names):
    idx = _class_indices(arg, dataset, names, task="pair")
    if len(idx) != 2:
        raise DataReconError(f"task 'pair:{arg}' takes exactly two classes (the -1 class, then the +1 class), "
                             f"e.g. pair:{names[3]},{names[5]}; use classes:... for more")
    return "binary", ((idx[0],), (idx[1],)), (names[idx[0]], names[idx[1]])


def _all(arg, dataset, names):
    return "multiclass", tuple((i,) for i in range(len(names))), tuple(names)


TASKS.register("vehicles-animals", TaskDef(
    "vehicles-animals", "vehicles-animals",
    "binary: vehicles (airplane, automobile, ship, truck) +1, animals -1",
    ("cifar10",), _vehicles_animals))
TASKS.register("odd-even", TaskDef(
    "odd-even", "odd-even", "binary: odd digits +1, even digits -1",
    ("mnist", "digits"), _odd_even))
TASKS.register("classes", TaskDef(
    "classes", "classes:<c1>,<c2>,...",
    "multiclass over the listed classes, labels 0..k-1 in the listed order",
    None, _classes, takes_argument=True))
TASKS.register("pair", TaskDef(
    "pair", "pair:<negative>,<positive>",
    "binary over two listed classes: the first -1, the second +1 (one output, Haim's setting)",
    None, _pair, takes_argument=True))
TASKS.register("all", TaskDef("all", "all", "10-class multiclass", None, _all))


def valid_tasks(dataset: str) -> list[str]:
    """Usages of the tasks that fit ``dataset``, sorted."""
    return [TASKS.get(n).usage for n in TASKS.names() if TASKS.get(n).fits(dataset)]


def resolve_task(dataset: str, task: str) -> ResolvedTask:
    """Apply the task string ``task`` to ``dataset`` (no data is read).

    Raises:
        DataReconError: unknown dataset or task, a task that does not fit the
            dataset, or a malformed argument; the message lists valid choices.
    """
    info = DATASETS.get(dataset)
    name, sep, arg = task.partition(":")
    tdef = TASKS.get(name.strip())
    if not tdef.fits(dataset):
        raise DataReconError(
            f"task {task!r} does not fit dataset {dataset!r}; valid tasks for {dataset}: "
            f"{', '.join(valid_tasks(dataset))}"
        )
    if tdef.takes_argument and not sep:
        raise DataReconError(f"task {name!r} needs an argument: write {tdef.usage}")
    if not tdef.takes_argument and sep:
        raise DataReconError(f"task {name!r} takes no argument: write {tdef.usage}")
    kind, groups, names = tdef.build(arg if sep else None, dataset, info.class_names)
    return ResolvedTask(task=task, dataset=dataset, label_kind=kind, groups=groups,
                        class_names=names)
