"""A process's resident memory from its largest piece's tensor bytes, and bytes as text."""

from __future__ import annotations

#: Resident memory of a reproduction process = PROCESS_BASE_BYTES + RSS_PER_TENSOR_BYTE × the largest
#: piece's tensor bytes. Fitted to two measurements on the 2-core CPU: the runkel2024 smoke run
#: (2026-11-25, peak RSS 0.86 GB, largest piece 0.065 GB of tensors) and the paper dry run of
#: examples/runkel2024-paper-dryrun.yaml (2026-11-21, peak RSS 11.2 GB, 6.6 GB of tensors): torch,
#: matplotlib and the data take the base, the allocator's cached blocks the factor.
PROCESS_BASE_BYTES = 0.8e9
RSS_PER_TENSOR_BYTE = 1.57


def resident_bytes(tensor_bytes: float) -> float:
    """The process's expected peak resident memory for a largest piece of ``tensor_bytes``."""
    return PROCESS_BASE_BYTES + RSS_PER_TENSOR_BYTE * tensor_bytes


def format_bytes(b: float) -> str:
    """``12 MB``, ``3.4 GB`` (decimal units)."""
    return f"{b / 1e9:.1f} GB" if b >= 1e9 else f"{max(b, 0) / 1e6:.0f} MB"
