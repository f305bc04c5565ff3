"""User-facing errors.

Every error a user can cause by bad input (a missing file, an unknown name, a
bad value) is raised as :class:`DataReconError` with a one-line message that
names the problem and the fix. The CLI turns it into ``error: <message>`` and
exit code 2, never a traceback.
"""

from __future__ import annotations


class DataReconError(Exception):
    """A problem the user can fix; its message is one line: problem + fix.

    The message names the fix in the command line's words (``--overwrite``); ``python`` spells the same fix for
    the Python API (``overwrite=True``). ``str(error)``, what a Python caller sees, adds it in parentheses;
    the command line prints :attr:`cli_message`, without it (a user of the command line called no Python).
    """

    def __init__(self, *args: object, python: str | None = None) -> None:
        super().__init__(*args)
        self.python = python

    @property
    def cli_message(self) -> str:
        """The message as the command line prints it (without the Python spelling of the fix)."""
        return super().__str__()

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} (in Python: {self.python})" if self.python else text


class DataMissingError(DataReconError):
    """Data files are not where the loader looked."""


class CheckpointError(DataReconError):
    """A model or run directory is missing, tampered, or unsafe to load."""


class DivergenceError(DataReconError):
    """An optimisation produced NaN/inf; the last finite state was kept."""


class DiskFullError(DataReconError):
    """A write failed because the disk (or quota) is full; the file written keeps its old content.

    Attributes:
        path: the file being written (the CLI names it and how the command continues).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
