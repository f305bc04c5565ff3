"""Run any :class:`~datarecon.attacks.base.IterativeAttack` with logging, checkpoints and resume.

:func:`run_attack` is attack-agnostic (KKT, DecoReco, gradnorm and bilevel all use it). It wires
two parts together: :class:`datarecon.attacks.loop.AttackLoop`, the optimisation without files
(the attack's ``init_state`` / ``step`` / ``finish`` through :class:`datarecon.kernel.engine.Engine`
with a progress bar, :class:`History`, :class:`NaNStop` and an optional early-stopping criterion),
and :class:`datarecon.attacks.run_directory.RunDirectory`, which owns the files (checkpoints through
a :class:`Checkpoint` hook, ``history.jsonl``, ``run.json``, candidates).

What an attack must provide (the runner's contract):

* ``name`` (str), ``config`` (frozen pydantic model; saved in run.json and hashed for resume);
* ``init_state(target, prior, *, x0, generator) -> dict[str, Tensor]`` holding ALL mutable state,
  with at least ``"x"`` (m, C, H, W) and optionally ``"lambda"`` (m,) multipliers;
* ``step(target, prior, state, index) -> dict[str, float]``: updates ``state`` in place, deterministic
  given the state; on a non-finite update it leaves the state unchanged and returns a non-finite
  metric (NaNStop then stops the run with the last finite state);
* ``finish(target, prior, state) -> (scores, summary)``; ``summary`` may hold ``"selection"`` (dict)
  and ``"extra"`` (dict, method-specific, e.g. bilevel ``param_distance``);
* optional ``divergence_hint`` (str): which settings to lower when the run diverges;
* optional ``resume_ignore`` (tuple of config field names that may differ on resume; default
  ``("steps",)`` so a finished run can be extended).

Run directory: the layout is in :mod:`datarecon.attacks.run_directory` (and docs/dev/CONTRACTS.md).

Resume: with ``resume=True`` and a checkpoint present, the state is restored bit-for-bit and the
loop continues at ``steps_done``; on CPU with the same seed the result is bit-identical to an
uninterrupted run. ``history.jsonl`` is truncated to the restored step. A checkpoint written with a
different config (other than ``resume_ignore`` fields), another method, or a different resume key
(:func:`resume_key`: the target's weights, the prior, x₀, the generator, the early stop) is refused.
Resuming a finished run changes nothing: its final loss terms, stop reason and wall time are kept.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import AttackerPrior, Reconstruction, Target
from datarecon.attacks.loop import DEFAULT_DIVERGENCE_HINT, AttackLoop
from datarecon.attacks.run_directory import (
    CANDIDATES,
    CHECKPOINT_DIR,
    GENERATOR_KEY,
    HISTORY,
    INIT_FILE,
    PROGRESS_FILE,
    RUN_JSON,
    STATE_FILE,
    RunDirectory,
    load_checkpoint,
    read_run,
    restored_metrics,
    save_checkpoint,
    write_candidates,
)
from datarecon.errors import DataReconError
from datarecon.kernel.status import Status
from datarecon.kernel.engine import Checkpoint, LoopState
from datarecon.kernel.losses import loss_name
from datarecon.utils.io import config_hash, to_jsonable, versions


def config_dict(config: Any) -> dict[str, Any]:
    """A config as a JSON-able mapping (pydantic models, dataclasses or mappings)."""
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        return config.model_dump(mode="json")
    if isinstance(config, dict):
        return to_jsonable(config)
    import dataclasses

    if dataclasses.is_dataclass(config):
        return to_jsonable(dataclasses.asdict(config))
    raise TypeError(f"cannot serialise attack config of type {type(config).__name__}")


def resume_hash(attack: Any, target: Target | None = None) -> str:
    """Hash of the attack's method + config without the fields allowed to change on resume.

    With ``target``, a ``formulation`` of ``auto`` is hashed as the formulation it resolves to, so a
    run started with an explicit ``binary`` resumes under the ``auto`` default on a binary target.
    """
    ignore = set(getattr(attack, "resume_ignore", ("steps",)))
    cfg = {k: v for k, v in config_dict(attack.config).items() if k not in ignore}
    if target is not None and "formulation" in cfg and hasattr(attack, "formulation"):
        cfg["formulation"] = attack.formulation(target)
    return config_hash({"method": attack.name, "config": cfg})


def tensor_digest(tensors: Mapping[str, torch.Tensor | float]) -> str:
    """SHA-256 of named tensors (sorted names, dtype, shape and bytes): equal iff bit-identical."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = torch.as_tensor(tensors[name]).detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def resume_key(attack: Any, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
               generator: torch.Generator, early_stop: Any = None) -> str:
    """Identity of everything that determines a run's result; a checkpoint resumes only under the same key.

    Covers the method and its config (minus ``resume_ignore``), the target (θ* bit for bit, its
    architecture, loss and weight decay), the prior (labels and pixel box), x₀ (so the
    initialisation, its data, its seed and m), the generator's initial state and the early-stop
    rule. Not covered: where files live, progress and checkpoint periods.
    """
    stop = early_stop.settings() if hasattr(early_stop, "settings") else (
        type(early_stop).__name__ if early_stop is not None else None)
    return config_hash({
        "attack": resume_hash(attack, target),
        "target": {"params": tensor_digest(target.params), "model": repr(target.model), "loss": loss_name(target.loss),
                   "weight_decay": repr(float(target.weight_decay)), "input_shape": list(target.input_shape),
                   "num_outputs": target.num_outputs},
        "prior": tensor_digest({"labels": prior.labels, "lower": torch.as_tensor(prior.lower),
                                "upper": torch.as_tensor(prior.upper)}),
        "x0": tensor_digest({"x0": x0}),
        "generator": tensor_digest({"state": generator.get_state()}),
        "early_stop": stop,
        # the attacker's extra knowledge; left out when absent so earlier checkpoints keep their key
        **({"known_init": prior.known_init.sha256} if getattr(prior, "known_init", None) is not None else {}),
        **({"n": int(prior.n)} if getattr(prior, "n", None) is not None else {}),
        **({"recipe": prior.recipe.record()} if getattr(prior, "recipe", None) is not None else {}),
    })


