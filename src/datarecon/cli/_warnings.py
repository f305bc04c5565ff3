"""How warnings reach a command-line user: ``warning: <message>`` on one line, each thing said once.

Python's default display prints the file, line number and source line of the code that warned
("/…/cli/reconstruct.py:252: UserWarning: …" and the line below it): internals a user cannot act
on, and the same fact can arrive twice in two wordings (a measured non-homogeneous model, then the
attack's own check). :func:`cli_warnings` shows each warning as one line, once per message and once
per topic of :data:`TOPICS`, and leaves out what the command reports itself (:data:`REPORTED`).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

from datarecon.kernel.status import Status

__all__ = ["TOPICS", "REPORTED", "cli_warnings", "warning_line"]

#: Warnings mentioning one of these say the same thing in other words: the first one is shown.
TOPICS: tuple[str, ...] = ("homogeneous",)
#: Runtime warnings the command reports in its own output (a diverged run ends in its error line or
#: its summary line), so they are not shown twice.
REPORTED: tuple[str, ...] = (Status.DIVERGED,)


def warning_line(message: object) -> str:
    """``warning: <message>`` with the message's whitespace folded onto one line."""
    return "warning: " + " ".join(str(message).split())


@contextlib.contextmanager
def cli_warnings() -> Iterator[None]:
    """Within the block, show warnings as one ``warning: …`` line each on stderr, once per topic."""
    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001 - warnings API
        text = " ".join(str(message).split())
        low = text.lower()
        if issubclass(category, RuntimeWarning) and any(k in low for k in REPORTED):
            return
        key = next((t for t in TOPICS if t in low), text)
        if key in seen:
            return
        seen.add(key)
        print(warning_line(text), file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
