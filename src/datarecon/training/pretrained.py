"""Fine-tuning from a pretrained model directory (``datarecon train --pretrained DIR``).

The fine-tuning starts from the pretrained model's weights (batch norm's running statistics
included, then frozen: batch norm runs in eval mode, SimuDy's setting), with a new head drawn from
the training seed where the classes differ (:func:`datarecon.models.pretrained.finetune_start`).
Before anything is trained it checks, each with a one-line error:

* the pretrained directory is a valid model directory and, when the config names it, holds the
  weights of that SHA-256 (:func:`resolve_pretrained`);
* the architecture's body and the input space are the pretrained model's (:func:`check_compatible`;
  a mean fitted on each training set would shift the inputs the pretrained features expect, so
  both must use ``normalisation: unit``);
* no image the pretrained model trained on is a training or partition image of the fine-tuning
  (:func:`check_disjoint`): the public pretraining data and the private data are disjoint. The
  pretraining recipe guarantees it by construction (``skip_per_class``, docs/RESULTS.md); this check
  refuses a recipe that does not.

The config hash covers the pretrained weights' SHA-256, not the folder's path; model.json records
both (:func:`pretrained_record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from datarecon.data import DataSpec, TaskData
from datarecon.data.tasks import resolve_task
from datarecon.errors import CheckpointError, DataReconError
from datarecon.kernel.files import WEIGHTS
from datarecon.models.checkpoint import ModelBundle, load_model_dir, read_model_meta
from datarecon.models.pretrained import HEAD_KEPT, HEAD_NEW, check_same_body, finetune_start
from datarecon.models.spec import ArchSpec

__all__ = ["PretrainedConfig", "PretrainedStart", "check_compatible", "check_disjoint", "check_not_its_own_start",
           "pretrained_record", "resolve_pretrained", "start_model"]

_SHA256_HEX = 64


class PretrainedConfig(BaseModel):
    """The pretrained model a training starts from (``--pretrained DIR``; a bare path in a file works too).

    Attributes:
        path: the pretrained model directory (from ``datarecon train``).
        sha256: SHA-256 of its weights file; None: read from the directory (then recorded). Given, a
            directory holding other weights is refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1)
    sha256: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_path(cls, data: Any) -> Any:
        return {"path": data} if isinstance(data, str) else data

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != _SHA256_HEX or any(c not in "0123456789abcdef" for c in v)):
            raise ValueError(f"sha256 must be 64 lower-case hex digits, got {v!r}")
        return v


@dataclass(frozen=True)
class PretrainedStart:
    """A resolved pretrained model: its directory's contents and its weights' SHA-256."""

    bundle: ModelBundle
    sha256: str


def resolve_pretrained(config: PretrainedConfig, *, option: str = "--pretrained") -> PretrainedStart:
    """Load the pretrained model directory (hashes and shapes checked by the loader).

    ``option`` is how messages name the setting (``--pretrained``; an experiment file's ``train: pretrained.path``).

    Raises:
        DataReconError: a missing or invalid directory, or weights that are not the ``sha256`` named.
    """
    path = Path(config.path)
    try:
        bundle = load_model_dir(path)
    except CheckpointError as exc:
        raise DataReconError(f"{option} {path}: {exc}") from None
    digest = str((bundle.meta.get("sha256") or {}).get(WEIGHTS, ""))
    if config.sha256 is not None and digest != config.sha256:
        raise DataReconError(f"the pretrained model in {path} is not the one the config names (weights sha256 "
                             f"{digest[:12]} vs {config.sha256[:12]}); pass the directory those weights are in")
    return PretrainedStart(bundle=bundle, sha256=digest)


def _starts(start: PretrainedStart) -> list[Path]:
    """The pretrained model and, in turn, the pretrained models it and they were fine-tuned from (resolved paths)."""
    chain: list[Path] = []
    path, meta = Path(str(start.bundle.path)).resolve(), start.bundle.meta
    while path not in chain:
        chain.append(path)
        record = meta.get("pretrained")
        if not isinstance(record, dict) or not record.get("path"):
            break
        path = Path(str(record["path"])).resolve()
        try:
            meta = read_model_meta(path)
        except DataReconError:  # a start that is gone cannot be written over
            break
    return chain


