"""Deterministic choice of training, partition and held-out images.

A :class:`DataSpec` says which dataset and task, how many images per task
class and how they are picked; :func:`load_task` turns it into a
:class:`TaskData`.

Rules:

* ``n_per_class`` counts images per *task* class. For binary tasks that is
  per side: Haim et al.'s CIFAR-10 vehicles/animals model with n = 500
  training images is ``n_per_class=250``.
* ``selection="first"`` takes, for each task class, the first images of that
  class in dataset order (what the reference code does: it walks the
  unshuffled training set and keeps an image while its class is below quota).
  The partition set is the *next* images of the same classes.
  ``selection="random"`` draws, for each task class in order, one
  ``torch.randperm`` from a ``torch.Generator`` seeded with ``seed``; the
  training images are its first ``n_per_class`` entries and the partition the
  following ``n_partition_per_class`` (so the two are disjoint, and changing
  the partition size never changes the training set).
* Training and partition come from the dataset's train split; held-out images
  come from its test split, chosen the same way (a separate generator seeded
  with ``seed``).
* Within every split, indices (int64, into the source split) are sorted
  ascending, i.e. images appear in dataset order, classes interleaved.
* ``skip_per_class`` k > 0 leaves the first k images of every task class, in dataset order, out
  of both splits before any of the above: a reservation. Data selected with k can never contain
  the images a spec with ``selection="first"`` and counts up to k selects, which is how a public
  pretraining set is kept disjoint from private fine-tuning data by construction
  (``datarecon train --pretrained`` checks the indices as well).
* ``n_train`` (n images drawn across the classes) or ``train_indices`` (images named) train on part of
  the ``n_per_class`` images selected per class, the pool (:mod:`datarecon.data.draw`); the
  partition and the held-out images are selected as without them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field, model_validator

from datarecon.data.datasets import DATASETS, load_dataset
from datarecon.data.draw import pick_training
from datarecon.data.formats import RawDataset
from datarecon.data.normalisation import Normalisation
from datarecon.data.tasks import ResolvedTask, resolve_task
from datarecon.errors import DataReconError
from datarecon.config import MAX_SEED, RecordedConfig


#: the largest dataset index a spec may name (an int64; beyond it NumPy's index arithmetic overflows)
MAX_INDEX = 2**63 - 1

#: Default held-out images per class, in units of ``n_per_class``: the attacks' default m is 2n, and a
#: null with fewer candidates than the attack lowers the headline threshold and flatters the attack.
HELDOUT_FACTOR = 2


class DataSpec(RecordedConfig):
    """What data a model is trained on.

    Attributes:
        dataset: a ``DATASETS`` name ("cifar10", "mnist", "digits").
        task: a task string ("vehicles-animals", "odd-even", "classes:a,b", "all").
        n_per_class: training images per task class (binary: per side), > 0.
        selection: "first" (first-k in dataset order) or "random" (seeded).
        seed: seed of the ``torch.Generator`` used by "random" (ignored by "first").
        n_partition_per_class: partition images per task class, from the train
            split, disjoint from training; defaults to ``n_per_class``; 0 = none.
        n_heldout_per_class: held-out images per task class from the test split;
            defaults to ``2 * n_per_class`` (as many held-out images as the attacks' default
            m = 2n candidates, so the null baseline is as strong as the attack); 0 = none.
        normalisation: "unit" (model input = display) or "unit-minus-mean"
            (display minus the per-pixel mean of the training images).
        skip_per_class: the first k images of every task class (dataset order) in each split are
            left out before selecting: reserved, e.g. for private data a public pretraining set must
            not contain; 0 = none.
        n_train: train on n ≥ 1 of the ``n_per_class`` · k images selected (the pool), drawn across the
            classes with ``seed``, the draw of n nested in that of n + 1 (:mod:`datarecon.data.draw`);
            None: the whole pool.
        train_indices: train on these images of the pool (indices into the dataset's train split);
            with ``n_train``, the images its draw gave (a trained model's record), which the draw must
            reproduce; None: none named.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    added_fields: ClassVar[tuple[str, ...]] = ("skip_per_class", "n_train", "train_indices")  # unset: as before

    dataset: str
    task: str
    n_per_class: int = Field(gt=0)
    selection: Literal["first", "random"] = "first"
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    n_partition_per_class: int = Field(ge=0)
    n_heldout_per_class: int = Field(ge=0)
    normalisation: Literal["unit", "unit-minus-mean"] = "unit-minus-mean"
    skip_per_class: int = Field(default=0, ge=0)
    n_train: int | None = Field(default=None, gt=0)
    train_indices: tuple[Annotated[int, Field(ge=0, le=MAX_INDEX)], ...] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_training_set(self) -> DataSpec:
        named = self.train_indices
        if named is not None and len(set(named)) != len(named):
            repeated = next(i for i in named if named.count(i) > 1)
            raise ValueError(f"train_indices name index {repeated} more than once; list each image once")
        if named is not None and self.n_train is not None and len(named) != self.n_train:
            raise ValueError(f"n_train {self.n_train} and the {len(named)} train_indices disagree; pass one of them")
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_counts(cls, data: Any) -> Any:
        if isinstance(data, dict) and "n_per_class" in data:
            data = dict(data)
            if data.get("n_partition_per_class") is None:
                data["n_partition_per_class"] = data["n_per_class"]
            if data.get("n_heldout_per_class") is None:
                n = data["n_per_class"]  # a bad n_per_class is reported by its own field's check
                data["n_heldout_per_class"] = HELDOUT_FACTOR * n if isinstance(n, int) and not isinstance(n, bool) else n
        return data

    def checked(self, where: str) -> DataSpec:
        """This spec when its dataset and task resolve (:meth:`resolved_task`); for a spec read from a
        file (a model directory's record), whose errors name ``where``.

        Raises:
            DataReconError: ``invalid <where>: ...`` (an unknown dataset or task, a task that does not fit).
        """
        try:
            self.resolved_task()
        except DataReconError as exc:
            raise DataReconError(f"invalid {where}: {exc}") from None
        return self

    def resolved_task(self) -> ResolvedTask:
        """The task applied to the dataset (checks both names; reads no data).

        Raises:
            DataReconError: unknown dataset/task or a task that does not fit.
        """
        return resolve_task(self.dataset, self.task)


@dataclass(frozen=True, eq=False)
class Split:
    """A set of images with their labels.

    Attributes:
        x: float32 (n, C, H, W) in display space [0, 1].
        y: (n,) labels: float32 in {-1., +1.} (binary) or int64 in [0, k) (multiclass).
        indices: int64 (n,) positions in the source split, ascending.
        source: the dataset split they come from ("train" or "test").
        source_labels: int64 (n,) the dataset's own class labels (e.g. 0..9).
    """

    x: torch.Tensor
    y: torch.Tensor
    indices: torch.Tensor
    source: str
    source_labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.indices.shape[0])


@dataclass(frozen=True, eq=False)
class TaskData:
    """Everything :func:`load_task` produces.

    Attributes:
        spec: the :class:`DataSpec`.
        train, partition, heldout: the three :class:`Split`s.
        normalisation: fitted on ``train.x``.
        input_shape: (C, H, W).
        num_classes: task classes (2 for binary tasks).
        label_kind: "binary" or "multiclass".
        class_names: one name per task class (binary: index 0 is the -1 side).
        task: the resolved task (which dataset classes form each task class).
    """

    spec: DataSpec
    train: Split
    partition: Split
    heldout: Split
    normalisation: Normalisation
    input_shape: tuple[int, int, int]
    num_classes: int
    label_kind: str
    class_names: tuple[str, ...]
    task: ResolvedTask

    def fingerprint(self) -> dict[str, str]:
        """SHA-256 (first 16 hex digits) of each split's images and labels: ``{"train", "partition", "heldout"}``.

        Recorded in ``model.json`` (``data_fingerprint``) and in training checkpoints, so that a
        resume or an evaluation that finds other files under the data folder (another copy of the
        dataset, inverted images) is refused instead of silently using them
        (:func:`check_fingerprint`).
        """
        return {name: split_fingerprint(getattr(self, name)) for name in ("train", "partition", "heldout")}

    def index_tensors(self) -> dict[str, torch.Tensor]:
        """``{"train_indices", "partition_indices", "heldout_indices"}`` for checkpoints."""
        return {"train_indices": self.train.indices.clone(),
                "partition_indices": self.partition.indices.clone(),
                "heldout_indices": self.heldout.indices.clone()}


def select_indices(task_class: np.ndarray, counts: Sequence[int], *, num_classes: int,
                   selection: str = "first", generator: torch.Generator | None = None,
                   class_names: Sequence[str] | None = None, where: str = "the dataset",
                   count_names: Sequence[str] | None = None) -> list[np.ndarray]:
    """Pick disjoint blocks of images, ``counts[b]`` per task class for block b.

    Args:
        task_class: (N,) int task-class index of every image (-1 = not in the task).
        counts: images per task class for each block (e.g. [train, partition]).
        num_classes: number of task classes k.
        selection: "first" (consecutive in dataset order) or "random"
            (``torch.randperm`` per class, classes in order, from ``generator``).
        generator: required for "random".
        class_names, where, count_names: only for error messages.

    Returns:
        One sorted int64 index array per block; blocks are pairwise disjoint.

    Raises:
        DataReconError: a class has fewer images than ``sum(counts)``.
    """
    if selection not in ("first", "random"):
        raise DataReconError(f"unknown selection {selection!r}; valid: first, random")
    if selection == "random" and generator is None:
        raise ValueError("selection='random' needs a torch.Generator")
    task_class = np.asarray(task_class)
    need = int(sum(counts))
    blocks: list[list[np.ndarray]] = [[] for _ in counts]
    for c in range(num_classes):
        cand = np.flatnonzero(task_class == c)
        if len(cand) < need:
            name = class_names[c] if class_names is not None else str(c)
            what = " + ".join(
                f"{n}={k}" for n, k in zip(count_names or [f"block{i}" for i in range(len(counts))],
                                            counts, strict=True) if k
            )
            raise DataReconError(
                f"{what} needs {need} images of class {name!r} from {where}, but only "
                f"{len(cand)} are available; lower the counts"
            )
        if selection == "random":
            perm = torch.randperm(len(cand), generator=generator).numpy()
            cand = cand[perm]
        start = 0
        for b, k in enumerate(counts):
            blocks[b].append(cand[start:start + k])
            start += k
    return [np.sort(np.concatenate(parts)).astype(np.int64) if parts
            else np.zeros(0, dtype=np.int64) for parts in blocks]


def reserve(task_class: np.ndarray, k: int) -> np.ndarray:
    """``task_class`` with the first ``k`` images of every task class (dataset order) marked −1 (left out).

    Args:
        task_class: (N,) task-class index of every image (−1: not in the task); not modified.
        k: images reserved per class, ≥ 0.

    Returns:
        A new (N,) array.
    """
    out = np.array(task_class, copy=True)
    if k:
        for c in np.unique(out[out >= 0]):
            out[np.flatnonzero(out == c)[:k]] = -1
    return out


def make_split(raw: RawDataset, indices: np.ndarray, task: ResolvedTask) -> Split:
    """The :class:`Split` of ``raw`` at ``indices`` with ``task``'s labels."""
    src = raw.labels[indices]
    tc = task.task_class_of(src)
    if (tc < 0).any():
        raise DataReconError(f"indices include images outside task {task.task!r}")
    return Split(
        x=raw.float_images(indices),
        y=task.encode(tc),
        indices=torch.from_numpy(np.asarray(indices, dtype=np.int64).copy()),
        source=raw.split,
        source_labels=torch.from_numpy(src.astype(np.int64)),
    )


def load_task(spec: DataSpec, *, data_dir: str | os.PathLike | None = None) -> TaskData:
    """Load the training, partition and held-out sets described by ``spec``.

    Args:
        spec: the data spec.
        data_dir: data folder (see :func:`~datarecon.data.datasets.resolve_data_dir`).

    Returns:
        A :class:`TaskData`; same spec and files -> identical result.

    Raises:
        DataReconError: unknown dataset/task, a task that does not fit the
            dataset, or more images requested than a class has.
        DataMissingError: the dataset's files are missing.
    """
    task = resolve_task(spec.dataset, spec.task)
    info = DATASETS.get(spec.dataset)
    k = task.num_classes
    names = ("n_per_class", "n_partition_per_class")

    train_raw = load_dataset(spec.dataset, split="train", data_dir=data_dir)
    gen = torch.Generator().manual_seed(spec.seed) if spec.selection == "random" else None
    skipped = f" after the first {spec.skip_per_class} per class" if spec.skip_per_class else ""
    train_class = reserve(task.task_class_of(train_raw.labels), spec.skip_per_class)
    pool, part_idx = select_indices(
        train_class, [spec.n_per_class, spec.n_partition_per_class],
        num_classes=k, selection=spec.selection, generator=gen, class_names=task.class_names,
        where=f"{spec.dataset} train{skipped}", count_names=names,
    )
    train_idx = pick_training(pool, train_class[pool], n_train=spec.n_train, train_indices=spec.train_indices,
                              seed=spec.seed, where=f"the {len(pool)} images n_per_class {spec.n_per_class} selects "
                              f"for the {k} classes of {spec.dataset} {spec.task}")

    if spec.n_heldout_per_class > 0:
        test_raw = load_dataset(spec.dataset, split="test", data_dir=data_dir)
        gen = torch.Generator().manual_seed(spec.seed) if spec.selection == "random" else None
        (held_idx,) = select_indices(
            reserve(task.task_class_of(test_raw.labels), spec.skip_per_class), [spec.n_heldout_per_class],
            num_classes=k, selection=spec.selection, generator=gen, class_names=task.class_names,
            where=f"{spec.dataset} test{skipped}", count_names=("n_heldout_per_class",),
        )
        heldout = make_split(test_raw, held_idx, task)
    else:
        c, h, w = info.input_shape
        empty_y = task.encode(np.zeros(0, dtype=np.int64))
        heldout = Split(torch.zeros(0, c, h, w), empty_y, torch.zeros(0, dtype=torch.int64),
                        "test", torch.zeros(0, dtype=torch.int64))

    train = make_split(train_raw, train_idx, task)
    partition = make_split(train_raw, part_idx, task)
    return TaskData(
        spec=spec, train=train, partition=partition, heldout=heldout,
        normalisation=Normalisation.fit(spec.normalisation, train.x),
        input_shape=train_raw.image_shape, num_classes=k, label_kind=task.label_kind,
        class_names=task.class_names, task=task,
    )


def split_fingerprint(split: Split) -> str:
    """SHA-256 (16 hex digits) of a split's images (float32 bytes) and labels."""
    h = hashlib.sha256()
    for t in (split.x.to(torch.float32), split.y):
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def check_fingerprint(task: TaskData, recorded: dict[str, str] | None, *, where: str,
                      splits: tuple[str, ...] = ("train", "partition", "heldout")) -> None:
    """Refuse data that differ from those ``where`` (a model directory) was trained and recorded with.

    Args:
        task: the task just loaded from the data folder.
        recorded: ``model.json``'s ``data_fingerprint`` (None for models of earlier versions: no check).
        where: the model directory, for the message.
        splits: the splits to compare.

    Raises:
        DataReconError: one line naming the split and the fix (point ``--data-dir`` at the data
            the model was trained on).
    """
    if not recorded:
        return
    found = task.fingerprint()
    for name in splits:
        if name in recorded and recorded[name] != found[name]:
            raise DataReconError(
                f"the {name} images found for {task.spec.dataset} differ from those {where} was trained with "
                f"(fingerprint {found[name]} != {recorded[name]}); point --data-dir (or $DATARECON_DATA) at the "
                "data the model was trained on")


def draw_outside(spec: DataSpec, *, split: str, exclude: Sequence[int] | np.ndarray | torch.Tensor = (),
                 count: int, seed: int, data_dir: str | os.PathLike | None = None) -> tuple[Split, int]:
    """Up to ``count`` images of the task's classes from ``split``, none of them at an index in ``exclude``.

    The images a model never trained on, beyond the few its data spec names: e.g. the unused part of
    the training split as the non-members of a membership test, or test-split images as a population.
    Drawn uniformly without replacement by ``torch.randperm`` from a generator seeded with ``seed``,
    returned in dataset order (sorted indices).

    Args:
        spec: the data spec (dataset and task).
        split: ``train`` or ``test``.
        exclude: indices into ``split`` that must not be drawn (e.g. the model's training images).
        count: how many to draw, ≥ 0 (fewer when fewer are available).
        seed: the draw's seed.
        data_dir: data folder.

    Returns:
        (the :class:`Split`, how many images were available to draw from).

    Raises:
        DataReconError: a negative count; DataMissingError: no data files.
    """
    if count < 0:
        raise DataReconError(f"cannot draw {count} images; pass a count >= 0")
    task = resolve_task(spec.dataset, spec.task)
    raw = load_dataset(spec.dataset, split=split, data_dir=data_dir)
    ok = task.task_class_of(raw.labels) >= 0
    ex = np.asarray(torch.as_tensor(exclude, dtype=torch.int64).numpy() if not isinstance(exclude, np.ndarray)
                    else exclude, dtype=np.int64)
    ok[ex[(ex >= 0) & (ex < ok.size)]] = False
    pool = np.flatnonzero(ok)
    gen = torch.Generator().manual_seed(int(seed))
    take = pool[torch.randperm(pool.size, generator=gen).numpy()[:min(count, pool.size)]] if pool.size else pool
    return make_split(raw, np.sort(take).astype(np.int64), task), int(pool.size)
