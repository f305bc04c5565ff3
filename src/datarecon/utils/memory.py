"""The machine's memory, and a refusal before an allocation that cannot fit.

Linux over-commits: an allocation somewhat smaller than the machine's memory is granted and
the process is killed (SIGKILL, no message) once it touches the pages. Sizes that cannot fit are
therefore refused up front, with the sizes to reduce named, instead of being left to the allocator.
"""

from __future__ import annotations

import os

import torch

from datarecon.errors import DataReconError


def physical_memory_bytes() -> int | None:
    """Total physical memory of this machine in bytes (None where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return None


def device_memory_bytes(device: torch.device | str | None = None) -> int | None:
    """Memory of the device work runs on: a CUDA device's total memory, else :func:`physical_memory_bytes`."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return physical_memory_bytes()


def refuse_if_too_large(need_bytes: float, *, what: str, fix: str, total: int | None = None) -> None:
    """Raise a one-line :class:`DataReconError` when ``need_bytes`` exceeds the machine's memory.

    Args:
        need_bytes: a lower bound of what the work allocates (bytes, >= 0).
        what: the sizes that need it, as the user gave them (e.g. ``"--candidates 10000000000"``).
        fix: what to reduce.
        total: the memory to compare with (default: :func:`physical_memory_bytes`).
    """
    total = physical_memory_bytes() if total is None else total
    if total is not None and need_bytes > total:
        raise DataReconError(f"not enough memory for these sizes: {what} needs at least {need_bytes / 2**30:.3g} GiB, "
                             f"this machine has {total / 2**30:.3g} GiB; {fix}")
