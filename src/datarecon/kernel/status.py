"""The one status vocabulary of every loop: target training, attacks, sweeps, evaluation, experiments.

Files store the string values (``run.json`` ``status``, a model card's ``metrics.status``, the
sweep store, ``experiment.json`` stages). :meth:`Status.parse` also reads the words older
versions wrote for training (``completed``, ``stopped``, ``interrupted``), so existing folders
still load.
"""

from __future__ import annotations

from enum import StrEnum

from datarecon.errors import DataReconError


class Status(StrEnum):
    """Where a loop stands.

    Members:
        RUNNING: started and not finished (killed or interrupted runs stay ``running`` on disk).
        COMPLETE: ran every step it was asked to.
        STOPPED_EARLY: an attacker-side or training stop rule ended it before the last step.
        DIVERGED: a step produced NaN/inf; the last finite state was kept.
    """

    RUNNING = "running"
    COMPLETE = "complete"
    STOPPED_EARLY = "stopped-early"
    DIVERGED = "diverged"

    @classmethod
    def parse(cls, value: str) -> Status:
        """The status named ``value`` (including the legacy training words).

        Raises:
            DataReconError: an unknown word (the message lists the valid ones).
        """
        try:
            return cls(LEGACY.get(value, value))
        except ValueError:
            raise DataReconError(f"unknown status {value!r}; valid: {', '.join(s.value for s in cls)}") from None

    @property
    def finished(self) -> bool:
        """Whether the loop will not continue by itself (complete, stopped early or diverged)."""
        return self is not Status.RUNNING

    @property
    def evaluable(self) -> bool:
        """Whether its result is a finished optimisation (complete or stopped early)."""
        return self in (Status.COMPLETE, Status.STOPPED_EARLY)


#: words written by older versions → the current value
LEGACY = {"completed": "complete", "stopped": "stopped-early", "interrupted": "running"}
FINISHED = tuple(s.value for s in Status if s.finished)
EVALUABLE = tuple(s.value for s in Status if s.evaluable)
