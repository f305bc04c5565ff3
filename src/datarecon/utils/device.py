"""The ``--device`` option's parser, shared by the CLI and the run executor."""

from __future__ import annotations

import torch

from datarecon.errors import DataReconError


#: the device types datarecon runs on (others, such as ``mps`` or ``meta``, are refused before any work)
DEVICE_TYPES = ("cpu", "cuda")


def parse_device(name: str, *, require_available: bool = True) -> torch.device:
    """``cpu``/``cuda``/``cuda:N`` → device; refuses any other type (``mps``, ``meta``), and cuda or
    ``cuda:N`` when no such device is available (unless ``require_available`` is False: a dry run
    estimates for a device it does not use). Called before any work, so a bad device never fails
    half-way through a run."""
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise DataReconError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if dev.type not in DEVICE_TYPES:
        raise DataReconError(f"device {name!r} is not supported; use cpu, cuda or cuda:N")
    if require_available and dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DataReconError("--device cuda requested but no CUDA device is available; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DataReconError(f"--device {name}: there are {torch.cuda.device_count()} CUDA device(s), numbered "
                                 "from 0; pass an existing one")
    return dev
