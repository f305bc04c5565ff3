"""Run any :class:`~datarecon.attacks.base.Attack` with logging, checkpoints and resume.

:func:`run_attack` is attack-agnostic. It wires two parts together:
:class:`datarecon.attacks.loop.AttackLoop`, the optimisation without files (the attack's
``init_state`` / ``step`` / ``finish`` through the one resumable loop,
:class:`datarecon.kernel.run_loop.RunLoop`, with its progress display, history, NaN stop and an
optional early-stopping criterion), and :class:`datarecon.attacks.run_directory.RunDirectory`,
which owns the files (checkpoints saved by the loop, ``history.jsonl``, ``run.json``,
candidates). What an attack provides is declared once, on :class:`~datarecon.attacks.base.Attack`.

Run directory: the layout is in :mod:`datarecon.attacks.run_directory` (and docs/dev/CONTRACTS.md).

Resume (the run loop's, :mod:`datarecon.kernel.resume`): with ``resume=True`` and a checkpoint present,
the state is restored bit-for-bit and the loop continues at ``steps_done``; on CPU with the same seed the
result is bit-identical to an uninterrupted run. ``history.jsonl`` is truncated to the restored step. A
checkpoint written with a different config (other than ``resume_ignore`` fields), another method, or a
different resume key (:func:`resume_key`: the target's weights, the prior, x₀, the generator, the early
stop) is refused. Resuming a finished run (complete, stopped early or diverged) changes no byte: it takes
no step and its result is what its folder records.
"""

from __future__ import annotations

import hashlib
import warnings
from contextlib import nullcontext
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import ATTACK_LOOP, Attack, AttackerPrior, AttackSetup, Reconstruction, Target, config_dict
from datarecon.attacks.loop import AttackLoop
from datarecon.attacks.run_directory import (
    CANDIDATES,
    CHECKPOINT_DIR,
    HISTORY,
    INIT_FILE,
    PROGRESS_FILE,
    RUN_JSON,
    STATE_FILE,
    RunDirectory,
    RunState,
    load_checkpoint,
    read_run,
    save_checkpoint,
    write_candidates,
)
from datarecon.errors import DataReconError
from datarecon.kernel.resume import Progress, folder_state
from datarecon.kernel.status import Status
from datarecon.kernel.engine import LoopOptions, LoopState, RunningLoop
from datarecon.kernel.losses import loss_name
from datarecon.utils.io import config_hash, versions
from datarecon.utils.lock import hold


def resume_hash(attack: Attack, target: Target | None = None) -> str:
    """Hash of the attack's method + the config fields that identify a run
    (:meth:`~datarecon.attacks.base.Attack.hashed_config`: all but ``resume_ignore``; with ``target``,
    fields that resolve against it, e.g. ``formulation: auto``, as what they resolve to)."""
    return config_hash({"method": attack.name, "config": attack.hashed_config(target)})


