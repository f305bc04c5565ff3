"""One optimisation loop with hooks, shared by target training and attacks.

Like ignite's ``Engine``: the loop calls ``step(i) -> metrics`` and passes the
metrics to hooks (progress bar, history, checkpointing, NaN stop, early stop).
A hook may ask the loop to stop by returning ``True`` from ``after_step``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

StepFn = Callable[[int], dict[str, float]]


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

    Args:
        step: one optimisation step; receives the 0-based step index, returns scalar metrics.
        hooks: called in order after every step.
    """

    def __init__(self, step: StepFn, *, hooks: Sequence[Hook] = ()) -> None:
        self.step = step
        self.hooks = list(hooks)

    def run(self, *, start: int, total: int, elapsed_s: float = 0.0) -> LoopState:
        """Run steps ``start .. total-1``; returns the final state."""
        state = LoopState(step=start, total=total, wall_time_s=elapsed_s)
        for h in self.hooks:
            h.before_run(state)
        t0 = time.perf_counter()
        try:
            while state.step < total:
                state.metrics = self.step(state.step)
                state.step += 1
                state.wall_time_s = elapsed_s + time.perf_counter() - t0
                stop = False
                for h in self.hooks:
                    stop = bool(h.after_step(state)) or stop
                if stop:
                    break
            else:
                state.stop_reason = state.stop_reason or "completed"
        finally:
            state.wall_time_s = elapsed_s + time.perf_counter() - t0
            for h in self.hooks:
                h.after_run(state)
        return state


class ProgressBar(BaseHook):
    """tqdm bar over steps showing selected metrics (disabled when ``enabled`` is False)."""

    def __init__(self, *, keys: Sequence[str] = (), desc: str = "", enabled: bool = True,
                 every: int = 1) -> None:
        self.keys, self.desc, self.enabled, self.every = list(keys), desc, enabled, max(1, every)
        self.bar: tqdm | None = None

    def before_run(self, state: LoopState) -> None:
        if self.enabled:
            self.bar = tqdm(total=state.total, initial=state.step, desc=self.desc, leave=False,
                            dynamic_ncols=True)

    def after_step(self, state: LoopState) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if state.step % self.every == 0:
                shown = {k: f"{state.metrics[k]:.3g}" for k in self.keys if k in state.metrics}
                self.bar.set_postfix(shown, refresh=False)

    def after_run(self, state: LoopState) -> None:
        if self.bar is not None:
            self.bar.close()


class History(BaseHook):
    """Keeps ``{"step": i, **metrics}`` every ``every`` steps (and the last step)."""

    def __init__(self, *, every: int = 1, sink: Callable[[dict[str, float]], None] | None = None) -> None:
        self.every = max(1, every)
        self.rows: list[dict[str, float]] = []
        self.sink = sink

    def after_step(self, state: LoopState) -> None:
        if state.step % self.every == 0 or state.step == state.total:
            row = {"step": state.step, **state.metrics}
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


class Checkpoint(BaseHook):
    """Calls ``save(state)`` every ``every`` steps and at the end of the run."""

    def __init__(self, save: Callable[[LoopState], None], *, every: int) -> None:
        self.save, self.every = save, max(1, every)

    def after_step(self, state: LoopState) -> None:
        if state.step % self.every == 0 and state.step < state.total:
            self.save(state)

    def after_run(self, state: LoopState) -> None:
        self.save(state)


class EarlyStop(BaseHook):
    """Stops when ``criterion(metrics)`` returns True (attacker-side signals only)."""

    def __init__(self, criterion: Callable[[dict[str, float]], bool], *, reason: str) -> None:
        self.criterion, self.reason = criterion, reason

    def after_step(self, state: LoopState) -> bool:
        if self.criterion(state.metrics):
            state.stop_reason = self.reason
            return True
        return False
