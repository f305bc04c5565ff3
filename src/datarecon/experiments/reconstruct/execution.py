"""One run executed into its run directory (:func:`execute`, :func:`reconstruct`): the output folder's claim,
the step-size probe, the run through the attack loop, its retries at smaller step sizes and its resume."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import (
    ATTACK_LOOP,
    ATTACKS,
    AttackerPrior,
    AttackSetup,
    Reconstruction,
    Target,
)
from datarecon.attacks.probe import probe_step_sizes, scaled
from datarecon.attacks.runner import run_attack
from datarecon.attacks.loop import Plateau
from datarecon.attacks.subspace import SUBSPACE_FILE, save_analysis
from datarecon.errors import DataReconError, DivergenceError
from datarecon.kernel.losses import loss_name
from datarecon.kernel.outdir import claim_out_dir
from datarecon.kernel.resume import folder_state
from datarecon.kernel.status import Status
from datarecon.kernel.engine import LoopOptions
from datarecon.experiments.reconstruct.preparation import prepare
from datarecon.experiments.reconstruct.settings import (OWN_MODEL, RETRY_FACTOR, ReconstructionRun, RunSettings,
                                                        build_run, make_attack)


@dataclass(frozen=True)
class RunOptions:
    """How a run is executed: where it continues from, what it shows, what it does on divergence.
    None of it changes the result.

    Attributes:
        resume: continue from ``out/checkpoint`` (bit-identical on CPU); a finished run is returned as it was.
        overwrite: replace an existing run directory ``out`` (only after the model and settings were
            accepted; only what datarecon wrote there).
        progress: show progress with the loss terms (the first run's, for a batch).
        data_dir: data folder (read only by data-dependent initialisations).
        hooks: extra engine hooks (e.g. test-only fault injection).
        raise_on_divergence: raise :class:`DivergenceError` instead of returning a diverged result.
        nested: ``out`` lies inside a folder the caller claimed itself (a demo's or experiment's
            ``run/``, a reproduction piece, a sweep store's run); otherwise a path inside another
            datarecon folder is refused (:func:`datarecon.kernel.outdir.check_outside`).
    """

    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    data_dir: str | Path | None = None
    hooks: tuple[Any, ...] = ()
    raise_on_divergence: bool = False
    nested: bool = False


def execute(run: ReconstructionRun, out: str | Path, options: RunOptions = RunOptions(), *, setup: AttackSetup | None = None,
            sources: Any = None, target: Target | None = None, record: Mapping[str, Any] | None = None
            ) -> Reconstruction:
    """Run ``run`` into the run directory ``out`` (docs/dev/CONTRACTS.md); the one way a run executes.

    Args:
        run: the complete description of the run.
        out: run directory (created; resumed with ``options.resume``). An existing non-empty ``out`` is
            refused unless ``options.resume`` or ``options.overwrite``; ``overwrite`` replaces only a run directory
            (:mod:`datarecon.kernel.outdir`), and only after the model and settings were accepted.
        options: resume, overwrite, progress, data folder, hooks, divergence (:class:`RunOptions`).
        setup: a ready :func:`prepare` result of ``run`` (the caller needs x₀ itself).
        sources: ready :class:`~datarecon.attacks.init.InitSources` (skips loading the data).
        target: a user's own model (:meth:`Target.from_module`) attacked instead of ``run.model``.
        record: extra fields for run.json.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction` (also written to ``out``; run.json
        holds the run under ``run``).

    Raises:
        DataReconError: bad model, settings or output folder; a checkpoint of another run.
    """
    if options.overwrite and options.resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    with claim_out_dir(out, kind="run", overwrite=options.overwrite, resume=options.resume, nested=options.nested) as claim:
        cfg = run.method_config()
        if setup is None:
            setup = prepare(run, data_dir=options.data_dir, sources=sources, target=target)
        attack = make_attack(run.method, cfg)
        if attack.coupled():
            raise DataReconError(COUPLED_ALONE)
        claim.prepare()  # only now: a bad model or setting leaves the old run untouched
        return execute_claimed(run, out, options, setup=replace(setup, record=_run_record(run, attack, setup, target, record)),
                        attack=attack)


def _run_record(run: ReconstructionRun, attack: Any, setup: AttackSetup, target: Target | None,
                record: Mapping[str, Any] | None) -> dict[str, Any]:
    """What run.json records about ``run`` besides the attack: the set-up, the early stop, the run
    itself, a user's model's input space, and the caller's ``record`` (dict fields merged)."""
    stop = run.early_stop
    rec_meta = {**setup.record, "early_stop": {"patience": stop.patience, "rel_tol": stop.rel_tol},
                "run": run.model_dump(mode="json")}
    if attack.subspace_candidates and isinstance(rec_meta.get("knowledge"), dict):
        # what the default (subspace: null) resolved to for this attacker
        rec_meta["knowledge"] = {**rec_meta["knowledge"], "subspace_candidates": attack.uses_subspace(setup.prior)}
    if target is not None:  # a user's own model: what evaluation needs to map its inputs to images

        rec_meta["model_dir"] = None
        rec_meta["own_model"] = {"value_range": list(target.value_range or (0.0, 1.0)),
                                 "input_shape": list(target.input_shape), "loss": loss_name(target.loss),
                                 "weight_decay": float(target.weight_decay),
                                 "homogeneous_measured": target.homogeneous}
    for key, value in dict(record or {}).items():
        rec_meta[key] = {**rec_meta[key], **value} if isinstance(rec_meta.get(key), dict) and isinstance(value, dict) \
            else value
    return {"seed": run.seed, **rec_meta}


def early_stop_rule(run: ReconstructionRun) -> Any:
    """The run's attacker-side early stop (a plateau of the metric its attack declares,
    :attr:`~datarecon.attacks.base.Attack.early_stop_metric`), or None when ``patience`` is 0.

    Raises:
        DataReconError: an early stop asked of an attack that declares no metric for it.
    """
    stop = run.early_stop
    if not stop.patience:
        return None
    return Plateau.of(ATTACKS.get(run.method), patience=stop.patience, rel_tol=stop.rel_tol)


def loop_options(run: ReconstructionRun, options: RunOptions) -> LoopOptions:
    """The run's loop settings (:class:`~datarecon.kernel.engine.LoopOptions`): its checkpoint and log
    periods with the execution's resume, progress and hooks."""
    return replace(ATTACK_LOOP, log_every=run.checkpoint.log_every, progress=options.progress,
                   checkpoint_every=run.checkpoint.every, resume=options.resume, hooks=tuple(options.hooks))


def probed(run: ReconstructionRun, attack: Any, setup: AttackSetup) -> tuple[Any, AttackSetup]:
    """The attack with the step sizes the probe chose for ``run`` (:func:`~datarecon.attacks.probe.probe_step_sizes`),
    and the set-up whose record says so when they changed."""
    result = probe_step_sizes(attack, setup, steps=min(run.step_probe, run.steps))
    if result.scale == 1.0:
        return attack, setup
    return result.attack, replace(setup, record={**setup.record, "step_probe": result.record})


def execute_claimed(run: ReconstructionRun, out: str | Path, options: RunOptions, *, setup: AttackSetup, attack: Any
                    ) -> Reconstruction:
    """The body of :func:`execute` once ``out`` is claimed and prepared (``setup.record``: all of run.json's extras):
    the probe, the run, and its retries at smaller step sizes while it diverges and ``run.retry_diverged`` allows."""
    attack, setup = probed(run, attack, setup)
    start = setup.generator.get_state()
    attack, setup, resume = _resumed_retries(run, Path(out), options, attack, setup)
    while True:
        rec = run_attack(attack, setup, steps=run.steps, out=out, loop=replace(loop_options(run, options), resume=resume),
                         early_stop=early_stop_rule(run))
        if rec.status != Status.DIVERGED or len(_retries(setup)["tried"]) >= run.retry_diverged:
            break
        attack, setup = _retried(run, attack, setup, diverged_at=rec.steps_done, start=start)
        resume = False
    save_subspace(out, setup.prior)
    if options.raise_on_divergence and rec.status == Status.DIVERGED:
        raise DivergenceError(rec.summary.get("message", f"{run.method} diverged") + f" (last finite state in {out})")
    return rec


def _retries(setup: AttackSetup) -> dict[str, Any]:
    """run.json's ``retry_diverged`` of ``setup``: the factor on the probed step sizes and the settings that diverged."""
    return setup.record.get("retry_diverged") or {"scale": 1.0, "tried": []}


def _retried(run: ReconstructionRun, attack: Any, setup: AttackSetup, *, diverged_at: int,
             start: torch.Tensor) -> tuple[Any, AttackSetup]:
    """The next try of a run whose ``attack`` diverged at step ``diverged_at``: every step size times
    :data:`RETRY_FACTOR`, the generator back at its ``start`` state (the same x₀ and λ₀), the record saying so."""
    done = _retries(setup)
    sizes = {f: getattr(attack.config, f) for f in attack.step_size_fields}
    tried = [*done["tried"], {"scale": done["scale"], "diverged_at": diverged_at, "step_sizes": sizes}]
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sizes.items())
    warnings.warn(f"{run.method} diverged at step {diverged_at} with {shown}; retrying from the start with every step "
                  f"size x{RETRY_FACTOR:g} (retry {len(tried)} of {run.retry_diverged})", UserWarning, stacklevel=3)
    generator = torch.Generator(device=setup.generator.device).set_state(start)
    record = {**setup.record, "retry_diverged": {"scale": done["scale"] * RETRY_FACTOR, "tried": tried}}
    return scaled(attack, RETRY_FACTOR), replace(setup, generator=generator, record=record)


def _resumed_retries(run: ReconstructionRun, out: Path, options: RunOptions, attack: Any,
                     setup: AttackSetup) -> tuple[Any, AttackSetup, bool]:
    """A resumed run continues at the step sizes of its last retry; one that had diverged is retried now when
    ``run.retry_diverged`` allows another try. Returns (attack, set-up, whether to resume the checkpoint)."""
    recorded = folder_state(out).record if options.resume else None
    if recorded is None:
        return attack, setup, options.resume
    done = recorded.get("retry_diverged")
    if isinstance(done, dict):
        for _ in done.get("tried") or []:  # the step sizes each retry ran at, multiplied as the retries did
            attack = scaled(attack, RETRY_FACTOR)
        setup = replace(setup, record={**setup.record, "retry_diverged": done})
    if recorded.get("status") == Status.DIVERGED and len(_retries(setup)["tried"]) < run.retry_diverged:
        attack, setup = _retried(run, attack, setup, diverged_at=int(recorded.get("steps_done") or 0),
                                 start=setup.generator.get_state())
        return attack, setup, False
    return attack, setup, True


def save_subspace(out: str | Path, prior: AttackerPrior) -> None:
    """Write the prior's subspace analysis beside the run (``subspace.safetensors``), if it has one and the run
    has none yet (a resumed run's is the same: the analysis is the prior's, which the resume key covers)."""
    if prior.subspace is not None and not (Path(out) / SUBSPACE_FILE).is_file():

        save_analysis(Path(out) / SUBSPACE_FILE, prior.subspace)


def reconstruct(model: str | Path | Target, settings: Mapping[str, Any] | RunSettings, out: str | Path,
                options: RunOptions = RunOptions(), *, sources: Any = None) -> Reconstruction:
    """Attack ``model`` with the run ``settings`` (a run without its model) into ``out``: builds the
    :class:`ReconstructionRun` and :func:`execute` s it.

    Args:
        model: the target's model directory (``run.model``), or a user's own model
            (:meth:`Target.from_module`; ``run.model`` then reads ``"<own module>"``).
        settings: every field of a run but ``model``, as in a run file (docs/RUNS.md), e.g.
            ``{"attack": {"method": "kkt", "steps": 500, "lr_x": 0.01}, "init": {"name": "gaussian",
            "scale": 0.05}, "candidates": 40, "seed": 0}``; or a :class:`RunSettings`.
        out: run directory; see :func:`execute`.
        options, sources: see :func:`execute`.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction` (also written to ``out``).

    Raises:
        DataReconError: see :func:`execute` and :func:`build_run`.
    """
    fields = settings.model_dump() if isinstance(settings, RunSettings) else dict(settings)
    own = model if isinstance(model, Target) else None
    run = build_run({"model": OWN_MODEL if own is not None else str(model), **fields})
    return execute(run, out, options, sources=sources, target=own)


#: the refusal of a prior that couples runs (group consistency) in a run stepped alone
COUPLED_ALONE = ("group consistency pulls restarts toward their consensus and needs at least two runs stepped "
                  "together: pass --runs K with K >= 2, or set group_weight to 0")


