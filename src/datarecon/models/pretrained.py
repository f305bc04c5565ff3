"""The start of a fine-tuning: a pretrained model's weights, with a new head where the classes differ.

Both sides build it with :func:`finetune_start`: ``datarecon train --pretrained DIR`` (the victim,
:mod:`datarecon.training.pretrained`) and the attacker who knows the public pretrained model
(``--known-init pretrained``, :mod:`datarecon.attacks.knowledge`), so the attacker's θ_init is the
training's by construction and is checked by its hash like every known initialisation.

The network of the fine-tuning's architecture is built from the training seed (so a new head is
the one that seed draws, exactly as a model trained from scratch with that seed would get it);
every tensor but the head's is then replaced by the pretrained model's, batch norm's running
statistics included. The head is the last ``nn.Linear`` of the network (the ResNets' ``head``,
the MLP's and CNN's read-out).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from datarecon.errors import DataReconError
from datarecon.kernel.files import WEIGHTS
from datarecon.models.checkpoint import ModelBundle, load_model_dir
from datarecon.models.spec import ArchSpec, build_model

__all__ = ["HEAD_KEPT", "HEAD_NEW", "check_same_body", "finetune_start", "head_names", "load_recorded_pretrained"]

#: how a fine-tuning treats the pretrained read-out (recorded in model.json ``pretrained.head``)
HEAD_KEPT, HEAD_NEW = "pretrained", "new"

#: architecture fields a fine-tuning must share with its pretrained model (the body's shapes)
_BODY_FIELDS = ("name", "input_shape", "bias", "kernel", "batch_norm")


def head_names(model: nn.Module) -> tuple[str, ...]:
    """Parameter names of the last ``nn.Linear`` of ``model`` (its read-out).

    Raises:
        DataReconError: the network has no linear layer.
    """
    last = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            last = name
    if last is None:
        raise DataReconError("the network has no linear read-out to replace; fine-tune with the same classes")
    return tuple(f"{last}.{p}" for p, _ in model.get_submodule(last).named_parameters(recurse=False))


def check_same_body(pretrained: ArchSpec, spec: ArchSpec) -> None:
    """Refuse a fine-tuning architecture whose body differs from the pretrained model's (only the number
    of outputs, and so the head, may change).

    Raises:
        DataReconError: names the first differing field and the pretrained value.
    """
    for name in _BODY_FIELDS:
        if getattr(pretrained, name) != getattr(spec, name):
            value = getattr(pretrained, name)
            raise DataReconError(f"the pretrained model has {name} {value!r}, the fine-tuning {getattr(spec, name)!r}; "
                                 f"train with the pretrained architecture (arch {name}: {value!r})")
    if pretrained.resolved_hidden() != spec.resolved_hidden():
        widths = ",".join(map(str, pretrained.resolved_hidden()))
        raise DataReconError(f"the pretrained model has widths {widths}, the fine-tuning "
                             f"{','.join(map(str, spec.resolved_hidden()))}; pass --hidden {widths}")


def finetune_start(pretrained: Mapping[str, torch.Tensor], pretrained_arch: ArchSpec, spec: ArchSpec, *,
                   seed: int, dtype: torch.dtype, new_head: bool) -> nn.Module:
    """θ_init of a fine-tuning: the network of ``spec`` with the pretrained tensors.

    Args:
        pretrained: the pretrained model's weights file (state-dict names → tensors; parameters and
            batch norm statistics).
        pretrained_arch: its architecture (checked against ``spec`` by :func:`check_same_body`).
        spec: the fine-tuning's architecture (its ``num_outputs`` may differ when ``new_head``).
        seed: the fine-tuning's seed: the network is drawn from it first, so a new head is its draw.
        dtype: parameter dtype of the fine-tuning.
        new_head: keep the head ``spec`` draws from ``seed`` instead of the pretrained one.

    Returns:
        The network (train mode as built) holding θ_init.

    Raises:
        DataReconError: another body, or the pretrained head kept for another number of outputs.
    """
    check_same_body(pretrained_arch, spec)
    if not new_head and pretrained_arch.num_outputs != spec.num_outputs:
        raise DataReconError(f"the pretrained model has {pretrained_arch.num_outputs} outputs, the fine-tuning "
                             f"{spec.num_outputs}: its head cannot be kept")
    model = build_model(spec, generator=torch.Generator().manual_seed(int(seed)), dtype=dtype)
    head = set(head_names(model)) if new_head else set()
    state = model.state_dict()
    for name, value in pretrained.items():
        if name in head:
            continue
        if name not in state or tuple(state[name].shape) != tuple(value.shape):
            raise DataReconError(f"the pretrained weights do not fit the fine-tuning's network ({name}); "
                                 "train with the pretrained architecture")
        state[name] = value.to(dtype=state[name].dtype) if value.is_floating_point() else value
    model.load_state_dict(state)
    return model


def load_recorded_pretrained(meta: Mapping[str, Any], *, path: str | Path | None = None) -> ModelBundle:
    """The pretrained model a fine-tuned model's ``model.json`` records, loaded and checked: the weights of the
    directory (``path``; default the recorded one) must have the recorded SHA-256. Every command that reads a
    fine-tuned model's start goes through here, so a pretrained folder retrained since is refused, not used.

    Raises:
        DataReconError: a model that was not fine-tuned; a missing or invalid directory; other weights than recorded.
    """
    record = meta.get("pretrained")
    if not isinstance(record, dict):
        raise DataReconError("this model was not fine-tuned from a pretrained model (its model.json records none)")
    where = Path(path) if path is not None else Path(str(record.get("path")))
    bundle = load_model_dir(where)
    found, recorded = str((bundle.meta.get("sha256") or {}).get(WEIGHTS, "")), str(record.get("weights_sha256"))
    if found != recorded:
        fix = ("pass the directory it records" if path is not None else
               "it was retrained or replaced since: restore the pretrained model it records")
        raise DataReconError(f"the model in {where} is not the pretrained model this model was fine-tuned from "
                             f"(weights sha256 {found[:12]} vs recorded {recorded[:12]}); {fix}")
    return bundle
