"""Run any :class:`~datarecon.attacks.base.IterativeAttack` with logging, checkpoints and resume.

:func:`run_attack` is attack-agnostic (KKT, DecoReco, gradnorm and bilevel all use it). It drives
the attack's ``init_state`` / ``step`` / ``finish`` through :class:`datarecon.training.engine.Engine`
with hooks: a progress bar (loss terms), :class:`History` (→ ``history.jsonl``), :class:`Checkpoint`
and :class:`NaNStop` (plus an optional early-stopping criterion).

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

Run directory (docs/dev/CONTRACTS.md)::

    candidates.safetensors   x (m, C, H, W) model input space, labels, multipliers, score_<name>
    run.json                 model_dir, method, config, config_hash, seed, versions, status, steps_done,
                             wall_time_s, stop_reason, final, selection, extra, message
    history.jsonl            one JSON object per logged step
    checkpoint/state.safetensors   the attack state + generator state; metadata: steps_done,
                                   config_hash, wall_time_s (one atomic file = consistent)
    checkpoint/progress.json       the same metadata, human readable

Resume: with ``resume=True`` and a checkpoint present, the state is restored bit-for-bit and the
loop continues at ``steps_done``; on CPU with the same seed the result is bit-identical to an
uninterrupted run. ``history.jsonl`` is truncated to the restored step. A checkpoint written with a
different config (other than ``resume_ignore`` fields), another method, or a different resume key
(:func:`resume_key`: the target's weights, the prior, x₀, the generator, the early stop) is refused.
Resuming a finished run changes nothing: its final loss terms, stop reason and wall time are kept.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import AttackerPrior, Reconstruction, Target
from datarecon.training.losses import loss_name
from datarecon.errors import CheckpointError, DataReconError
from datarecon.status import Status
from datarecon.training.engine import (
    BaseHook,
    Checkpoint,
    EarlyStop,
    Engine,
    History,
    LoopState,
    NaNStop,
    ProgressBar,
)
from datarecon.utils.io import (
    atomic_write_json,
    atomic_write_text,
    config_hash,
    load_tensors,
    read_json,
    save_tensors,
    to_jsonable,
    versions,
)

CANDIDATES, RUN_JSON, HISTORY = "candidates.safetensors", "run.json", "history.jsonl"
CHECKPOINT_DIR, STATE_FILE, PROGRESS_FILE = "checkpoint", "state.safetensors", "progress.json"
_GEN_KEY = "__generator_state__"
DEFAULT_DIVERGENCE_HINT = "lower the step sizes (lr_x, lr_lambda) or the surrogate sharpness alpha"


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
    })


def _check_resume(meta: dict[str, Any], *, key: str, chash: str, out: Path, model_dir: str | None) -> None:
    """Refuse a checkpoint written by another configuration, target, prior or initialisation."""
    if meta.get("config_hash") != chash:
        raise DataReconError(
            f"{out} was run with another method/config (checkpoint {meta.get('method')}, "
            f"config_hash {meta.get('config_hash')} != {chash}); use the same settings to resume or a new --out"
        )
    if "resume_key" in meta:
        if meta["resume_key"] != key:
            raise DataReconError(
                f"{out} was run against another model, initialisation, seed or prior (resume key "
                f"{meta['resume_key']} != {key}); resume with the same --model and settings or choose a new --out"
            )
        return
    # a checkpoint from before resume keys: at least the model directory must be the same
    try:
        recorded = read_json(out / RUN_JSON).get("model_dir")
    except DataReconError:
        recorded = None
    if recorded is not None and model_dir is not None and recorded != model_dir:
        raise DataReconError(f"{out} was run against the model {recorded}, not {model_dir}; resume with the same "
                             "--model or choose a new --out")
    warnings.warn(f"{out}: checkpoint predates resume keys; only its config and model path could be checked",
                  UserWarning, stacklevel=3)


def _restored_metrics(meta: dict[str, Any]) -> dict[str, float]:
    """The last step's metrics saved with a checkpoint.

    Non-finite values are saved as JSON ``null`` (older versions wrote the strings ``"nan"``/``"inf"``,
    which ``float`` reads back); both come back as floats.
    """
    return {k: math.nan if v is None else float(v) for k, v in (meta.get("metrics") or {}).items()}


def _all_finite(state: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


class _EarlyStopState(BaseHook):
    """Wraps a stateful early-stop criterion so its memory is checkpointed with the run."""

    def __init__(self, criterion: Callable[[dict[str, float]], bool], reason: str) -> None:
        self.inner = EarlyStop(criterion, reason=reason)
        self.criterion = criterion
        self.tripped = False

    def after_step(self, state: LoopState) -> bool:
        stop = self.inner.after_step(state)
        self.tripped = self.tripped or stop
        return stop

    def state_dict(self) -> dict[str, Any]:
        fn = getattr(self.criterion, "state_dict", None)
        return fn() if fn is not None else {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        fn = getattr(self.criterion, "load_state_dict", None)
        if fn is not None and d:
            fn(d)


def load_checkpoint(out: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The checkpointed (state, metadata) of a run directory, or None if it has none.

    Raises:
        CheckpointError: a corrupt checkpoint.
    """
    path = Path(out) / CHECKPOINT_DIR / STATE_FILE
    if not path.is_file():
        return None
    from safetensors import safe_open

    tensors = load_tensors(path)
    with safe_open(str(path), framework="pt") as fh:
        meta_raw = fh.metadata() or {}
    try:
        meta = json.loads(meta_raw["progress"])
    except (KeyError, json.JSONDecodeError):
        raise CheckpointError(f"{path} has no progress metadata; delete {path.parent} and rerun") from None
    # the tensor file is the source of truth: a kill between its write and progress.json's (see
    # save_checkpoint) leaves a stale progress.json, which a resumed run must not keep
    readable = path.parent / PROGRESS_FILE
    try:
        stale = json.loads(readable.read_text()) != json.loads(json.dumps(to_jsonable(meta)))
    except (OSError, ValueError):
        stale = True
    if stale:
        atomic_write_json(readable, meta)
    return tensors, meta


