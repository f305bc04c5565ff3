"""Options and helpers shared by CLI modules."""

from __future__ import annotations

import shlex
from typing import Annotated

import torch
import typer

from datarecon.errors import DataReconError
from datarecon.utils.device import parse_device  # noqa: F401  (the commands import it from here)

#: ``--threads`` of every command that computes (0: PyTorch's default, all cores)
#: (a negative count is refused by :func:`set_threads`, in the same words for every command)
ThreadsOption = Annotated[int, typer.Option("--threads", help="CPU threads for PyTorch (0: its default, "
                                            "all cores).")]

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


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (0 or None: leave PyTorch's default)."""
    if threads is None or threads == 0:
        return
    if threads < 0:
        raise DataReconError(f"--threads must be >= 0 (0 = PyTorch's default), got {threads}")
    torch.set_num_threads(int(threads))
