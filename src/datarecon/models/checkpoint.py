"""Model directories: safetensors weights + JSON metadata, loaded without executing code.

Layout of a model directory::

    weights.safetensors   θ* (parameter name -> tensor; batch norm adds its running mean and variance)
    extras.safetensors    input_mean (C,H,W), train_indices, partition_indices, heldout_indices
    model.json            format, arch, data, loss, weight_decay, training config, seed,
                          versions, config_hash, metrics, sha256 of both tensor files

Loading checks the format tag, the hashes and that the weights match the
architecture, so a tampered or mismatched file is refused with a clear
message; a pickle posing as weights is refused before it is parsed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from datarecon.errors import CheckpointError, DataReconError
from datarecon.models.records import ModelMeta
from datarecon.models.spec import ArchSpec, build_model, state_shapes
from datarecon.utils.dtypes import DTYPES
from datarecon.utils.io import (
    atomic_write_json,
    config_hash,
    load_tensors,
    read_json,
    save_tensors,
    sha256_file,
    to_jsonable,
    versions,
)
from datarecon.kernel.files import CHECKPOINT_DIR, EXTRAS, MODEL_JSON, RUN_JSON, WEIGHTS

FORMAT = "datarecon-model/1"


META = MODEL_JSON
#: a model given as ``package.module:factory`` (a user's own model), not a folder
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class ModelBundle:
    """Everything a model directory holds.

    Attributes:
        model: the network with θ* loaded (eval mode).
        params: θ* as a name -> tensor dict (detached).
        arch: the architecture spec.
        loss: training loss name (``datarecon.kernel.losses.LOSSES``).
        weight_decay: training weight decay (energy term (wd/2)‖θ‖²).
        data: the data spec as a plain mapping (``datarecon.data.DataSpec`` fields).
        normalisation: ``unit`` or ``unit-minus-mean``.
        input_mean: (C, H, W) per-pixel mean subtracted from [0,1] images (zeros for ``unit``).
        indices: train/partition/held-out indices into the dataset splits (evaluation only).
        meta: the full metadata (training config, metrics, versions, ...).
        path: the directory it was loaded from.
        extras: other tensors of ``extras.safetensors`` (e.g. ``train_margins`` (n,)).
    """

    model: nn.Module
    params: dict[str, torch.Tensor]
    arch: ArchSpec
    loss: str
    weight_decay: float
    data: dict[str, Any]
    normalisation: str
    input_mean: torch.Tensor
    indices: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelDescription:
    """What a saved model is: the fields of ``model.json`` that its ``config_hash`` covers.

    Attributes:
        arch: the architecture spec.
        loss: training loss name (``datarecon.kernel.losses.LOSSES``).
        weight_decay: training weight decay wd ≥ 0 (energy term (wd/2)‖θ‖²).
        data: the data spec as a plain JSON mapping (``datarecon.data.DataSpec`` fields).
        normalisation: ``unit`` or ``unit-minus-mean`` (the model input space).
        training: the training config as a plain JSON mapping (with its ``config_hash``).
        seed: seed of the initialisation generator.
    """

    arch: ArchSpec
    loss: str
    weight_decay: float
    data: dict[str, Any]
    normalisation: str
    training: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class TrainingRecord:
    """What a training produced beside the weights, saved with them but outside the config hash.

    Attributes:
        input_mean: (C, H, W) per-pixel mean subtracted from [0,1] images (zeros for ``unit``).
        indices: ``train``/``partition``/``heldout`` -> 1-D integer indices into the dataset splits.
        metrics: the training metrics recorded in ``model.json`` (None: none).
        extra_tensors: other tensors for ``extras.safetensors`` (e.g. ``train_margins`` (n,)).
        init_sha256: the :func:`~datarecon.utils.io.params_digest` of the initialisation the model was
            trained from (recorded so that an attacker-supplied θ_init can be checked).
        data_fingerprint: :meth:`datarecon.data.selection.TaskData.fingerprint` of the training data,
            recorded so that evaluation refuses other data than the model's.
        pretrained: for a fine-tuning, the pretrained model it started from (directory, weights
            SHA-256, whether the head was kept or drawn anew, its data spec and config hash).
    """

    input_mean: torch.Tensor
    indices: dict[str, torch.Tensor]
    metrics: dict[str, Any] | None = None
    extra_tensors: dict[str, torch.Tensor] | None = None
    init_sha256: str | None = None
    data_fingerprint: dict[str, str] | None = None
    pretrained: dict[str, Any] | None = None


def save_model_dir(out: str | Path, *, model: nn.Module, description: ModelDescription,
                   record: TrainingRecord) -> Path:
    """Write a model directory atomically (each file is replaced in one rename).

    ``model.json`` holds ``description`` and its ``config_hash``, the record's metrics, ``init_sha256``
    and ``data_fingerprint`` (neither part of the config hash), the versions and the files' hashes.
    The record's tensors (``extra_tensors``, e.g. ``train_margins``) are stored in ``extras.safetensors``
    beside the input mean and the indices. Weights are saved in the model's dtype.

    Returns:
        The directory path.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # floating tensors only: batch norm's integer batch counter is not part of a model (it is rebuilt on load)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if v.is_floating_point()}
    save_tensors(out / WEIGHTS, weights)
    extras = {"input_mean": record.input_mean.detach().cpu().float().contiguous()}
    extras.update({f"{k}_indices": v.detach().cpu().long().contiguous() for k, v in record.indices.items()})
    extras.update({k: v.detach().cpu().contiguous() for k, v in (record.extra_tensors or {}).items()})
    save_tensors(out / EXTRAS, extras)
    d = description
    config = {"arch": d.arch.model_dump(mode="json"), "loss": d.loss, "weight_decay": d.weight_decay,
              "data": d.data, "normalisation": d.normalisation, "training": d.training, "seed": d.seed}
    meta = {
        "format": FORMAT,
        **config,
        "config_hash": config_hash(config),
        "versions": versions(),
        "metrics": record.metrics or {},
        "sha256": {WEIGHTS: sha256_file(out / WEIGHTS), EXTRAS: sha256_file(out / EXTRAS)},
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    if record.init_sha256 is not None:
        meta["init_sha256"] = record.init_sha256
    if record.data_fingerprint:
        meta["data_fingerprint"] = dict(record.data_fingerprint)
    if record.pretrained is not None:
        meta["pretrained"] = dict(record.pretrained)
    validate_meta(to_jsonable(meta), where=out / META)  # what is written reads back: one definition of the file
    atomic_write_json(out / META, meta)
    return out


def read_model_meta(path: str | Path) -> dict[str, Any]:
    """Read and check ``model.json`` of a model directory (no tensors loaded)."""
    path = Path(path)
    if not path.is_dir():
        if path.is_symlink() and not path.exists():
            raise CheckpointError(f"{path} is a symbolic link that leads nowhere (broken, or a loop); pass the model "
                                  "directory itself")
        if path.name == META and path.is_file():
            raise CheckpointError(f"{path} is the model's record file; pass the model directory that holds it "
                                  f"(--model {path.parent})")
        if path.exists():
            raise CheckpointError(f"{path} is a file, not a model directory; pass the folder `datarecon train --out` "
                                  "wrote")
        if _FACTORY.fullmatch(str(path)):
            raise CheckpointError(f"{path} names a model factory (package.module:factory), which only `datarecon "
                                  "reconstruct --model` takes (with --weights); this command needs a model directory "
                                  "written by `datarecon train`")
        raise CheckpointError(f"model directory {path} not found; train one with `datarecon train --out {path}`")
    if not (path / META).is_file() and (path / RUN_JSON).is_file():
        raise CheckpointError(f"{path} is a run directory, not a model directory; pass the model directory the run "
                              f"attacked{_attacked(path)}")
    if not (path / META).exists():
        unfinished = (path / CHECKPOINT_DIR).is_dir()
        raise CheckpointError(f"{path} holds an unfinished training (a checkpoint, no {META}); finish it with "
                              "`datarecon train ... --resume`" if unfinished else
                              f"{path} is not a model directory (it has no {META}); pass the folder `datarecon "
                              "train --out` wrote")
    meta = read_json(path / META)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path / META} is not a datarecon model file (expected format {FORMAT!r})")
    validate_meta(meta, where=path / META)
    return meta


