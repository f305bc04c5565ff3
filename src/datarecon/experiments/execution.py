"""How the tasks of a sweep or an audit are fanned out: which backend, how many at once, how many threads.

:class:`Execution` is the one description both drivers take (:func:`~datarecon.experiments.sweep.run_sweep`,
:func:`~datarecon.experiments.audit.run_audit`); the command line builds it from its ``--backend``,
``--workers``, ``--ray-address`` and ``--threads`` options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from datarecon.errors import DataReconError


@dataclass(frozen=True)
class Execution:
    """Where and how wide the tasks of a sweep or an audit run.

    Attributes:
        backend: a :data:`datarecon.experiments.backends.BACKENDS` key (``local``: a process pool, in
            the driver process with one worker; ``ray``).
        workers: tasks in flight, >= 1 (None: the backend's default; local 1 = in the driver process,
            ray the cluster's CPU count).
        ray_address: Ray cluster address (``auto``, ``HOST:PORT``); None: an embedded Ray instance
            (or the ``address`` in ``options``). Only with ``backend="ray"``.
        options: further keyword options of the backend (e.g. ``{"num_cpus": 2}`` for an embedded
            Ray, ``{"address": ...}``).
        threads: torch threads per task (None or 0: the driver's default; see each driver).
    """

    backend: str = "local"
    workers: int | None = None
    ray_address: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    threads: int | None = None

    def backend_options(self) -> dict[str, Any]:
        """The keyword options of :func:`~datarecon.experiments.backends.make_backend`: ``options``,
        with ``ray_address`` as the Ray ``address`` unless ``options`` names one.

        Raises:
            DataReconError: a ``ray_address`` for a backend other than ``ray``.
        """
        opts = dict(self.options)
        if self.backend == "ray":
            opts.setdefault("address", self.ray_address)
        elif self.ray_address:
            raise DataReconError("--ray-address needs --backend ray")
        return opts


__all__ = ["Execution"]