def run_attack(attack: Any, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
               generator: torch.Generator, steps: int | None = None, out: str | Path | None = None,
               checkpoint_every: int = 100, resume: bool = False, progress: bool = True,
               log_every: int = 10, seed: int | None = None,
               early_stop: Callable[[dict[str, float]], bool] | None = None,
               hooks: Sequence[Any] = (), record: dict[str, Any] | None = None) -> Reconstruction:
    """Run ``attack`` for ``steps`` steps (default ``attack.config.steps``) and write the run directory.

    Args:
        attack: an IterativeAttack (see the module docstring for the contract).
        target: the attacked model (θ*, loss, weight decay); the attack never sees training data.
        prior: labels (m,), input shape and pixel bounds.
        x0: (m, C, H, W) initial candidates in model input space (from :func:`datarecon.attacks.init.make_init`).
        generator: randomness for the attack's own initial state (e.g. λ₀); its state is checkpointed.
        steps: total number of steps (including steps already done when resuming).
        out: run directory, or None to write nothing (no checkpoint, no resume).
        checkpoint_every: save state every this many steps (and at the end).
        resume: continue from ``out/checkpoint`` when present (else start fresh).
        progress: show a tqdm bar with the loss terms.
        log_every: history row every this many steps (and the last step).
        seed: recorded in run.json.
        early_stop: ``criterion(metrics) -> bool`` on attacker-side metrics (e.g.
            :class:`datarecon.attacks.selection.ResidualPlateau`); with ``state_dict`` /
            ``load_state_dict`` its memory is checkpointed so resume stays exact.
        hooks: extra engine hooks (called after the built-in ones).
        record: extra fields for run.json (e.g. ``init``, ``model_dir`` override, ``data``).

    Returns:
        The :class:`Reconstruction`; status "complete", "stopped-early" or "diverged" (then
        ``summary["message"]`` names the settings to lower and the last finite state is returned).

    Raises:
        DataReconError: bad shapes / labels, or a checkpoint from a different config or method.
    """
    from contextlib import nullcontext

    from datarecon.utils.lock import hold

    # one process per run directory (re-entrant: execute() holds it already)
    with hold(out) if out is not None else nullcontext():
        return _run_attack(attack, target, prior, x0=x0, generator=generator, steps=steps, out=out,
                           checkpoint_every=checkpoint_every, resume=resume, progress=progress, log_every=log_every,
                           seed=seed, early_stop=early_stop, hooks=hooks, record=record)