def _attacked(run_dir: Path) -> str:
    """``: DIR`` naming the model directory a run's run.json records, or where to find it when it cannot be read."""
    try:
        model_dir = read_json(run_dir / RUN_JSON).get("model_dir")
    except (CheckpointError, AttributeError):
        model_dir = None
    return f": {model_dir}" if isinstance(model_dir, str) and model_dir else " (its run.json names it as model_dir)"


def model_identity(model_dir: str | Path) -> str:
    """Content identity of a model directory: its config hash and weight hashes (not its path)."""
    meta = read_model_meta(model_dir)
    return config_hash({"config_hash": meta.get("config_hash"), "sha256": meta.get("sha256")})


def validate_meta(meta: dict[str, Any], *, where: Path | str = META) -> ModelMeta:
    """Check the fields of ``model.json`` (:class:`~datarecon.models.records.ModelMeta`: types, ranges,
    registered names, the margin-ascent curve) without building anything.

    Raises:
        CheckpointError: one line naming the file, the first bad field (and how many more there are) and the fix.
    """
    fix = "re-train the model or restore the file"
    try:  # strict, as JSON: a file datarecon wrote holds numbers as numbers ("hidden": ["8"] is refused)
        return ModelMeta.model_validate_json(json.dumps(meta), strict=True)
    except ValidationError as exc:
        errors = exc.errors()
        raise CheckpointError(f"{where} is damaged or was changed by hand ({_problem(errors[0])}"
                              + (f"; and {len(errors) - 1} more" if len(errors) > 1 else "") + f"); {fix}") from None
    except DataReconError as exc:  # an unknown registered name (loss, architecture)
        raise CheckpointError(f"{where} is damaged or was changed by hand ({exc}); {fix}") from None


