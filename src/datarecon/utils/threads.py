"""The one CPU-thread default of datarecon, for the command line and the Python API alike.

PyTorch runs datarecon's work on :data:`DEFAULT_THREADS` CPU threads: every command's ``--threads``
defaults to it, and importing any computing module of the package (everything that imports
:mod:`datarecon.kernel`: training, attacks, evaluation, experiments) applies it once, so that a
script calling the Python API gets what the command line gets. One thread was the fastest setting for
every workload of the README on the 2-core machine the project is measured on, where PyTorch's own
default (every core) took several times longer beside another job (docs/PERFORMANCE.md, "Threads"),
and it is the only setting whose results are the same bytes on every machine.

``DATARECON_THREADS=N`` in the environment replaces the default (``0``: leave PyTorch's own default,
for large models on many cores); ``torch.set_num_threads`` after the import overrides both.
"""

from __future__ import annotations

import os

import torch

from datarecon.errors import DataReconError

__all__ = ["DEFAULT_THREADS", "ENV_VAR", "TORCH_DEFAULT", "apply_default_threads", "default_threads", "set_threads"]

#: one thread: the fastest for the small models of the examples, and the same bytes on every machine
DEFAULT_THREADS = 1
#: the environment variable that replaces :data:`DEFAULT_THREADS` (0: PyTorch's own default)
ENV_VAR = "DATARECON_THREADS"
#: PyTorch's own thread count in this process, before datarecon set anything (what ``--threads 0`` restores)
TORCH_DEFAULT = torch.get_num_threads()


def default_threads() -> int:
    """:data:`DEFAULT_THREADS`, or the count ``$DATARECON_THREADS`` names (0: PyTorch's default).

    Raises:
        DataReconError: a ``$DATARECON_THREADS`` that is not a count >= 0.
    """
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return DEFAULT_THREADS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise DataReconError(f"${ENV_VAR} must be a thread count >= 0 (0: PyTorch's default), got {text!r}; "
                             "fix or unset it")
    return value


def set_threads(threads: int | None) -> None:
    """Run PyTorch on ``threads`` CPU threads: 0 restores PyTorch's own default, None leaves the setting as it is."""
    if threads is None:
        return
    torch.set_num_threads(int(threads) if threads > 0 else TORCH_DEFAULT)


_APPLIED = False


def apply_default_threads() -> None:
    """Apply :func:`default_threads` once per process (the first import of a computing module calls it)."""
    global _APPLIED
    if not _APPLIED:
        _APPLIED = True
        set_threads(default_threads())
