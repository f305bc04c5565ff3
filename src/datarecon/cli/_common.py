"""Options and helpers shared by CLI modules."""

from __future__ import annotations

from pathlib import Path

import torch

from datarecon.errors import DataReconError

def parse_device(name: str, *, require_available: bool = True) -> torch.device:
    """``cpu``/``cuda``/``cuda:N`` → device; refuses cuda when none is available (unless
    ``require_available`` is False: a dry run estimates for a device it does not use)."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DataReconError(f"unknown device {name!r}; use cpu or cuda") from None
    if require_available and dev.type == "cuda" and not torch.cuda.is_available():
        raise DataReconError("--device cuda requested but no CUDA device is available; use --device cpu")
    return dev


def prepare_out_dir(out: Path, *, kind: str, overwrite: bool, resume: bool = False) -> Path:
    """Refuse an existing non-empty output directory unless ``--overwrite`` (or ``--resume``);
    ``--overwrite`` replaces only a datarecon artefact of ``kind`` (:mod:`datarecon.utils.outdir`)."""
    from datarecon.utils.outdir import prepare_out_dir as prepare

    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    return prepare(out, kind=kind, overwrite=overwrite, resume=resume)