def check_not_its_own_start(start: PretrainedStart, out: str | Path) -> None:
    """Refuse a fine-tuning whose output folder is its pretrained model, or a model that one descends from: writing
    there would destroy the weights it starts from (and the model would record itself as its own start, or a
    cycle A ← B, B ← A). Symbolic links are followed.

    Raises:
        DataReconError: which start ``out`` is, and the fix.
    """
    target = Path(out).resolve()
    chain = _starts(start)
    if target not in chain:
        return
    if target == chain[0]:
        raise DataReconError(f"--out {out} is the pretrained model --pretrained {start.bundle.path} names: training "
                             "there would replace the weights the fine-tuning starts from; choose another --out")
    line = " <- ".join(str(p) for p in chain[: chain.index(target) + 1])
    raise DataReconError(f"--out {out} is a pretrained start of --pretrained {start.bundle.path} ({line}): training "
                         "there would replace the weights that model descends from (a cycle); choose another --out")


def check_compatible(start: PretrainedStart, spec: ArchSpec, data: DataSpec) -> None:
    """Refuse a fine-tuning whose network body or input space differs from the pretrained model's.

    Raises:
        DataReconError: names the field and the fix.
    """
    pre = start.bundle
    if tuple(pre.arch.input_shape) != tuple(spec.input_shape):  # the data, not an architecture option, sets it
        dataset = pre.data.get("dataset")
        raise DataReconError(f"the pretrained model in {pre.path} was trained on {dataset} images of shape "
                             f"{tuple(pre.arch.input_shape)}, the fine-tuning's {data.dataset} images have shape "
                             f"{tuple(spec.input_shape)}; fine-tune on data of the pretrained images' shape (e.g. "
                             f"--dataset {dataset}) or pretrain on {data.dataset}")
    check_same_body(pre.arch, spec)
    if data.normalisation != "unit" or start.bundle.normalisation != "unit":
        raise DataReconError(f"fine-tuning keeps the pretrained model's input space, and a mean fitted on each "
                             f"training set would shift it (pretrained {start.bundle.normalisation}, fine-tuning "
                             f"{data.normalisation}): pretrain and fine-tune with --normalisation unit")


def check_disjoint(start: PretrainedStart, task: TaskData) -> None:
    """Refuse a fine-tuning whose training or partition images the pretrained model trained on.

    Raises:
        DataReconError: how many images overlap, and the fix.
    """
    pre = start.bundle
    if pre.data.get("dataset") != task.spec.dataset:
        return  # another dataset: no image in common
    seen = pre.indices.get("train")
    if seen is None:
        raise DataReconError(f"the pretrained model in {pre.path} records no training indices; retrain it")
    private = torch.cat([task.train.indices, task.partition.indices])
    common = np.intersect1d(seen.numpy(), private.numpy())
    if common.size:
        raise DataReconError(f"{common.size} training or partition images of this fine-tuning were training images "
                             f"of the pretrained model in {pre.path} (first: index {int(common[0])}); pretrain on "
                             "images the private ones are not (e.g. --skip-per-class larger than the fine-tuning's "
                             "n_per_class + n_partition_per_class)")


def new_head(start: PretrainedStart, data: DataSpec, spec: ArchSpec) -> bool:
    """Whether the fine-tuning needs a new head: its classes (dataset and task classes, in order) or its
    number of outputs differ from the pretrained model's."""
    pre = start.bundle
    if pre.arch.num_outputs != spec.num_outputs or pre.data.get("dataset") != data.dataset:
        return True
    return resolve_task(str(pre.data["dataset"]), str(pre.data["task"])).groups != data.resolved_task().groups


def start_model(start: PretrainedStart, spec: ArchSpec, data: DataSpec, *, seed: int,
                dtype: torch.dtype) -> tuple[torch.nn.Module, bool]:
    """The fine-tuning's network at θ_init and whether its head is new (drawn from ``seed``)."""
    fresh = new_head(start, data, spec)
    weights = {k: v for k, v in start.bundle.model.state_dict().items() if v.is_floating_point()}
    return finetune_start(weights, start.bundle.arch, spec, seed=seed, dtype=dtype, new_head=fresh), fresh


def pretrained_record(start: PretrainedStart, *, fresh_head: bool) -> dict[str, Any]:
    """model.json's ``pretrained``: the directory, its weights' SHA-256, the head, its data and config hash."""
    pre = start.bundle
    return {"path": str(Path(pre.path).resolve()) if pre.path is not None else None, "weights_sha256": start.sha256,
            "head": HEAD_NEW if fresh_head else HEAD_KEPT, "data": dict(pre.data),
            "config_hash": pre.meta.get("config_hash")}
