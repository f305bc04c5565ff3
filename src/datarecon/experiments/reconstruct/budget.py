"""``--runs auto``: as many pooled runs of one target as a time budget allows (:func:`budgeted_runs`).

K is chosen from the measured cost of run 0 on this machine, before any run starts: the time to
:func:`~datarecon.experiments.reconstruct.preparation.prepare` it, its step-size probe
(:func:`~datarecon.experiments.reconstruct.execution.probed`) and its first :data:`MEASURE_STEPS` steps
in memory. One run is estimated at ``prepare + probe + steps × seconds per step`` (no early stop assumed)
and K = ⌊budget / estimate⌋, at most :data:`~datarecon.experiments.reconstruct.preparation.MAX_BATCH_RUNS`.
The estimate is linear in K: exact in ``looped`` mode (the CPU default, runs stepped in turn), an upper
bound in ``batched`` mode (one vmapped step for all runs). run.json of every run and of the pool records
the budget, the measurement and K under ``runs_auto``; a resumed ``--runs auto`` takes K and that record
from the folder instead of measuring again (timings differ between calls; the runs must not).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.runner import run_attack
from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions, uncounted_loops
from datarecon.kernel.resume import folder_state
from datarecon.experiments.reconstruct.batch import run_name
from datarecon.experiments.reconstruct.execution import COUPLED_ALONE, probed
from datarecon.experiments.reconstruct.preparation import MAX_BATCH_RUNS, prepare
from datarecon.experiments.reconstruct.settings import ReconstructionRun, make_attack

__all__ = ["MEASURE_STEPS", "budgeted_runs", "measured_cost", "runs_for_budget"]

#: steps of run 0 timed to estimate a run's cost (fewer when the run is shorter)
MEASURE_STEPS = 20

#: the measurement's loop: no history kept beyond a row per step, no progress, no checkpoint
_MEASURE_LOOP = LoopOptions(log_every=MEASURE_STEPS, progress=False, checkpoint_every=0)


def measured_cost(run: ReconstructionRun, *, data_dir: str | Path | None = None, sources: Any = None) -> dict[str, Any]:
    """The measured cost of one run of ``run`` on this machine (seconds): ``prepare_seconds``, ``probe_seconds``,
    ``measured_steps``, ``seconds_per_step`` and the estimate ``seconds_per_run`` = prepare + probe + steps ×
    seconds per step. The measurement writes nothing and leaves ``run``'s own generator untouched."""
    if make_attack(run.method, run.method_config()).coupled():
        raise DataReconError("--runs auto times one run alone, but group consistency couples the runs; pass "
                             "--runs K with K >= 2, or set group_weight to 0")
    start = time.perf_counter()
    setup = prepare(run, data_dir=data_dir, sources=sources)
    prepared = time.perf_counter()
    attack, setup = probed(run, make_attack(run.method, run.method_config()), setup)
    probe_done = time.perf_counter()
    steps = min(MEASURE_STEPS, run.steps)
    generator = torch.Generator(device=setup.generator.device).set_state(setup.generator.get_state())
    with uncounted_loops():
        run_attack(attack, replace(setup, x0=setup.x0.clone(), generator=generator), steps=steps, out=None,
                   loop=_MEASURE_LOOP)
    per_step = (time.perf_counter() - probe_done) / max(steps, 1)
    return {"prepare_seconds": prepared - start, "probe_seconds": probe_done - prepared, "measured_steps": steps,
            "seconds_per_step": per_step,
            "seconds_per_run": (prepared - start) + (probe_done - prepared) + run.steps * per_step}


def runs_for_budget(budget_minutes: float, seconds_per_run: float, *, steps: int) -> int:
    """K = ⌊budget / seconds per run⌋, at most :data:`MAX_BATCH_RUNS`.

    Raises:
        DataReconError: a budget that is not a positive finite number of minutes, or one that fits no run.
    """
    if not math.isfinite(budget_minutes) or budget_minutes <= 0:
        raise DataReconError(f"--budget-minutes must be a positive number of minutes, got {budget_minutes:g}; "
                             "pass e.g. --budget-minutes 30")
    runs = math.floor(budget_minutes * 60 / max(seconds_per_run, 1e-9))
    if runs < 1:
        raise DataReconError(f"--budget-minutes {budget_minutes:g} fits no run: one run of {steps} steps was measured "
                             f"at about {seconds_per_run / 60:.3g} minutes here; pass --budget-minutes "
                             f"{math.ceil(seconds_per_run / 60 * 100) / 100:g} or more, or fewer --steps")
    return min(runs, MAX_BATCH_RUNS)


def budgeted_runs(run: ReconstructionRun, out: str | Path, *, budget_minutes: float, resume: bool = False,
                  data_dir: str | Path | None = None, sources: Any = None) -> tuple[int, dict[str, Any]]:
    """K for ``--runs auto`` and run.json's ``runs_auto`` record (module docstring); a resumed folder's own.

    Raises:
        DataReconError: a bad budget, one that fits no run, coupled runs, or a resumed folder made with
            another budget.
    """
    if resume:
        recorded = folder_state(Path(out) / run_name(0)).record
        if isinstance(recorded, dict) and isinstance(recorded.get("runs_auto"), dict):
            done = recorded["runs_auto"]
            if done.get("budget_minutes") != budget_minutes:
                raise DataReconError(f"--out {out} holds runs chosen for --budget-minutes {done.get('budget_minutes')}"
                                     f", not {budget_minutes:g}; resume with --budget-minutes "
                                     f"{done.get('budget_minutes')}, or choose another --out")
            return int(done["runs"]), done
    cost = measured_cost(run, data_dir=data_dir, sources=sources)
    runs = runs_for_budget(budget_minutes, cost["seconds_per_run"], steps=run.steps)
    if runs < 2 and make_attack(run.method, run.method_config()).coupled():
        raise DataReconError(COUPLED_ALONE)
    return runs, {"budget_minutes": budget_minutes, "runs": runs, **cost,
                  "estimate_minutes": runs * cost["seconds_per_run"] / 60, "capped": runs == MAX_BATCH_RUNS}
