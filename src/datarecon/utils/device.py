"""The ``--device`` option's parser, shared by the CLI and the run executor."""

from __future__ import annotations

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
