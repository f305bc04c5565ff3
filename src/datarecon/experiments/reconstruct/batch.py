"""K runs of one target stepped together (:func:`execute_batch`, ``reconstruct --runs K``) and their pool
(:func:`reconstruct_runs`, :func:`pool_runs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import (
    AttackSetup,
    Reconstruction,
)
from datarecon.attacks.batched import BatchMember, resolve_mode, run_batched
from datarecon.attacks.selection import CRITERIA, DEFAULT_CRITERION
from datarecon.errors import DataReconError
from datarecon.experiments.pool import PoolSpec, write_pool
from datarecon.kernel.files import RUN_JSON
from datarecon.kernel.outdir import claim_out_dir
from datarecon.kernel.resume import folder_state
from datarecon.kernel.status import EVALUABLE, Status
from datarecon.utils.io import read_json
from datarecon.experiments.reconstruct.execution import (COUPLED_ALONE, RunOptions, early_stop_rule, execute_claimed,
                                                         loop_options, probed, save_subspace)
from datarecon.experiments.reconstruct.preparation import MAX_BATCH_RUNS, refuse_candidates_beyond_memory, prepare
from datarecon.experiments.reconstruct.settings import ReconstructionRun, make_attack


def coupled_mode(run: ReconstructionRun, mode: str, runs: int) -> str:
    """The batch mode of ``runs`` copies of ``run`` (:func:`~datarecon.attacks.batched.resolve_mode`), where a
    prior that couples the runs (``group_weight`` > 0) needs them stepped as one group: ``auto`` resolves
    to ``batched`` then, ``looped`` and a single run are refused."""
    if not make_attack(run.method, run.method_config()).coupled():
        return resolve_mode(mode, run.device)
    if runs < 2:
        raise DataReconError(COUPLED_ALONE)
    resolved = resolve_mode(mode, run.device) if mode != "auto" else "batched"
    if resolved != "batched":
        raise DataReconError("group consistency couples the runs in one step; --batch-mode looped steps them "
                             "one by one: pass --batch-mode batched (or auto)")
    return resolved


def run_name(index: int) -> str:
    """Folder name of run ``index`` of :func:`reconstruct_runs` (``run0``, ``run1``, ...)."""
    return f"run{index}"


def execute_batch(runs: Sequence[ReconstructionRun], outs: Sequence[str | Path], options: RunOptions = RunOptions(), *,
                  setups: Sequence[AttackSetup], mode: str = "auto") -> list[Reconstruction]:
    """Execute K runs on one target stepped together (:func:`~datarecon.attacks.batched.run_batched`);
    the one way runs execute as a batch (``--runs K`` and the reproductions' batched pieces).

    Run j is written to ``outs[j]`` exactly as a single run of ``runs[j]`` is (its own attack,
    x₀, generator, seed, early stop, checkpoints and history); the runs share one target and,
    in ``mode="batched"``, one vmapped gradient and one update per step for runs of one objective.

    Args:
        runs: the K typed runs (one model; one dtype, checkpoint and log period; steps may differ).
        outs: their run directories (claimed by the caller).
        options: resume (each run continues from its own checkpoint where it has one), progress (of
            the first run), hooks (:class:`RunOptions`).
        setups: :func:`prepare` of each run (target, prior, x₀, generator), with each run's
            ``run.json`` extras in its ``record``.
        mode: ``batched`` | ``looped`` | ``auto`` (looped on CPU, batched on CUDA;
            :func:`datarecon.attacks.batched.resolve_mode`).

    Returns:
        One :class:`~datarecon.attacks.base.Reconstruction` per run, in order.
    """
    shared = {(run.checkpoint.every, run.checkpoint.log_every) for run in runs}
    if len(shared) != 1:
        raise DataReconError(f"the runs of a batch checkpoint and log at {sorted(shared)} steps; give them one period")
    attacks = [probed(run, make_attack(run.method, run.method_config()), setup) for run, setup in zip(runs, setups, strict=True)]
    members = [BatchMember(attack=attack, prior=setup.prior, x0=setup.x0,
                           generator=setup.generator, out=Path(out), seed=run.seed, early_stop=early_stop_rule(run),
                           record=dict(setup.record))
               for run, out, (attack, setup) in zip(runs, outs, attacks, strict=True)]
    steps = {run.steps for run in runs}
    return run_batched(members, setups[0].target, mode=mode, steps=steps.pop() if len(steps) == 1 else None,
                       loop=loop_options(runs[0], options))


def reconstruct_runs(run: ReconstructionRun, out: str | Path, options: RunOptions = RunOptions(), *, runs: int,
                     mode: str = "auto", sources: Any = None, record: Mapping[str, Any] | None = None,
                     criterion: str = DEFAULT_CRITERION) -> list[Reconstruction]:
    """``runs`` copies of ``run`` with seeds ``run.seed + j``, executed as one batch (:func:`execute_batch`),
    and their pool.

    Run j is exactly the run :func:`execute` makes of ``run`` with ``seed + j`` (its own x₀, λ₀ and
    generator; its run.json holds that run under ``run``, so ``execute`` of it reproduces run j, bit
    for bit in ``looped`` mode), written to the run directory ``out/run<j>`` (:func:`run_name`); KKT / DecoReco runs
    share one vmapped gradient per step in ``mode="batched"``, other methods are stepped in turn.
    ``out`` itself then becomes a run directory of method ``pool``: the candidates of every run that
    finished (complete or stopped early), in run order, as ``datarecon sweep pool`` writes them
    (:func:`datarecon.experiments.pool.write_pool`), so ``datarecon evaluate OUT`` evaluates
    the K runs as one result.

    Args:
        run: the typed run of run 0 (a model directory).
        options: as in :func:`execute`; ``overwrite``/``resume`` apply to ``out`` as a whole
            (``overwrite`` deletes only what datarecon wrote there).
        runs: K ≥ 1.
        mode: ``batched`` | ``looped`` | ``auto`` (the default: looped on CPU, where batching
            measured slower, batched on CUDA; :func:`datarecon.attacks.batched.resolve_mode` on
            ``run.device``). run.json records the mode it resolved to.
        sources: as in :func:`execute`.
        record: extra ``run.json`` fields of every run and of the pool (e.g. ``resume_command``).
        criterion: the attacker-side criterion whose best value the pool records.

    Returns:
        One :class:`~datarecon.attacks.base.Reconstruction` per run, in run order.

    Raises:
        DataReconError: runs < 1, an unknown mode, bad settings, or an ``out`` that may not be
            written (see :func:`execute`).
    """
    if runs < 1:
        raise DataReconError(f"--runs must be at least 1, got {runs}; pass --runs K with K >= 1")
    if runs > MAX_BATCH_RUNS:
        raise DataReconError(f"--runs {runs} is more than {MAX_BATCH_RUNS:,} runs of one target in one folder; pass "
                             "fewer, or run a sweep with a budget (datarecon sweep)")
    mode = coupled_mode(run, mode, runs)
    if options.overwrite and options.resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    out = Path(out)
    found = folder_state(out).record if options.resume else None
    if found is not None and not found.get("batch"):  # its candidates would be replaced by the pool's
        raise DataReconError(f"--out {out} holds a single {found.get('method')} run, not the folder of --runs K; "
                             "resume it without --runs, or choose another --out for the K runs")
    with claim_out_dir(out, kind="run", overwrite=options.overwrite, resume=options.resume, nested=options.nested) as claim:
        members = [run.model_copy(update={"seed": run.seed + j}) for j in range(runs)]
        first = prepare(members[0], data_dir=options.data_dir, sources=sources)
        refuse_candidates_beyond_memory(first.prior.m, first.target.input_shape, run.dtype, runs=runs)
        setups = [first, *(prepare(r, data_dir=options.data_dir, sources=sources) for r in members[1:])]
        stop = {"patience": run.early_stop.patience, "rel_tol": run.early_stop.rel_tol}
        setups = [replace(setup, record={**setup.record, "early_stop": stop,
                                         "batch": {"runs": runs, "index": j, "mode": mode},
                                         "run": member.model_dump(mode="json"), **dict(record or {})})
                  for j, (member, setup) in enumerate(zip(members, setups, strict=True))]
        claim.prepare()  # only now: a bad model or setting leaves the old runs untouched
        starts = [setup.generator.get_state() for setup in setups]
        recs = execute_batch(members, [out / run_name(j) for j in range(runs)], options, setups=setups, mode=mode)
        for j, rec in enumerate(recs):  # a diverged run is retried alone at smaller step sizes when asked
            if rec.status == Status.DIVERGED and run.retry_diverged:
                fresh = torch.Generator(device=setups[j].generator.device).set_state(starts[j])
                recs[j] = execute_claimed(members[j], out / run_name(j), replace(options, resume=True, overwrite=False),
                                   setup=replace(setups[j], generator=fresh),
                                   attack=make_attack(run.method, members[j].method_config()))
        for j, setup in enumerate(setups):
            save_subspace(out / run_name(j), setup.prior)
        pool_runs(out, recs, model_dir=str(run.model), criterion=criterion,
                  record={"batch": {"runs": runs, "mode": mode, "method": run.method}, **dict(record or {})})
        return recs


def pool_runs(out: Path, recs: Sequence[Reconstruction], *, model_dir: str, criterion: str = DEFAULT_CRITERION,
              record: Mapping[str, Any] | None = None) -> Path | None:
    """Pool the finished runs ``out/run<j>`` of :func:`reconstruct_runs` into the run directory ``out``.

    Runs that did not finish (diverged) are left out; with none finished nothing is written.

    Returns:
        ``out``, or None when no run finished.
    """
    mode = "max" if CRITERIA.get(criterion).better == "higher" else "min"
    sources = []
    for j, rec in enumerate(recs):
        if rec.status not in EVALUABLE:
            continue
        value = (rec.summary.get("selection", {}).get(criterion) or {}).get("value")
        sources.append({"key": run_name(j), "run_dir": run_name(j), "score": value, "params": {"seed_offset": j}})
    if not sources:
        return None
    config = {"runs": len(recs), "criterion": criterion, "mode": mode, "sources": [s["key"] for s in sources]}
    recorded = read_json(out / sources[0]["run_dir"] / RUN_JSON).get("model_dir", model_dir)
    return write_pool(out, sources, root=out, model_dir=recorded,
                      spec=PoolSpec(config=config, criterion=criterion, mode=mode), record=record)