def tensor_digest(tensors: Mapping[str, torch.Tensor | float]) -> str:
    """SHA-256 of named tensors (sorted names, dtype, shape and bytes): equal iff bit-identical."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = torch.as_tensor(tensors[name]).detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def resume_key(attack: Attack, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
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
        **({"known_init": prior.known_init.sha256} if prior.known_init is not None else {}),
        **({"n": int(prior.n)} if prior.n is not None else {}),
        **({"recipe": prior.recipe.record()} if prior.recipe is not None else {}),
    })


def run_attack(attack: Attack, setup: AttackSetup, *, steps: int | None = None, out: str | Path | None = None,
               loop: LoopOptions = ATTACK_LOOP, early_stop: Callable[[dict[str, float]], bool] | None = None
               ) -> Reconstruction:
    """Run ``attack`` for ``steps`` steps (default ``attack.config.steps``) and write the run directory.

    Args:
        attack: the attack (its interface: :class:`~datarecon.attacks.base.Attack`).
        setup: the target (θ*, loss, weight decay; the attack never sees training data), the prior
            (labels (m,), input shape, pixel bounds), x₀ (m, C, H, W) in model input space, the
            generator (the attack's own initial state, e.g. λ₀; its state is checkpointed) and the
            run.json record of the set-up (e.g. ``seed``, ``init``, a ``model_dir`` override, ``data``).
        steps: total number of steps (including steps already done when resuming).
        out: run directory, or None to write nothing (no checkpoint, no resume).
        loop: history period, checkpoint period (and at the end), resume (continue from
            ``out/checkpoint`` when present, else start fresh), progress display and extra engine
            hooks (called after the built-in ones); :data:`~datarecon.attacks.loop.ATTACK_LOOP` by default.
        early_stop: ``criterion(metrics) -> bool`` on attacker-side metrics (e.g.
            :class:`datarecon.attacks.loop.Plateau`); with ``state_dict`` /
            ``load_state_dict`` its memory is checkpointed so resume stays exact.

    Returns:
        The :class:`Reconstruction`; status "complete", "stopped-early" or "diverged" (then
        ``summary["message"]`` names the settings to lower and the last finite state is returned).

    Raises:
        DataReconError: bad shapes / labels, or a checkpoint from a different config or method.
    """
    # one process per run directory (re-entrant: execute() holds it already)
    with hold(out) if out is not None else nullcontext():
        run = open_run(attack, setup, steps=steps, out=out, loop=loop, early_stop=early_stop)
        (rec,) = drive([run], step_each)
        return rec


class OpenRun:
    """One attack run, opened: its state is ready (fresh or restored), its run directory begun.

    A driver (:func:`drive`) steps it through :meth:`begin`'s :class:`RunningLoop` and ends it with
    :meth:`finish`. A run whose checkpoint says it had finished (``finished``: diverged, stopped early, or
    complete at the steps asked for) is not stepped: :meth:`finish` of its recorded end returns its result
    and writes nothing when its run directory already holds it. Built by :func:`open_run`.
    """

    def __init__(self, attack: Attack, setup: AttackSetup, *, steps: int, out: str | Path | None,
                 loop: LoopOptions, early_stop: Callable[[dict[str, float]], bool] | None) -> None:
        target, prior, x0, generator = setup.target, setup.prior, setup.x0, setup.generator
        self.attack, self.setup, self.steps = attack, setup, steps
        self.chash = resume_hash(attack, target)
        self.key = resume_key(attack, target, prior, x0=x0, generator=generator, early_stop=early_stop)
        record = dict(setup.record)
        base_record: dict[str, Any] = {
            "model_dir": target.model_dir, "method": attack.name, "config": config_dict(attack.config),
            "config_hash": self.chash, "resume_key": self.key, "seed": record.get("seed"), "versions": versions(),
            "m": prior.m, **record,
        }
        self.run_dir = RunDirectory(out, base_record) if out is not None else None
        self.saved = RunState({}, generator, {"method": attack.name, "config_hash": self.chash})
        self.loop = AttackLoop(attack, target, prior, self.saved.state, loop=loop, early_stop=early_stop,
                               sink=self.run_dir.append_history if self.run_dir is not None else None)
        # a run of a coupled group keeps its checkpoint before the latest (attacks/grouped.align_coupled)
        self.store = self.run_dir.store(key=self.key, chash=self.chash, keep_previous=attack.coupled()) \
            if self.run_dir is not None else None
        run_loop = self.loop.run_loop
        self.start = run_loop.resume(self.store, self.saved, enabled=loop.resume,
                                     history=lambda n: self.run_dir.history(upto=n))  # type: ignore[union-attr]
        if self.start.progress is None:
            self.saved.state.update(self._fresh())
        else:
            self._check_steps(self.start.progress)
        self.finished = self.start.finished(self.steps)
        if self.run_dir is not None and not self.finished:
            self.run_dir.begin(run_loop.history.rows, steps_done=self.start.step, wall_time_s=self.start.elapsed)
            if (record.get("init") or {}).get("experimenter_choice"):  # a data start: kept for the evaluation
                self.run_dir.write_init(x0)
            run_loop.keep(self.store, self.saved, every=loop.checkpoint_every)  # type: ignore[arg-type]

    def _fresh(self) -> dict[str, torch.Tensor]:
        s = self.setup
        state = self.attack.init_state(s.target, s.prior, x0=s.x0, generator=s.generator)
        if "x" not in state:
            raise TypeError(f"attack {self.attack.name!r} init_state must return a state with key 'x'")
        return state

    def _check_steps(self, progress: Progress) -> None:
        """Refuse to resume a run that went beyond the steps asked for (one whose own stop ended it is its result)."""
        done = progress.steps_done
        if done > self.steps and progress.status not in (Status.STOPPED_EARLY, Status.DIVERGED):
            raise DataReconError(f"{self.run_dir.path} has already done {done} steps, more than the {self.steps} "  # type: ignore[union-attr]
                                 f"asked for; resume with steps (--steps) of at least {done}, or start afresh with "
                                 "--overwrite")

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """The run's attack state (updated in place by its steps)."""
        return self.loop.state

    def begin(self) -> RunningLoop:
        """Start the run's loop at its restored step (checkpointing when it has a directory)."""
        return self.loop.begin(start=self.start.step, total=self.steps, elapsed_s=self.start.elapsed)

    def end_state(self) -> LoopState:
        """The recorded end of a run that had finished (``finished``)."""
        return self.start.progress.end_state()  # type: ignore[union-attr]

    def finish(self, loop: LoopState) -> Reconstruction:
        """The run's :class:`Reconstruction` after its loop ended; written to its directory unless it holds it already."""
        rec = self.loop.result(loop)
        done = folder_state(self.run_dir.path, key={"resume_key": self.key}) \
            if self.run_dir is not None and self.finished else None
        if done is not None and done.finished:  # resumed a finished run: it is what its folder records
            rec = replace(rec, status=Status.parse(done.record["status"]),  # type: ignore[index]
                          summary={**rec.summary, "message": done.record.get("message", "")})  # type: ignore[union-attr]
        if rec.status == Status.DIVERGED:
            warnings.warn(rec.summary["message"], RuntimeWarning, stacklevel=3)
        if self.run_dir is not None and not (done is not None and done.finished):
            self.run_dir.finish(rec)
            if rec.status == Status.DIVERGED and not self.loop.run_loop.diverged:  # a state gone non-finite unseen
                progress = self.loop.run_loop.progress(loop, key=self.key, record=self.saved.state_record(),
                                                       history=False)
                self.store.save(self.saved.state_tensors(),  # type: ignore[union-attr]
                                replace(progress, status=Status.DIVERGED, steps_done=rec.steps_done))
        return rec


def open_run(attack: Attack, setup: AttackSetup, *, steps: int | None = None, out: str | Path | None = None,
             loop: LoopOptions = ATTACK_LOOP, early_stop: Callable[[dict[str, float]], bool] | None = None) -> OpenRun:
    """Check a run's inputs and open it (arguments as in :func:`run_attack`; ``out`` locked by the caller).

    Raises:
        DataReconError: bad shapes, labels or steps; a checkpoint of another run, of a diverged run,
            or with more steps done than asked for.
    """
    setup.prior.check(setup.target)
    steps = int(steps if steps is not None else attack.config.steps)
    if steps < 1:
        raise DataReconError(f"steps must be at least 1, got {steps}; set steps (--steps N) to N >= 1")
    expected = (setup.prior.m, *tuple(setup.target.input_shape))
    if tuple(setup.x0.shape) != expected:
        raise DataReconError(f"x0 has shape {tuple(setup.x0.shape)}, expected (m, *input_shape) = {expected}")
    return OpenRun(attack, setup, steps=steps, out=out, loop=loop, early_stop=early_stop)


@dataclass
class StepRequest:
    """One run's next step in a round of :func:`drive` (its metrics are set once its state is updated).

    Attributes:
        index: the run's position in the driven runs.
        run: the run.
        step: the 0-based index of the step to take.
        metrics: the step's metrics, set by the round's compute (None: not taken).
    """

    index: int
    run: OpenRun
    step: int
    metrics: dict[str, float] | None = None


#: A round's step computation: updates every request's run state and sets its metrics.
Compute = Callable[[list[StepRequest]], None]


def step_each(requests: list[StepRequest]) -> None:
    """Each run's own ``attack.step`` in turn (the single-run arithmetic)."""
    for r in requests:
        r.metrics = r.run.loop.step(r.step)


def _advance(loops: Mapping[int, RunningLoop], requests: Sequence[StepRequest]) -> None:
    """Hand every run whose step was taken its metrics (all of them, even if one's hooks fail)."""
    error: BaseException | None = None
    for r in requests:
        if r.metrics is not None:
            try:
                loops[r.index].advance(r.metrics)
            except BaseException as exc:  # noqa: BLE001 - raised once every taken step is recorded
                error = error or exc
    if error is not None:
        raise error


def drive(runs: Sequence[OpenRun | BaseException], compute: Compute) -> list[Reconstruction]:
    """Step opened runs in rounds until each has stopped; one :class:`Reconstruction` per run.

    Every round asks ``compute`` for one step of every run still going (in run order), then hands
    each run its metrics (its hooks: history, NaN stop, early stop, checkpoint, progress). A run
    that stops (early stop, divergence, its last step) is finished and leaves; the others go on.
    One run alone (:func:`run_attack`) and K runs against one target (:func:`datarecon.attacks.batched.run_batched`)
    go through this same loop, without threads.

    An entry that is an exception (a run that could not be opened) takes no step, nor does a run that
    had finished before (its recorded end is its result; its row still counts in a group). If ``compute``
    fails, the runs whose step it committed keep it, every run still going ends (its checkpoint
    saved) and the error is raised; an error of one run's finish is raised after the others finished.

    Args:
        runs: opened runs (:func:`open_run`), or the error that kept one from opening.
        compute: the round's step computation (:func:`step_each` or a batched one).

    Returns:
        The runs' results in order (the entries that were errors are re-raised instead: the first one).
    """
    results: dict[int, Reconstruction] = {}
    errors: dict[int, BaseException] = {k: r for k, r in enumerate(runs) if isinstance(r, BaseException)}
    for k, r in enumerate(runs):  # a run that had finished takes no step: its recorded end
        if isinstance(r, OpenRun) and r.finished:
            try:
                results[k] = r.finish(r.end_state())
            except Exception as exc:  # noqa: BLE001 - raised once the other runs are done
                errors[k] = exc
    loops = {k: r.begin() for k, r in enumerate(runs) if isinstance(r, OpenRun) and not r.finished}
    live = list(loops)
    try:
        while live:
            requests = [StepRequest(k, runs[k], loops[k].state.step) for k in live if loops[k].going]
            try:
                if requests:
                    compute(requests)
            finally:
                _advance(loops, requests)
            for k in [k for k in live if not loops[k].going]:
                live.remove(k)
                try:
                    results[k] = runs[k].finish(loops[k].end(finished=True))
                except Exception as exc:  # noqa: BLE001 - raised once the other runs are done
                    errors[k] = exc
    finally:
        for k in live:
            loops[k].end(finished=False)
    if errors:
        raise errors[min(errors)]
    return [results[k] for k in sorted(results)]


__all__ = ["CANDIDATES", "CHECKPOINT_DIR", "HISTORY", "INIT_FILE", "PROGRESS_FILE", "RUN_JSON",
           "STATE_FILE", "AttackSetup", "OpenRun", "StepRequest", "config_dict", "drive", "open_run", "step_each",
           "load_checkpoint", "read_run", "resume_hash", "resume_key", "run_attack", "save_checkpoint", "tensor_digest",
           "write_candidates"]