def save_checkpoint(out: str | Path, state: dict[str, torch.Tensor], meta: dict[str, Any],
                    *, generator: torch.Generator | None = None) -> None:
    """Write the state (+ generator state) and its metadata atomically in one safetensors file."""
    ckpt = Path(out) / CHECKPOINT_DIR
    tensors = dict(state)
    if generator is not None:
        tensors[_GEN_KEY] = generator.get_state()
    text = json.dumps(to_jsonable(meta), sort_keys=True)
    save_tensors(ckpt / STATE_FILE, tensors, metadata={"progress": text})
    atomic_write_json(ckpt / PROGRESS_FILE, meta)


def _read_history(path: Path, *, upto: int) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("step", 0) <= upto:
                rows.append(row)
    return rows


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
    prior.check(target)
    steps = int(steps if steps is not None else getattr(attack.config, "steps"))
    if steps < 1:
        raise DataReconError(f"steps must be at least 1, got {steps}; set steps (--steps N) to N >= 1")
    if tuple(x0.shape) != (prior.m, *tuple(target.input_shape)):
        raise DataReconError(
            f"x0 has shape {tuple(x0.shape)}, expected (m, *input_shape) = {(prior.m, *target.input_shape)}"
        )
    out_path = Path(out) if out is not None else None
    chash = resume_hash(attack, target)
    key = resume_key(attack, target, prior, x0=x0, generator=generator, early_stop=early_stop)
    cfg = config_dict(attack.config)
    base_record: dict[str, Any] = {
        "model_dir": target.model_dir, "method": attack.name, "config": cfg, "config_hash": chash,
        "resume_key": key, "seed": seed, "versions": versions(), "m": prior.m, **(record or {}),
    }

    ckpt = load_checkpoint(out_path) if (out_path is not None and resume) else None
    start, elapsed, es_state, meta = 0, 0.0, {}, {}
    if ckpt is not None:
        tensors, meta = ckpt
        _check_resume(meta, key=key, chash=chash, out=out_path, model_dir=base_record["model_dir"])
        gen_state = tensors.pop(_GEN_KEY, None)
        if gen_state is not None:
            generator.set_state(gen_state)
        state = tensors
        start, elapsed = int(meta["steps_done"]), float(meta.get("wall_time_s", 0.0))
        es_state = meta.get("early_stop", {}) or {}
        if meta.get("status") == Status.DIVERGED:
            raise DataReconError(f"{out_path} diverged at step {start}; start a new run with lower step sizes")
        if meta.get("status") == Status.STOPPED_EARLY:
            steps = start  # its own early stop ended it: nothing left to run
    else:
        state = attack.init_state(target, prior, x0=x0, generator=generator)
        if "x" not in state:
            raise TypeError(f"attack {attack.name!r} init_state must return a state with key 'x'")

    history_rows = _read_history(out_path / HISTORY, upto=start) if (out_path and ckpt) else []
    if out_path is not None:
        out_path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_path / HISTORY, "".join(json.dumps(to_jsonable(r)) + "\n" for r in history_rows))
        atomic_write_json(out_path / RUN_JSON, {**base_record, "status": Status.RUNNING, "steps_done": start,
                                                "wall_time_s": elapsed})

    def sink(row: dict[str, float]) -> None:
        if out_path is not None:
            with open(out_path / HISTORY, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(to_jsonable(row)) + "\n")

    history = History(every=log_every, sink=sink)
    history.rows = list(history_rows)
    nan_stop = NaNStop()
    es_hook = _EarlyStopState(early_stop, "stopped early: residual plateau") if early_stop is not None else None
    if es_hook is not None:
        es_hook.load_state_dict(es_state)
        es_hook.tripped = meta.get("status") == Status.STOPPED_EARLY

    def progress_meta(ls: LoopState, status: Status) -> dict[str, Any]:
        return {"method": attack.name, "config_hash": chash, "resume_key": key, "steps_done": ls.step,
                "total": ls.total, "wall_time_s": ls.wall_time_s, "status": status, "stop_reason": ls.stop_reason,
                # a resumed run that takes no step keeps the metrics its checkpoint recorded
                "metrics": dict(ls.metrics or (_restored_metrics(meta) if ckpt is not None and ls.step == start else {})),
                "early_stop": es_hook.state_dict() if es_hook is not None else {}}

    def save(ls: LoopState) -> None:
        if out_path is None:
            return
        status = (Status.DIVERGED if nan_stop.tripped else
                  Status.STOPPED_EARLY if es_hook is not None and es_hook.tripped else Status.RUNNING)
        save_checkpoint(out_path, state, progress_meta(ls, status), generator=generator)

    def step_fn(i: int) -> dict[str, float]:
        return attack.step(target, prior, state, i)

    engine_hooks: list[Any] = [
        ProgressBar(keys=("loss", "rel_residual", "residual", "box", "lambda_hinge"), desc=attack.name, enabled=progress),
        history, nan_stop,
    ]
    if es_hook is not None:
        engine_hooks.append(es_hook)
    if out_path is not None:
        engine_hooks.append(Checkpoint(save, every=checkpoint_every))
    engine_hooks.extend(hooks)
    loop = Engine(step_fn, hooks=engine_hooks).run(start=start, total=steps, elapsed_s=elapsed)
    if ckpt is not None and loop.step == start:  # resumed a finished run: report it as it was
        loop.metrics = loop.metrics or _restored_metrics(meta)
        loop.stop_reason = meta.get("stop_reason") or loop.stop_reason
        loop.wall_time_s = elapsed

    message = ""
    if nan_stop.tripped or not _all_finite(state):
        status = Status.DIVERGED
        hint = getattr(attack, "divergence_hint", DEFAULT_DIVERGENCE_HINT)
        message = (f"{attack.name} diverged at step {loop.step} ({nan_stop.bad_key or 'state'} not finite); "
                   f"kept the last finite state; {hint}")
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    elif es_hook is not None and es_hook.tripped:
        status = Status.STOPPED_EARLY
    else:
        status = Status.COMPLETE
    steps_done = loop.step - (1 if nan_stop.tripped else 0)  # the non-finite step was not applied

    scores, summary = attack.finish(target, prior, state)
    summary = dict(summary)
    selection = summary.pop("selection", {})
    extra = summary.pop("extra", {})
    final = {k: v for k, v in (loop.metrics or {}).items()}
    final.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
    notes = summary.get("notes", [])
    multipliers = state.get("lambda", torch.ones(prior.m, dtype=state["x"].dtype))
    rec = Reconstruction(
        x=state["x"].detach().clone(), labels=prior.labels.clone(), multipliers=multipliers.detach().clone(),
        history=list(history.rows), scores={k: v.detach().clone() for k, v in scores.items()},
        summary={**summary, "final": final, "selection": selection, "extra": extra, "message": message,
                 "stop_reason": loop.stop_reason, "wall_time_s": loop.wall_time_s},
        status=status, steps_done=steps_done,
    )
    if out_path is not None:
        write_candidates(out_path, rec)
        atomic_write_json(out_path / RUN_JSON, {
            **base_record, "status": status, "steps_done": steps_done, "wall_time_s": loop.wall_time_s,
            "stop_reason": loop.stop_reason, "final": final, "selection": selection, "extra": extra,
            "notes": notes, "message": message,
        })
        if status == Status.DIVERGED:
            save_checkpoint(out_path, state, {**progress_meta(loop, Status.DIVERGED), "steps_done": steps_done},
                            generator=generator)
    return rec


def write_candidates(out: str | Path, rec: Reconstruction) -> None:
    """Write ``candidates.safetensors``: x, labels, multipliers and ``score_<name>`` tensors."""
    tensors = {"x": rec.x, "labels": rec.labels, "multipliers": rec.multipliers}
    tensors.update({f"score_{k}": v for k, v in rec.scores.items()})
    save_tensors(Path(out) / CANDIDATES, tensors)


def read_run(out: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read (candidates tensors, run.json) of a finished run directory."""
    out = Path(out)
    return load_tensors(out / CANDIDATES), read_json(out / RUN_JSON)


__all__ = ["CANDIDATES", "DEFAULT_DIVERGENCE_HINT", "HISTORY", "RUN_JSON", "config_dict", "load_checkpoint",
           "read_run", "resume_hash", "resume_key", "run_attack", "save_checkpoint", "tensor_digest",
           "write_candidates"]
