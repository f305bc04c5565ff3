"""The one resumable loop below target training, margin ascent, DP-SGD and every attack.

A :class:`RunLoop` owns an :class:`~datarecon.kernel.engine.Engine` over a step function and the
hooks every such loop has, always in this order:

1. ``prepare``: hooks that complete a step's metrics before they are judged (margin ascent adds
   the normalised margin; they may stop the loop too);
2. :class:`~datarecon.kernel.engine.NaNStop` on the watched metrics;
3. :class:`~datarecon.kernel.engine.History` (rows restored on resume, each new row also handed to
   an optional sink);
4. the stop rules (a loss threshold, zero training error, a residual plateau, ...);
5. the progress display (:class:`Display`);
6. the checkpoint (:meth:`RunLoop.checkpoint`), which skips the final save while the stepper is in
   the middle of an update;
7. the caller's extra hooks (``LoopOptions.hooks``).

Stop rules and NaNStop set ``stop_reason``; a later hook's reason replaces an earlier one's. The
progress display only reads the state, so where it stands among the hooks before it changes
nothing. :meth:`RunLoop.status` is the one rule that turns a loop's end into a
:class:`~datarecon.kernel.status.Status`.

Resume is the loop's too (:mod:`datarecon.kernel.resume`): the caller gives a resumable stepper and a
:class:`~datarecon.kernel.resume.Store` (where the checkpoint lives, the key it resumes under), and

1. :meth:`RunLoop.resume` loads the checkpoint (when asked and there is one), refuses one of another run,
   loads the stepper's state and brings back the history rows, the stop rules' memory, the last metrics and
   how the run had ended;
2. :meth:`RunLoop.run_resumed` returns the recorded end of a run that had finished (diverged, stopped early,
   or complete at the steps asked for), writing nothing, and otherwise runs the steps left, checkpointing every
   ``every`` steps and at the end (:meth:`RunLoop.keep`) a :class:`~datarecon.kernel.resume.Progress`.

A driver that steps several loops together (an attack's :func:`~datarecon.attacks.runner.drive`) calls
:meth:`RunLoop.resume`, :meth:`RunLoop.keep` and :meth:`RunLoop.begin` itself. :func:`check_key` is the one
refusal of a checkpoint written under another key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datarecon.kernel.engine import (BaseHook, Checkpoint, Engine, History, Hook, LoopOptions, LoopState, NaNStop,
                                     ProgressBar, RunningLoop, StepFn, Updating)
from datarecon.kernel.resume import Progress, Resumable, Start, Store
from datarecon.kernel.status import Status


@dataclass(frozen=True)
class Display:
    """How a loop's progress is shown (:class:`~datarecon.kernel.engine.ProgressBar`).

    Attributes:
        desc: Label of the bar and prefix of the plain lines.
        keys: Metrics shown beside the step count, in order.
        labels: How a metric is named there, where not by its key.
        unit: What a step is called ("step", "epoch").
        every: Steps between updates of the bar's metrics, ≥ 1.
    """

    desc: str
    keys: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    unit: str = "step"
    every: int = 1


class _StopRule(BaseHook):
    """A stop rule whose firing its :class:`RunLoop` remembers (for :meth:`RunLoop.status`)."""

    def __init__(self, rule: Hook, loop: RunLoop) -> None:
        self.rule, self.loop = rule, loop

    def before_run(self, state: LoopState) -> None:
        self.rule.before_run(state)

    def after_step(self, state: LoopState) -> bool:
        stop = bool(self.rule.after_step(state))
        self.loop.stopped_early = self.loop.stopped_early or stop
        return stop

    def after_run(self, state: LoopState) -> None:
        self.rule.after_run(state)

    def state_dict(self) -> dict[str, Any]:
        """The rule's memory (``{}`` for a rule without one)."""
        fn = getattr(self.rule, "state_dict", None)
        return dict(fn()) if fn is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Bring back the rule's memory (a rule without one ignores it)."""
        fn = getattr(self.rule, "load_state_dict", None)
        if fn is not None and state:
            fn(dict(state))