def _run_attack(attack: Any, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                generator: torch.Generator, steps: int | None, out: str | Path | None, checkpoint_every: int,
                resume: bool, progress: bool, log_every: int, seed: int | None,
                early_stop: Callable[[dict[str, float]], bool] | None, hooks: Sequence[Any],
                record: dict[str, Any] | None) -> Reconstruction:
    """The body of :func:`run_attack` (``out`` locked by the caller)."""
    prior.check(target)
    steps = int(steps if steps is not None else getattr(attack.config, "steps"))
    if steps < 1:
        raise DataReconError(f"steps must be at least 1, got {steps}; set steps (--steps N) to N >= 1")
    if tuple(x0.shape) != (prior.m, *tuple(target.input_shape)):
        raise DataReconError(
            f"x0 has shape {tuple(x0.shape)}, expected (m, *input_shape) = {(prior.m, *target.input_shape)}"
        )
    chash = resume_hash(attack, target)
    key = resume_key(attack, target, prior, x0=x0, generator=generator, early_stop=early_stop)
    base_record: dict[str, Any] = {
        "model_dir": target.model_dir, "method": attack.name, "config": config_dict(attack.config),
        "config_hash": chash, "resume_key": key, "seed": seed, "versions": versions(), "m": prior.m, **(record or {}),
    }
    run_dir = RunDirectory(out, base_record) if out is not None else None

    ckpt = run_dir.resume(key=key, chash=chash) if (run_dir is not None and resume) else None
    start, elapsed, meta = 0, 0.0, {}
    if ckpt is not None:
        tensors, meta = ckpt
        gen_state = tensors.pop(GENERATOR_KEY, None)
        if gen_state is not None:
            generator.set_state(gen_state)
        state = tensors
        start, elapsed = int(meta["steps_done"]), float(meta.get("wall_time_s", 0.0))
        if start > steps and meta.get("status") != Status.STOPPED_EARLY:
            raise DataReconError(f"{run_dir.path} has already done {start} steps, more than the {steps} asked for; "
                                 f"resume with steps (--steps) of at least {start}, or start afresh with --overwrite")
        if meta.get("status") == Status.DIVERGED:
            raise DataReconError(f"{run_dir.path} diverged at step {start}; start a new run with lower step sizes")
        if meta.get("status") == Status.STOPPED_EARLY:
            steps = start  # its own early stop ended it: nothing left to run
    else:
        state = attack.init_state(target, prior, x0=x0, generator=generator)
        if "x" not in state:
            raise TypeError(f"attack {attack.name!r} init_state must return a state with key 'x'")

    history_rows = run_dir.history(upto=start) if (run_dir is not None and ckpt) else []
    if run_dir is not None:
        run_dir.begin(history_rows, steps_done=start, wall_time_s=elapsed)
        if ((record or {}).get("init") or {}).get("experimenter_choice"):  # a data start: kept for the evaluation
            run_dir.write_init(x0)

    opt = AttackLoop(attack, target, prior, state, early_stop=early_stop,
                     early_stop_state=meta.get("early_stop", {}) or {},
                     stopped_early=meta.get("status") == Status.STOPPED_EARLY, history_rows=history_rows,
                     sink=run_dir.append_history if run_dir is not None else None, log_every=log_every,
                     progress=progress)

    def progress_meta(ls: LoopState, status: Status) -> dict[str, Any]:
        return {"method": attack.name, "config_hash": chash, "resume_key": key, "steps_done": ls.step,
                "total": ls.total, "wall_time_s": ls.wall_time_s, "status": status, "stop_reason": ls.stop_reason,
                # a resumed run that takes no step keeps the metrics its checkpoint recorded
                "metrics": dict(ls.metrics or (restored_metrics(meta) if ckpt is not None and ls.step == start else {})),
                "early_stop": opt.early_stop_state()}

    def save(ls: LoopState) -> None:
        run_dir.save_checkpoint(state, progress_meta(ls, opt.checkpoint_status()), generator=generator)

    file_hooks = [Checkpoint(save, every=checkpoint_every)] if run_dir is not None else []
    loop = opt.run(start=start, total=steps, elapsed_s=elapsed, hooks=[*file_hooks, *hooks])
    if ckpt is not None and loop.step == start:  # resumed a finished run: report it as it was
        loop.metrics = loop.metrics or restored_metrics(meta)
        loop.stop_reason = meta.get("stop_reason") or loop.stop_reason
        loop.wall_time_s = elapsed

    rec = opt.result(loop)
    if rec.status == Status.DIVERGED:
        warnings.warn(rec.summary["message"], RuntimeWarning, stacklevel=2)
    if run_dir is not None:
        run_dir.finish(rec)
        if rec.status == Status.DIVERGED:
            run_dir.save_checkpoint(state, {**progress_meta(loop, Status.DIVERGED), "steps_done": rec.steps_done},
                                    generator=generator)
    return rec


__all__ = ["CANDIDATES", "CHECKPOINT_DIR", "DEFAULT_DIVERGENCE_HINT", "HISTORY", "INIT_FILE", "PROGRESS_FILE", "RUN_JSON",
           "STATE_FILE", "config_dict", "load_checkpoint", "read_run", "resume_hash", "resume_key", "run_attack",
           "save_checkpoint", "tensor_digest", "write_candidates"]