def _problem(error: Any) -> str:
    """One validation error as ``field: what is wrong (value ...)``."""
    loc = ".".join(str(p) for p in error["loc"]) or "(root)"
    what = "unknown key" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
    shown = error["type"] not in ("extra_forbidden", "missing") and not isinstance(error.get("input"), (dict, list))
    value = f" (value {error.get('input')!r:.40})" if shown else ""
    return f"{loc}: {what}{value}"


def _check_weights(path: Path, weights: dict[str, torch.Tensor], arch: ArchSpec, *,
                   dtype: str | None = None) -> None:
    """The weights fit ``arch`` (compared before building it), are finite floats of the dtype the
    model was trained in (``dtype``, from ``model.json``; else one of :data:`DTYPES`) and are not
    all zero (θ* = 0 holds nothing to reconstruct, and every relative residual is 0/0)."""
    expected = state_shapes(arch)
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if expected != found:
        raise CheckpointError(
            f"{path / WEIGHTS} does not fit architecture {arch.name} (expected {expected}, found {found})"
        )
    for name, t in weights.items():
        if not t.dtype.is_floating_point:
            raise CheckpointError(f"{path / WEIGHTS} holds non-float weights ({name}: {t.dtype}); re-train the model")
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path / WEIGHTS} holds NaN or infinite values in {name}; the model is "
                                  "unusable: re-train it or restore the file")
        found_dtype = str(t.dtype).replace("torch.", "")
        allowed = (dtype,) if dtype in DTYPES else tuple(DTYPES)
        if found_dtype not in allowed:
            raise CheckpointError(f"{path / WEIGHTS} holds {found_dtype} weights ({name}), but the model was trained "
                                  f"in {' or '.join(allowed)}; re-train the model or restore the file")
    if weights and not any(bool(t.any()) for t in weights.values()):
        raise CheckpointError(f"{path / WEIGHTS} holds only zeros: such a model carries nothing of its training data "
                              "(and every residual relative to theta* is 0/0); re-train it or restore the file")


