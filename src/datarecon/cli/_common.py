"""Options and helpers shared by CLI modules."""

from __future__ import annotations

import os
import shlex
from typing import Annotated

import typer

from datarecon.errors import DataReconError
from datarecon.utils import threads as _threads

#: the default of ``--threads``: datarecon's one thread default (:data:`datarecon.utils.threads.DEFAULT_THREADS`,
#: which the Python API applies too); ``--threads 0`` asks for PyTorch's default
DEFAULT_THREADS = _threads.DEFAULT_THREADS

#: why the default is one thread, in every command's help
THREADS_WHY = "1, the default: fastest for small models, and the same bytes on every machine"


def threads_help(*, per: str = "", zero: str = "PyTorch's default, all cores, for large models") -> str:
    """The help of a ``--threads`` option: what the threads are for (``per``: " per run"), why the default is
    :data:`DEFAULT_THREADS`, and what 0 means for this command."""
    return f"CPU threads for PyTorch{per} ({THREADS_WHY}; 0: {zero})."


#: ``--threads`` of every command that computes (a negative count, or more than the CPU cores,
#: is refused by :func:`set_threads`, in the same words for every command); default :data:`DEFAULT_THREADS`
ThreadsOption = Annotated[int, typer.Option("--threads", help=threads_help())]

#: ``--device`` of the commands that run pieces on a device (reproduce, audit); the commands built
#: from a typed run or config (train, reconstruct) take it from the ``device`` field, whose help reads the same
DeviceOption = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")]

#: the arguments of the running ``datarecon`` invocation (set by :func:`datarecon.cli.main.main`)
_ARGV: list[str] = []


def set_invocation(args: list[str]) -> None:
    """Remember the command line being run (for the 'how to continue' hints written into run records)."""
    _ARGV[:] = list(args)


def command_line(*, add: tuple[str, ...] = (), drop: tuple[str, ...] = ("--resume", "--overwrite")) -> str | None:
    """The running command as a shell line, without the flags ``drop`` and with ``add`` (None outside the CLI)."""
    if not _ARGV:
        return None
    args = [a for a in _ARGV if a not in drop] + list(add)
    return " ".join(shlex.quote(a) for a in ["datarecon", *args])


def resume_command() -> str | None:
    """How to continue the running ``train``/``reconstruct``: the same command with ``--resume``."""
    return command_line(add=("--resume",))


def cpu_count() -> int:
    """The CPU cores this process may run on (its affinity where the platform says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (0: PyTorch's default, restored even after the import applied datarecon's one thread;
    None: leave the setting).

    Raises:
        DataReconError: a negative count, or more threads than this process has CPU cores
            (``--threads 10000``: a typo; more threads than cores only adds contention).
    """
    if threads is None:
        return
    check_threads(threads)
    _threads.set_threads(int(threads))


def check_threads(threads: int) -> int:
    """``threads`` when it is a thread count this machine can run (0: PyTorch's default).

    Raises:
        DataReconError: a negative count, or more than :func:`cpu_count`.
    """
    if threads < 0:
        raise DataReconError(f"--threads must be >= 0 (0 = PyTorch's default), got {threads}")
    if threads > cpu_count():
        raise DataReconError(f"--threads {threads} exceeds the {cpu_count()} CPU cores this process may use; pass at "
                             f"most {cpu_count()} (0 = PyTorch's default)")
    return threads