class RunLoop:
    """One resumable loop: the engine over ``step``, its built-in hooks, history and status.

    Args:
        step: one step; receives the 0-based step index, returns scalar metrics.
        display: the progress display's label, metrics and unit (:class:`Display`).
        options: the shared loop settings (:class:`~datarecon.kernel.engine.LoopOptions`): the
            history period, the progress mode and the extra hooks, run last.
        watch: metrics whose NaN/inf stops the loop as diverged (None: every metric).
        stops: stop rules, run after the history; a rule that returns True marks the loop stopped early.
        prepare: hooks run first, before the NaN stop (they complete the step's metrics).
        log_every: history period when it is not ``options.log_every`` (e.g. counted in steps, not epochs).
        sink: called with every new history row (e.g. to append it to a file), or None.

    Attributes:
        count_nan_step: the step whose metrics tripped the NaN stop counts as done in a checkpoint's
            ``steps_done`` (True, training's count of its epochs); an attack, whose last update is not
            applied when it is not finite, sets it False.
    """

    count_nan_step: bool = True

    def __init__(self, step: StepFn, *, display: Display, options: LoopOptions = LoopOptions(),
                 watch: Sequence[str] | None = None, stops: Sequence[Hook] = (), prepare: Sequence[Hook] = (),
                 log_every: int | None = None, sink: Callable[[dict[str, float]], None] | None = None) -> None:
        self.step, self.display, self.options = step, display, options
        self.history = History(every=options.log_every if log_every is None else log_every, sink=sink)
        self.nan_stop = NaNStop(keys=None if watch is None else list(watch))
        self.stops = [_StopRule(rule, self) for rule in stops]
        self.prepare = list(prepare)
        self.stopped_early = False
        self.saver: Checkpoint | None = None
        self.restored_metrics: dict[str, float] = {}
        self.ended: Status | None = None

    def restore(self, progress: Progress, *, history: Sequence[dict[str, Any]] | None = None) -> None:
        """Bring back what a resumed loop had: its history rows (``progress.history``, or ``history`` where
        the caller keeps them), its stop rules' memory, its last metrics and how it had ended."""
        self.history.rows = list(progress.history or [] if history is None else history)
        for rule, state in zip(self.stops, progress.stop_state):
            rule.load_state_dict(state)
        self.restored_metrics = dict(progress.metrics)
        self.stopped_early = progress.status is Status.STOPPED_EARLY
        self.ended = progress.status if progress.status.finished else None

    def resume(self, store: Store | None, stepper: Resumable, *, enabled: bool,
               history: Callable[[int], Sequence[dict[str, Any]]] | None = None) -> Start:
        """Continue where ``store``'s checkpoint left ``stepper`` and this loop, when ``enabled`` and there is one.

        Args:
            store: the checkpoint's place and key (None: no checkpoints, a fresh start).
            stepper: loaded with the checkpoint's tensors and its stepper record.
            enabled: resume was asked for (else a fresh start, whatever the folder holds).
            history: the history rows of the first ``n`` steps, where the checkpoint does not hold them.

        Raises:
            CheckpointError: an unusable checkpoint; whatever ``store.check`` raises for another run's.
        """
        found = store.load() if store is not None and enabled else None
        if found is None:
            return Start()
        tensors, progress = found
        stepper.load_state(tensors, progress.stepper)
        self.restore(progress, history=None if history is None else history(progress.steps_done))
        return Start(progress)

    def progress(self, state: LoopState, *, key: str, record: Mapping[str, Any], history: bool = True) -> Progress:
        """The :class:`~datarecon.kernel.resume.Progress` a checkpoint of ``state`` records (a resumed loop that
        has taken no step keeps the metrics its checkpoint recorded)."""
        uncounted = 1 if self.nan_stop.tripped and not self.count_nan_step else 0
        return Progress(resume_key=key, steps_done=state.step - uncounted, total=state.total, status=self.status(state),
                        stop_reason=state.stop_reason, wall_time_s=state.wall_time_s,
                        metrics=dict(state.metrics or self.restored_metrics),
                        stop_state=tuple(rule.state_dict() for rule in self.stops),
                        history=list(self.history.rows) if history else None, stepper=dict(record))

    def keep(self, store: Store, stepper: Resumable, *, every: int, updating: Updating | None = None) -> None:
        """Checkpoint ``stepper`` and this loop's :meth:`progress` into ``store`` every ``every`` steps and at the
        end of the loop (not when ``updating`` was stopped in the middle of an update: that is no state the run
        passes through)."""
        def save(state: LoopState) -> None:
            progress = self.progress(state, key=store.key, record=stepper.state_record(), history=store.history)
            store.save(stepper.state_tensors(), progress)

        self.saver = Checkpoint(save, every=every, stepper=updating)

    def run_resumed(self, start: Start, store: Store | None, stepper: Resumable, *, total: int, every: int,
                    updating: Updating | None = None) -> LoopState:
        """The run from ``start`` (:meth:`resume`) to ``total`` steps, checkpointed into ``store`` (None: not
        checkpointed); a run that had finished returns its recorded end and writes nothing."""
        if start.finished(total):
            return start.progress.end_state()  # type: ignore[union-attr]
        if store is not None:
            self.keep(store, stepper, every=every, updating=updating)
        return self.run(start=start.step, total=total, elapsed_s=start.elapsed)

    @property
    def diverged(self) -> bool:
        """Whether the NaN stop ended the loop (now, or before the checkpoint it resumed from)."""
        return self.nan_stop.tripped or self.ended is Status.DIVERGED

    def hooks(self) -> list[Hook]:
        """The engine's hooks, in the order of the module docstring (a fresh progress display)."""
        d = self.display
        progress = ProgressBar(keys=d.keys, labels=d.labels, desc=d.desc, unit=d.unit, every=d.every,
                               mode=self.options.progress)
        saver = [self.saver] if self.saver is not None else []
        return [*self.prepare, self.nan_stop, self.history, *self.stops, progress, *saver, *self.options.hooks]

    def begin(self, *, start: int, total: int, elapsed_s: float = 0.0) -> RunningLoop:
        """The loop one step at a time, from ``start`` of ``total`` steps: a driver computes each step
        (e.g. with the steps of other loops) and hands its metrics to :meth:`RunningLoop.advance`."""
        return Engine(self.step, hooks=self.hooks()).begin(start=start, total=total, elapsed_s=elapsed_s,
                                                           metrics=self.restored_metrics)

    def run(self, *, start: int, total: int, elapsed_s: float = 0.0) -> LoopState:
        """Run steps ``start .. total-1`` (fewer if a hook stops the loop); the final state."""
        return Engine(self.step, hooks=self.hooks()).run(start=start, total=total, elapsed_s=elapsed_s,
                                                         metrics=self.restored_metrics)

    def status(self, state: LoopState) -> Status:
        """Where the loop of ``state`` stands: the one status rule of every loop (and of its checkpoints).

        ``diverged`` when the NaN stop tripped (now or before its resume); ``stopped-early`` when a stop rule
        ended it (now or before its resume) or a hook gave another stop reason than ``completed``;
        ``complete`` when it ran every step; else ``running``.
        """
        if self.diverged:
            return Status.DIVERGED
        if self.stopped_early or state.stop_reason not in ("", "completed"):
            return Status.STOPPED_EARLY
        if state.stop_reason == "completed" or state.step >= state.total:
            return Status.COMPLETE
        return Status.RUNNING


def check_key(meta: Mapping[str, Any], field_name: str, key: str, *, refuse: Callable[[Any], Exception]) -> None:
    """Refuse a checkpoint whose metadata ``meta[field_name]`` is not ``key``: a checkpoint resumes
    only under the key of the run that wrote it (training's configuration tag, an attack's resume key).

    Args:
        meta: the checkpoint's metadata.
        field_name: the metadata field that holds the key.
        key: the key of the run resuming now.
        refuse: the error to raise, given the checkpoint's key (None when it has none).

    Raises:
        Exception: ``refuse(found)`` when the keys differ (a missing field differs from every key).
    """
    found = meta.get(field_name)
    if found != key:
        raise refuse(found)


__all__ = ["Display", "RunLoop", "check_key"]
