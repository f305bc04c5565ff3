"""The sweep worker: run one attack into its own run directory and return a small summary.

:func:`execute_task` is the function every backend calls (in a spawned process, a Ray worker or
the driver itself). It writes only inside its run directory (run contract: ``run.json``,
``candidates.safetensors``, ``history.jsonl``, ``checkpoint/``) plus a one-line claim file
(``.claim``: pid and attempt) that lets the local backend tell which process died. A retried task
resumes from the run's checkpoint (bit-identical on CPU), so a crash costs at most
``checkpoint_every`` steps. It never touches the store index: the driver does.

Test-only fault injection: a payload may carry ``fault = {"attempts": a, "at_step": k, "code": c}``
(set by the driver from the ``DATARECON_SWEEP_FAULTS`` environment variable, never from a sweep
config): while ``attempt < a`` the worker process calls ``os._exit(c)`` after step ``k``, as if it
had been killed.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from datarecon.experiments.sweep.runs import run_from_spec
from datarecon.experiments.sweep.config import RunSpec
from datarecon.kernel.engine import BaseHook, LoopState
from datarecon.kernel.files import RUN_JSON
from datarecon.kernel.resume import folder_state
from datarecon.kernel.status import FINISHED as STATUS_FINISHED
from datarecon.utils.io import atomic_write_text, read_json

CLAIM_FILE = ".claim"
FINISHED = STATUS_FINISHED  # complete, stopped-early, diverged (datarecon.kernel.status)


class _Crash(BaseHook):
    """Kill this process after step ``at_step`` (test-only fault injection)."""

    def __init__(self, at_step: int, code: int) -> None:
        self.at_step, self.code = at_step, code

    def after_step(self, state: LoopState) -> None:
        if state.step >= self.at_step:
            os._exit(self.code)


def summary_of(run_dir: str | Path) -> dict[str, Any]:
    """The small result a worker returns: status, steps, wall time, final loss terms, selection."""
    run = read_json(Path(run_dir) / RUN_JSON)
    return {"status": run.get("status"), "steps_done": run.get("steps_done"), "wall_time_s": run.get("wall_time_s"),
            "final": run.get("final") or {}, "selection": run.get("selection") or {}}


def execute_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Run the task ``payload`` (made by the sweep driver) and return its summary.

    Payload keys: ``key``, ``spec`` (a :class:`~datarecon.experiments.sweep.config.RunSpec` dump),
    ``run_dir``, ``attempt``, ``claim_file``, ``num_threads`` (None: leave torch's setting),
    ``checkpoint_every``, optional ``fault``.

    Returns:
        ``{"key", "status", "steps_done", "wall_time_s", "final", "selection", "pid", "host",
        "task_time_s", "resumed"}``.
    """
    t0 = time.perf_counter()
    if payload.get("num_threads"):
        torch.set_num_threads(int(payload["num_threads"]))
    run_dir = Path(payload["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(payload.get("claim_file") or run_dir / CLAIM_FILE, f"{os.getpid()} {payload.get('attempt', 0)}\n")
    resumed = False
    found = folder_state(run_dir)
    if not found.finished:
        hooks = []
        fault = payload.get("fault")
        if fault and int(payload.get("attempt", 0)) < int(fault.get("attempts", 1)):
            hooks.append(_Crash(int(fault.get("at_step", 1)), int(fault.get("code", 17))))
        resumed = found.checkpoint
        spec = RunSpec.model_validate(payload["spec"])
        run_from_spec(spec, out=run_dir, resume=True, progress=False, hooks=hooks,
                      checkpoint_every=int(payload.get("checkpoint_every") or 100))
    return {"key": payload["key"], **summary_of(run_dir), "pid": os.getpid(), "host": socket.gethostname(),
            "task_time_s": time.perf_counter() - t0, "resumed": resumed}
