"""Python API for one reconstruction run: a typed :class:`ReconstructionRun` in, a run directory out.

A :class:`ReconstructionRun` describes one run completely (the model directory, the attack's
config as a union discriminated on ``method``, the initialisation as a union discriminated on
``name``, the candidate count, seed, device, early stop and checkpointing); a run file (YAML/TOML)
maps one-to-one to it (docs/RUNS.md). :func:`execute` is the one entry point that runs it:
``datarecon reconstruct`` (whose flags override a ``--config`` run file), sweeps (a run plus a
search space), the paper reproductions and experiment files all build a run and call it.

:func:`prepare` builds what an attack receives — the attacker's view of the target (θ*,
architecture, loss, weight decay), the attacker prior (m labels in the model's class proportions,
the pixel box of the model input space) — plus x₀ from the run's initialisation.

Data-dependent initialisations (``ground-truth``, ``partition``, ``mix``) are
the experimenter's explicit choice (Runkel et al. 2024, §4.3/§4.5): only then
are images loaded, from the model's own data spec, and handed to the
initialisation — never to the attack. Their labels then come with the images.

The package, by responsibility: :mod:`.settings` (the typed run and its layers), :mod:`.preparation`
(what the attack receives, the checks against the target), :mod:`.execution` (one run into its
directory: probe, retries, resume), :mod:`.batch` (K runs of one target and their pool) and :mod:`.budget`
(K chosen to fit a time budget: ``--runs auto``).

Example:
    >>> from datarecon.experiments.reconstruct import ReconstructionRun, execute
    >>> run = ReconstructionRun.model_validate({"model": "model-dir", "attack": {"method": "kkt", "steps": 500}})
    >>> rec = execute(run, "run-dir")  # doctest: +SKIP
"""

from datarecon.experiments.reconstruct.settings import (
    MAX_RETRIES,
    OWN_MODEL,
    RETRY_FACTOR,
    STEP_PROBE_STEPS,
    CheckpointSettings,
    EarlyStopSettings,
    ReconstructionRun,
    RunLayers,
    RunSettings,
    attack_spec,
    build_run,
    init_spec,
    layered_init_name,
    load_run,
    make_attack,
    method_config,
    run_fields,
    run_from_layers,
    with_preset,
)
from datarecon.experiments.reconstruct.preparation import (
    CANDIDATE_COPIES,
    DATA_INITS_NOTE,
    MAX_BATCH_RUNS,
    TargetRecord,
    check_before_target,
    default_candidates,
    init_sources,
    prepare,
)
from datarecon.experiments.reconstruct.execution import (
    RunOptions,
    early_stop_rule,
    execute,
    loop_options,
    probed,
    reconstruct,
    save_subspace,
)
from datarecon.experiments.reconstruct.batch import coupled_mode, execute_batch, pool_runs, reconstruct_runs, run_name
from datarecon.experiments.reconstruct.budget import MEASURE_STEPS, budgeted_runs, measured_cost, runs_for_budget

__all__ = [
    "CANDIDATE_COPIES", "DATA_INITS_NOTE", "MAX_BATCH_RUNS", "MEASURE_STEPS", "MAX_RETRIES", "OWN_MODEL", "RETRY_FACTOR",
    "STEP_PROBE_STEPS", "CheckpointSettings", "EarlyStopSettings", "ReconstructionRun", "RunLayers",
    "RunOptions", "RunSettings", "TargetRecord", "attack_spec", "budgeted_runs", "build_run",
    "check_before_target", "coupled_mode", "default_candidates", "early_stop_rule", "execute", "execute_batch",
    "init_sources", "init_spec", "layered_init_name", "load_run", "loop_options", "make_attack", "measured_cost", "method_config",
    "pool_runs", "prepare", "probed", "reconstruct", "reconstruct_runs", "run_fields", "run_from_layers", "run_name",
    "runs_for_budget", "save_subspace", "with_preset",
]