def _check_extras(path: Path, extras: dict[str, torch.Tensor], arch: ArchSpec) -> None:
    """``input_mean`` of the input shape, finite; index tensors are 1-D integers."""
    mean = extras.get("input_mean")
    if mean is None:
        raise CheckpointError(f"{path / EXTRAS} has no input_mean; re-train the model or restore the file")
    if tuple(mean.shape) != tuple(arch.input_shape) or not mean.dtype.is_floating_point:
        raise CheckpointError(f"{path / EXTRAS}: input_mean has shape {tuple(mean.shape)} ({mean.dtype}), expected "
                              f"floats of the input shape {tuple(arch.input_shape)}; re-train the model")
    if not bool(torch.isfinite(mean).all()):
        raise CheckpointError(f"{path / EXTRAS}: input_mean holds NaN or infinite values; re-train the model")
    for name, t in extras.items():
        if name.endswith("_indices") and (t.dim() != 1 or t.dtype.is_floating_point):
            raise CheckpointError(f"{path / EXTRAS}: {name} must be 1-D integers, got {tuple(t.shape)} {t.dtype}; "
                                  "re-train the model")


def load_model_dir(path: str | Path, *, device: str | torch.device = "cpu",
                   dtype: torch.dtype | None = None) -> ModelBundle:
    """Load a model directory safely (safetensors only; hashes and shapes checked).

    Args:
        path: the model directory.
        device: where to put the model.
        dtype: convert parameters to this dtype (default: as saved).

    Raises:
        CheckpointError: missing/pickled/tampered files, or weights that do not fit the architecture.
    """
    path = Path(path)
    meta = read_model_meta(path)
    unchecked = [name for name in (WEIGHTS, EXTRAS) if name not in meta.get("sha256", {})]
    if unchecked:  # every model directory datarecon writes records both hashes
        raise CheckpointError(f"{path / META} records no hash of {' and '.join(unchecked)}, so a changed file would "
                              "go unnoticed; re-train the model or restore the file")
    others = sorted(set(meta.get("sha256", {})) - {WEIGHTS, EXTRAS})
    if others:  # a name like "../x" or "/dev/zero" would make the check read outside the folder
        raise CheckpointError(f"{path / META} records a hash of {others[0]!r}, which is no file of a model "
                              "directory; re-train the model or restore the file")
    for name, digest in meta.get("sha256", {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing; the model directory is incomplete")
        if sha256_file(file) != digest:
            raise CheckpointError(
                f"{file} does not match the hash in {META} (tampered or from another run); re-train or restore it"
            )
    weights = load_tensors(path / WEIGHTS)
    extras = load_tensors(path / EXTRAS)
    checked = validate_meta(meta, where=path / META)
    arch = checked.arch
    _check_weights(path, weights, arch, dtype=checked.training.dtype)  # before build_model: a
    # spec of petabytes is refused here
    _check_extras(path, extras, arch)
    dtypes = {t.dtype for t in weights.values()}
    if len(dtypes) > 1:
        raise CheckpointError(f"{path / WEIGHTS} mixes dtypes {sorted(map(str, dtypes))}; re-train the model")
    saved_dtype = dtypes.pop() if dtypes else torch.float32
    try:
        model = build_model(arch, dtype=saved_dtype)
    except DataReconError as exc:
        raise CheckpointError(f"{path / META}: {exc}") from None
    model.load_state_dict(weights)
    if dtype is not None:
        model = model.to(dtype)
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    params = {k: v.detach() for k, v in model.named_parameters()}
    indices = {k[: -len("_indices")]: v for k, v in extras.items() if k.endswith("_indices")}
    other = {k: v for k, v in extras.items() if not k.endswith("_indices") and k != "input_mean"}
    return ModelBundle(
        model=model, params=params, arch=arch, loss=checked.loss, weight_decay=checked.weight_decay,
        data=checked.data, normalisation=checked.normalisation,
        input_mean=extras["input_mean"], indices=indices, meta=meta, path=path, extras=other,
    )
