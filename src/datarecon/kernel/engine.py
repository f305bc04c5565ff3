"""One optimisation loop with hooks, shared by target training and attacks.

Like ignite's ``Engine``: the loop calls ``step(i) -> metrics`` and passes the
metrics to hooks (progress bar, history, checkpointing, NaN stop, early stop).
A hook may ask the loop to stop by returning ``True`` from ``after_step``. The resumable loops
(target training, margin ascent, DP-SGD, attacks) get their engine and built-in hooks from
:class:`datarecon.kernel.run_loop.RunLoop`.

Progress has one mechanism for every loop (:class:`ProgressBar` for an :class:`Engine`,
:func:`track` for plain iterations): a tqdm bar on a terminal, plain rate-limited lines
when stderr is a file or a pipe (no carriage returns in logs), or nothing.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TextIO, TypeVar

from tqdm.auto import tqdm

from datarecon.errors import DataReconError

T = TypeVar("T")

StepFn = Callable[[int], dict[str, float]]

#: Test-only fault injection, deterministic: ``STEP[:SIGNAL[:LOOP]]`` makes the LOOP-th loop run by this
#: process (0-based, default 0) send SIGNAL (KILL, INT, TERM; default KILL) to its own process right
#: after step STEP's hooks ran (its checkpoint and history row written when STEP is due for them).
#: The kill/resume trials use it instead of killing at a polled, timed moment.
FAULT_STEP_ENV = "DATARECON_FAULT_AT_STEP"


def send_fault(sig: int) -> None:
    """Test-only fault injection: send ``sig`` to this process as a user would, SIGINT as a Ctrl-C (a process
    started in the background inherits SIGINT ignored, and Python then raises no KeyboardInterrupt: the fault
    would be lost and the run end normally)."""
    if sig == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(os.getpid(), sig)


_loops_run = 0
_uncounted = 0


@contextmanager
def uncounted_loops() -> Iterator[None]:
    """Loops started inside are not counted by the fault injection (a run's own preliminary loops, e.g. the
    step-size probe, so ``STEP:SIGNAL:LOOP`` keeps naming the loops a user sees)."""
    global _uncounted
    _uncounted += 1
    try:
        yield
    finally:
        _uncounted -= 1


def _fault_step() -> tuple[int, int] | None:
    """(step, signal) this loop is to fault at, from :data:`FAULT_STEP_ENV`; None when not this loop."""
    global _loops_run
    if _uncounted:
        return None
    loop, _loops_run = _loops_run, _loops_run + 1
    spec = os.environ.get(FAULT_STEP_ENV)
    if not spec:
        return None
    parts = spec.split(":")
    step, sig, at_loop = int(parts[0]), (parts[1:2] or ["KILL"])[0], int((parts[2:3] or ["0"])[0])
    return (step, int(getattr(signal, f"SIG{sig}"))) if at_loop == loop else None


@dataclass
class LoopState:
    """Mutable state of a running loop (owned by :class:`Engine`)."""

    step: int = 0  # number of completed steps
    total: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: str = ""
    wall_time_s: float = 0.0


class Hook(Protocol):
    """Something that reacts to the loop (all methods optional in spirit)."""

    def before_run(self, state: LoopState) -> None: ...

    def after_step(self, state: LoopState) -> bool | None: ...

    def after_run(self, state: LoopState) -> None: ...


@dataclass(frozen=True)
class LoopOptions:
    """How a resumable loop reports and persists itself: the settings that target training, margin
    ascent, DP-SGD and every attack share (one definition, so each loop takes one argument for them).

    Attributes:
        log_every: A history row every this many steps (and after the last), ≥ 1.
        progress: Progress display: a name in :data:`PROGRESS_MODES` or a bool (True = ``auto``,
            False = ``off``).
        checkpoint_every: Checkpoint period in steps (0: only at the end of the run).
        resume: Continue from the loop's checkpoint when there is one (else start fresh).
        hooks: Extra engine hooks, run after the built-in ones.
    """

    log_every: int = 1
    progress: bool | str = False
    checkpoint_every: int = 0
    resume: bool = False
    hooks: tuple[Hook, ...] = ()


class BaseHook:
    """No-op hook to subclass."""

    def before_run(self, state: LoopState) -> None:
        return None

    def after_step(self, state: LoopState) -> bool | None:
        return None

    def after_run(self, state: LoopState) -> None:
        return None


class Engine:
    """Runs ``step`` from ``state.step`` to ``total`` with hooks.

    :meth:`run` is the whole loop. :meth:`begin` gives the same loop one step at a time (a
    :class:`RunningLoop`): a driver that computes the steps of several loops together (K attack runs
    against one target, :mod:`datarecon.attacks.batched`) advances each loop with its metrics, so
    every loop's hooks, stop rules and fault point are the ones :meth:`run` would use.

    Args:
        step: one optimisation step; receives the 0-based step index, returns scalar metrics.
        hooks: called in order after every step.
    """

    def __init__(self, step: StepFn, *, hooks: Sequence[Hook] = ()) -> None:
        self.step = step
        self.hooks = list(hooks)

    def begin(self, *, start: int, total: int, elapsed_s: float = 0.0,
              metrics: Mapping[str, float] | None = None) -> RunningLoop:
        """Start the loop at ``start`` (the hooks' ``before_run`` are called); step it with :meth:`RunningLoop.advance`.
        ``metrics``: those of step ``start`` (a resumed loop's checkpoint), the state's until a step is taken."""
        return RunningLoop(self.hooks, LoopState(step=start, total=total, wall_time_s=elapsed_s,
                                                 metrics=dict(metrics or {})))

    def run(self, *, start: int, total: int, elapsed_s: float = 0.0,
            metrics: Mapping[str, float] | None = None) -> LoopState:
        """Run steps ``start .. total-1``; returns the final state."""
        loop = self.begin(start=start, total=total, elapsed_s=elapsed_s, metrics=metrics)
        finished = False
        try:
            while loop.going:
                loop.advance(self.step(loop.state.step))
            finished = True
        finally:
            loop.end(finished=finished)
        return loop.state


class RunningLoop:
    """One running loop of an :class:`Engine`, advanced by its driver one step at a time.

    Args:
        hooks: the engine's hooks (``before_run`` is called here).
        state: the loop's state at its start (``step`` = steps already done, ``total``).
    """

    def __init__(self, hooks: Sequence[Hook], state: LoopState) -> None:
        self.hooks, self.state, self.stopped = hooks, state, False
        self.elapsed_s = state.wall_time_s
        self.fault = _fault_step()
        for h in self.hooks:
            h.before_run(state)
        self.t0 = time.perf_counter()

    @property
    def going(self) -> bool:
        """True while no hook has stopped the loop and steps remain."""
        return not self.stopped and self.state.step < self.state.total

    def advance(self, metrics: dict[str, float]) -> None:
        """Record the step just taken (its ``metrics``) and run the hooks' ``after_step``."""
        state = self.state
        state.metrics = metrics
        state.step += 1
        state.wall_time_s = self.elapsed_s + time.perf_counter() - self.t0
        stop = False
        for h in self.hooks:
            stop = bool(h.after_step(state)) or stop
        if self.fault is not None and state.step == self.fault[0]:
            send_fault(self.fault[1])
        self.stopped = stop

    def end(self, *, finished: bool) -> LoopState:
        """Close the loop: ``completed`` unless a hook stopped it or it did not finish (an error), then
        the hooks' ``after_run`` (e.g. the last checkpoint)."""
        state = self.state
        if finished and not self.stopped:
            state.stop_reason = state.stop_reason or "completed"
        state.wall_time_s = self.elapsed_s + time.perf_counter() - self.t0
        for h in self.hooks:
            h.after_run(state)
        return state


#: How progress is shown: ``auto`` (a bar on a terminal, plain lines otherwise), ``bar`` (tqdm),
#: ``lines`` (plain, rate-limited lines for log files), ``off``.
PROGRESS_MODES: tuple[str, ...] = ("auto", "bar", "lines", "off")


def resolve_progress_mode(mode: str | bool, stream: TextIO | None = None) -> str:
    """The concrete mode (``bar``, ``lines`` or ``off``) for ``mode`` on ``stream``.

    Args:
        mode: One of :data:`PROGRESS_MODES`, or a bool (True = ``auto``, False = ``off``).
        stream: Where progress goes (default ``sys.stderr``); ``auto`` shows a bar only when it
            is a terminal, so logs captured to a file get lines without carriage returns.

    Raises:
        DataReconError: unknown mode.
    """
    if isinstance(mode, bool):
        mode = "auto" if mode else "off"
    if mode not in PROGRESS_MODES:
        raise DataReconError(f"unknown progress mode {mode!r}; valid modes: {', '.join(PROGRESS_MODES)}")
    if mode != "auto":
        return mode
    stream = sys.stderr if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or file-less streams
        tty = False
    return "bar" if tty else "lines"


def _clock(seconds: float) -> str:
    """``H:MM:SS`` of a duration (``?`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_metrics(metrics: Mapping[str, float], keys: Sequence[str], labels: Mapping[str, str] | None = None) -> str:
    """``"loss 0.123 residual 4.5e-05"``: the ``keys`` present in ``metrics``, 3 significant digits, each
    shown under its ``labels`` entry when it has one."""
    labels = labels or {}
    return " ".join(f"{labels.get(k, k)} {metrics[k]:.3g}" for k in keys if isinstance(metrics.get(k), (int, float)))


@dataclass(frozen=True)
class LineRate:
    """How often plain progress lines are written: at most one per ``interval_s`` seconds *and* ``min_fraction``.

    Attributes:
        interval_s: Minimum seconds between lines (≥ 0).
        min_fraction: Minimum fraction of the total between lines, in [0, 1].
    """

    interval_s: float = 5.0
    min_fraction: float = 0.01


class ProgressLines:
    """Plain progress lines (no carriage returns), at most one per ``interval_s`` and ``min_fraction``.

    A line reads ``DESC: step 120/2000 (6%), 45.3 step/s, ETA 0:00:41, loss 0.123`` and is written
    when at least ``interval_s`` seconds *and* ``min_fraction`` of the total have passed since the
    previous one (so a 10-hour run writes at most ~100 lines, a 15-second one two or three); a
    last line gives the steps done, the wall time and the stop reason.

    Args:
        total: Steps (or items) in all.
        start: Steps already done (a resumed run: a first line says so); the rate counts only this run's steps.
        desc: Prefix of every line.
        unit: What a step is called ("step", "epoch", "run").
        keys: Metrics shown, in order (a mapping: each with the label it is shown under).
        rate: The rate limit (:class:`LineRate`: minimum seconds and fraction of ``total`` between lines).
        stream: Output (default ``sys.stderr`` at construction time).
        clock: Time source (``time.monotonic``; tests pass a fake).
    """

    def __init__(self, total: int, *, start: int = 0, desc: str = "", unit: str = "step",
                 keys: Sequence[str] | Mapping[str, str] = (), rate: LineRate | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        rate = rate or LineRate()
        self.total, self.start, self.desc, self.unit = int(total), int(start), desc or "progress", unit
        self.keys, self.interval_s, self.min_fraction = list(keys), float(rate.interval_s), float(rate.min_fraction)
        self.labels = dict(keys) if isinstance(keys, Mapping) else {}
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.t0 = self.last_t = clock()
        self.last_step = self.start
        self.lines = 0
        if self.start:
            self._write(f"resumed at {self.unit} {self.start}/{self.total}")

    def _write(self, text: str) -> None:
        self.stream.write(f"{self.desc}: {text}\n")
        self.stream.flush()
        self.lines += 1

    def update(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
        """Note that ``step`` steps are done; write a line if enough time and progress passed."""
        now = self.clock()
        frac = (step - self.last_step) / self.total if self.total else 1.0
        if now - self.last_t < self.interval_s or frac < self.min_fraction:
            return
        rate = (step - self.start) / (now - self.t0) if now > self.t0 else float("nan")
        eta = (self.total - step) / rate if rate and math.isfinite(rate) else float("nan")
        pct = f" ({100 * step / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.unit} {step}/{self.total}{pct}", f"{rate:.3g} {self.unit}/s", f"ETA {_clock(eta)}"]
        shown = format_metrics(metrics or {}, self.keys, self.labels)
        self._write(", ".join(parts + ([shown] if shown else [])))
        self.last_t, self.last_step = now, step

    def close(self, step: int, metrics: Mapping[str, float] | None = None, *, reason: str = "") -> None:
        """Write the final line: steps done, wall time, rate, reason and metrics."""
        wall = self.clock() - self.t0
        rate = (step - self.start) / wall if wall > 0 else float("nan")
        parts = [f"{'done' if step >= self.total else 'stopped at'} {self.unit} {step}/{self.total} "
                 f"in {_clock(wall)} ({rate:.3g} {self.unit}/s)"]
        if reason and reason != "completed":
            parts.append(reason)
        shown = format_metrics(metrics or {}, self.keys, self.labels)
        self._write(", ".join(parts + ([shown] if shown else [])))


class ProgressBar(BaseHook):
    """Progress over the loop's steps with selected metrics: a tqdm bar, plain lines, or nothing.

    Args:
        keys: Metrics shown beside the step count.
        labels: How a metric is named there, where not by its key (two residuals must not read alike).
        desc: Label.
        mode: One of :data:`PROGRESS_MODES`, or a bool (the ``progress=`` of the callers: True is
            ``auto``, False is ``off``); ``auto`` (default) shows a bar on a terminal and
            :class:`ProgressLines` when stderr is a file or pipe.
        every: Steps between updates of the bar's metrics.
        unit: What a step is called in ``lines`` ("step", "epoch").
        rate: Rate limit of ``lines`` (:class:`LineRate`).
        stream: Output of ``lines`` and of the ``auto`` terminal check (default ``sys.stderr``).
    """

    def __init__(self, *, keys: Sequence[str] = (), desc: str = "", mode: str | bool = "auto",
                 every: int = 1, unit: str = "step", rate: LineRate | None = None,
                 stream: TextIO | None = None, labels: Mapping[str, str] | None = None) -> None:
        self.keys, self.desc, self.every, self.unit = list(keys), desc, max(1, every), unit
        self.labels = dict(labels or {})
        self.mode = resolve_progress_mode(mode, stream)
        self.rate, self.stream = rate or LineRate(), stream
        self.bar: tqdm | None = None
        self.lines: ProgressLines | None = None

    def before_run(self, state: LoopState) -> None:
        if self.mode == "bar":
            self.bar = tqdm(total=state.total, initial=state.step, desc=self.desc, leave=False,
                            dynamic_ncols=True, file=self.stream, unit=self.unit)
        elif self.mode == "lines":
            self.lines = ProgressLines(state.total, start=state.step, desc=self.desc, unit=self.unit,
                                       keys={k: self.labels.get(k, k) for k in self.keys}, rate=self.rate,
                                       stream=self.stream)

    def after_step(self, state: LoopState) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if state.step % self.every == 0:
                shown = {self.labels.get(k, k): f"{state.metrics[k]:.3g}" for k in self.keys if k in state.metrics}
                self.bar.set_postfix(shown, refresh=False)
        elif self.lines is not None:
            self.lines.update(state.step, state.metrics)

    def after_run(self, state: LoopState) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.lines is not None:
            self.lines.close(state.step, state.metrics, reason=state.stop_reason)


def track(items: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "item",
          mode: str | bool = "auto", stream: TextIO | None = None, interval_s: float = 5.0) -> Iterator[T]:
    """Iterate ``items`` with progress in the same modes as :class:`ProgressBar` (for loops that are
    not an :class:`Engine`: evaluation chunks, sweep runs).

    Args:
        items: What to iterate.
        total: Number of items (default ``len(items)``).
        desc, unit: Label and item name.
        mode: One of :data:`PROGRESS_MODES` or a bool.
        stream: Output (default ``sys.stderr``).
        interval_s: Minimum seconds between lines in ``lines`` mode.
    """
    concrete = resolve_progress_mode(mode, stream)
    if concrete == "off":
        yield from items
        return
    n = len(items) if total is None and isinstance(items, Sized) else int(total or 0)
    if concrete == "bar":
        yield from tqdm(items, total=n, desc=desc, unit=unit, leave=False, file=stream)
        return
    lines = ProgressLines(n, desc=desc, unit=unit, rate=LineRate(interval_s=interval_s), stream=stream)
    done = 0
    for item in items:
        yield item
        done += 1
        lines.update(done)
    lines.close(done)


class History(BaseHook):
    """Keeps ``{"step": i, **metrics}`` every ``every`` steps (and the last step)."""

    def __init__(self, *, every: int = 1, sink: Callable[[dict[str, float]], None] | None = None) -> None:
        self.every = max(1, every)
        self.rows: list[dict[str, float]] = []
        self.sink = sink

    def after_step(self, state: LoopState) -> None:
        if state.step % self.every == 0 or state.step == state.total:
            self._keep({"step": state.step, **state.metrics})

    def after_run(self, state: LoopState) -> None:
        """A resumed loop that had no step left (its checkpoint at the last step, a row not due then) still ends
        with the last step's row, from the checkpoint's metrics, as the uninterrupted loop does."""
        if state.step == state.total > 0 and state.metrics and (not self.rows or self.rows[-1]["step"] != state.step):
            self._keep({"step": state.step, **state.metrics})

    def _keep(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        if self.sink is not None:
            self.sink(row)


class NaNStop(BaseHook):
    """Stops the loop when a watched metric is NaN/inf (the caller keeps the last finite state)."""

    def __init__(self, *, keys: Sequence[str] | None = None) -> None:
        self.keys = keys
        self.tripped = False
        self.bad_key = ""

    def after_step(self, state: LoopState) -> bool:
        keys = self.keys if self.keys is not None else list(state.metrics)
        for k in keys:
            v = state.metrics.get(k)
            if v is not None and not math.isfinite(v):
                self.tripped, self.bad_key = True, k
                state.stop_reason = f"diverged ({k} = {v})"
                return True
        return False


class Updating(Protocol):
    """A stepper that says whether it is in the middle of an update (a checkpoint then is no state of the run)."""

    in_update: bool


class Checkpoint(BaseHook):
    """Calls ``save(state)`` every ``every`` steps and at the end of the run, except when the run
    ended while ``stepper`` (if given) was in the middle of an update."""

    def __init__(self, save: Callable[[LoopState], None], *, every: int, stepper: Updating | None = None) -> None:
        self.save, self.every, self.stepper = save, max(1, every), stepper

    def after_step(self, state: LoopState) -> None:
        if state.step % self.every == 0 and state.step < state.total:
            self.save(state)

    def after_run(self, state: LoopState) -> None:
        if self.stepper is None or not self.stepper.in_update:
            self.save(state)


class EarlyStop(BaseHook):
    """Stops when ``criterion(metrics)`` returns True (attacker-side signals only). The criterion's
    memory (its ``state_dict`` / ``load_state_dict``, when it has them) is the rule's, checkpointed by
    :class:`~datarecon.kernel.run_loop.RunLoop`."""

    def __init__(self, criterion: Callable[[dict[str, float]], bool], *, reason: str) -> None:
        self.criterion, self.reason = criterion, reason

    def state_dict(self) -> dict[str, object]:
        fn = getattr(self.criterion, "state_dict", None)
        return dict(fn()) if fn is not None else {}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        fn = getattr(self.criterion, "load_state_dict", None)
        if fn is not None:
            fn(dict(state))

    def after_step(self, state: LoopState) -> bool:
        if self.criterion(state.metrics):
            state.stop_reason = self.reason
            return True
        return False
