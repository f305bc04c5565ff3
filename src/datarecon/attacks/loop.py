"""The optimisation loop of one attack run, without files.

:class:`AttackLoop` drives an :class:`~datarecon.attacks.base.Attack`'s ``step`` through the one
resumable loop (:class:`datarecon.kernel.run_loop.RunLoop`: progress, history, NaN stop, an optional
early-stopping criterion: the one plateau rule, :class:`Plateau`, on the
metric the attack declares) and turns the final state into a
:class:`~datarecon.attacks.base.Reconstruction` with the attack's ``finish``. It reads and writes
nothing: history rows leave through an optional ``sink``; checkpoints and resume are the run loop's
(:meth:`~datarecon.kernel.run_loop.RunLoop.resume`, :meth:`~datarecon.kernel.run_loop.RunLoop.keep`),
which :func:`datarecon.attacks.runner.open_run` wires to a
:class:`datarecon.attacks.run_directory.RunDirectory`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from datarecon.attacks.base import ATTACK_LOOP, DEFAULT_DIVERGENCE_HINT, Attack, AttackerPrior, Reconstruction, Target
from datarecon.attacks.subspace import subspace_scores
from datarecon.errors import DataReconError
from datarecon.kernel.status import Status
from datarecon.kernel.engine import EarlyStop, LoopOptions, LoopState, RunningLoop
from datarecon.kernel.run_loop import Display, RunLoop


class Plateau:
    """The early stop of an attack run: True once ``metric`` has not improved by a factor (1 − ``rel_tol``) for
    ``patience`` consecutive steps (attacker-side; the metric an attack declares, :meth:`of`).

    Its memory (:meth:`state_dict`) is checkpointed with the run, and :meth:`settings` are part of the run's
    resume key, so a resumed run stops where the uninterrupted one does.

    Args:
        metric: the step metric watched (it falls as the attack progresses).
        patience: steps without improvement before stopping, >= 1.
        rel_tol: the relative improvement that counts (value < best·(1 − rel_tol)), in (0, 1): a tolerance of
            1 or more could never be met, and the rule would stop after ``patience`` steps whatever happened.
        attack: how a refusal names the attack ("" none).

    Raises:
        DataReconError: patience below 1 or a tolerance outside (0, 1); at a step, a metric the step does not
            log (an attack that declares a metric it never logs), naming both.
    """

    def __init__(self, metric: str, *, patience: int, rel_tol: float = 1e-3, attack: str = "") -> None:
        if int(patience) < 1:
            raise DataReconError(f"an early stop needs a patience of at least 1 step, got {patience}; pass "
                                 "--early-stop-patience N with N >= 1 (0: no early stop)")
        if not 0.0 < float(rel_tol) < 1.0:
            raise DataReconError(f"the early stop's tolerance {rel_tol:g} is a relative improvement per step and must "
                                 "lie in (0, 1) (at 1 or more none can meet it); pass --early-stop-tol in (0, 1)")
        self.key, self.patience, self.rel_tol, self.attack = metric, int(patience), float(rel_tol), attack
        self.best = math.inf
        self.since = 0

    @classmethod
    def of(cls, attack: type[Attack] | Attack, *, patience: int, rel_tol: float) -> Plateau:
        """The plateau of the metric ``attack`` declares (:attr:`~datarecon.attacks.base.Attack.early_stop_metric`).

        Raises:
            DataReconError: the attack declares no metric for an early stop.
        """
        if attack.early_stop_metric is None:
            raise DataReconError(f"attack {attack.name!r} declares no metric an early stop can watch; drop "
                                 "--early-stop-patience (early_stop.patience 0)")
        return cls(attack.early_stop_metric, patience=patience, rel_tol=rel_tol, attack=attack.described())

    def __call__(self, metrics: Mapping[str, float]) -> bool:
        if self.key not in metrics:
            who = self.attack or "the attack"
            raise DataReconError(f"{who} declares early_stop_metric {self.key!r}, which its steps do not log (they "
                                 f"log {', '.join(sorted(metrics)) or 'nothing'}); declare one of those, or drop "
                                 "--early-stop-patience")
        v = metrics[self.key]
        if not math.isfinite(v):
            return False
        if v < self.best * (1.0 - self.rel_tol) or self.best == math.inf:
            self.best, self.since = float(v), 0
        else:
            self.since += 1
        return self.since >= self.patience

    def settings(self) -> dict[str, Any]:
        """What determines its decisions (part of a run's resume key)."""
        return {"key": self.key, "patience": self.patience, "rel_tol": repr(self.rel_tol)}

    def state_dict(self) -> dict[str, Any]:
        return {"best": repr(self.best), "since": self.since}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.best, self.since = float(d["best"]), int(d["since"])


def all_finite(state: dict[str, torch.Tensor]) -> bool:
    """True iff every floating-point tensor of ``state`` is finite."""
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


class AttackLoop:
    """One attack's optimisation: its mutable state, the built-in hooks and the final result.

    Args:
        attack: the attack (its interface: :class:`~datarecon.attacks.base.Attack`).
        target: the attacked model.
        prior: labels (m,), input shape and pixel bounds.
        state: the attack state (``attack.init_state``, or filled from a checkpoint by the run loop's
            :meth:`~datarecon.kernel.run_loop.RunLoop.resume`), updated in place.
        loop: history period, progress display and extra hooks (:class:`LoopOptions`; its
            checkpoint settings belong to the caller, which gives the run loop its store).
        early_stop: ``criterion(metrics) -> bool`` or None; its ``state_dict`` / ``load_state_dict``
            (when present) carry its memory across a resume (the run loop's stop-rule state).
        sink: called with every new history row (e.g. to append it to a file), or None.
    """

    def __init__(self, attack: Attack, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], *,
                 loop: LoopOptions = ATTACK_LOOP, early_stop: Callable[[dict[str, float]], bool] | None = None,
                 sink: Callable[[dict[str, float]], None] | None = None) -> None:
        self.attack, self.target, self.prior, self.state = attack, target, prior, state
        stops = [EarlyStop(early_stop, reason=attack.early_stop_reason)] if early_stop is not None else []
        self.run_loop = RunLoop(self.step, display=Display(attack.name, keys=attack.progress_keys, labels=attack.progress_labels),
                                options=loop, stops=stops, sink=sink)
        self.run_loop.count_nan_step = False  # a non-finite step's update is not applied: not counted

    @property
    def history(self) -> list[dict[str, float]]:
        """The history rows so far (restored ones included)."""
        return self.run_loop.history.rows

    def run(self, *, start: int, total: int, elapsed_s: float) -> LoopState:
        """Run steps ``start .. total-1`` (fewer if a hook stops the loop), ``elapsed_s`` seconds
        already spent (restored runs); the final :class:`LoopState`."""
        return self.run_loop.run(start=start, total=total, elapsed_s=elapsed_s)

    def begin(self, *, start: int, total: int, elapsed_s: float) -> RunningLoop:
        """The loop of :meth:`run`, one step at a time: a driver computes each step (e.g. with the
        steps of other runs) and hands its metrics to :meth:`RunningLoop.advance`."""
        return self.run_loop.begin(start=start, total=total, elapsed_s=elapsed_s)

    def step(self, index: int) -> dict[str, float]:
        """The attack's step ``index`` on this run's state (updated in place); its metrics."""
        return self.attack.step(self.target, self.prior, self.state, index)

    def result(self, loop: LoopState) -> Reconstruction:
        """The :class:`Reconstruction` of the state after ``loop`` (calls ``attack.finish``).

        Status: ``diverged`` when the NaN stop tripped or the state is not finite (the last finite
        state is returned, ``summary["message"]`` names the settings to lower and the non-finite
        step is not counted), ``stopped-early`` when the criterion stopped the run, else ``complete``.
        ``summary`` holds the attack's own summary plus ``final`` (last metrics and numeric summary
        values), ``selection``, ``extra``, ``message``, ``stop_reason`` and ``wall_time_s``.
        """
        attack, prior, state, nan_stop = self.attack, self.prior, self.state, self.run_loop.nan_stop
        message = ""
        status = self.run_loop.status(loop)
        if status is Status.DIVERGED or not all_finite(state):
            status = Status.DIVERGED
            hint = attack.divergence_hint
            sizes = ", ".join(f"{f} {getattr(attack.config, f):.4g}" for f in attack.step_size_fields)
            message = (f"{attack.name} diverged at step {loop.step} ({nan_stop.bad_key or 'state'} not finite)"
                       + (f" with {sizes}" if sizes else "") + f"; kept the last finite state; {hint}")
        steps_done = loop.step - (1 if nan_stop.tripped else 0)  # the non-finite step was not applied

        scores, summary = attack.finish(self.target, prior, state)
        scores, summary = dict(scores), dict(summary)
        if prior.subspace is not None and "subspace" not in scores:
            # every attack's candidates get the attacker-side subspace score (closer = higher)
            scores["subspace"] = subspace_scores(self.target.model, self.target.params, prior.subspace,
                                                 state["x"].detach()).to(state["x"].dtype)
        selection = summary.pop("selection", {})
        extra = summary.pop("extra", {})
        final = {k: v for k, v in (loop.metrics or {}).items()}
        final.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
        multipliers = attack.multipliers(prior, state)
        return Reconstruction(
            x=state["x"].detach().clone(), labels=prior.labels.clone(), multipliers=multipliers.detach().clone(),
            history=list(self.history), scores={k: v.detach().clone() for k, v in scores.items()},
            summary={**summary, "final": final, "selection": selection, "extra": extra, "message": message,
                     "stop_reason": loop.stop_reason, "wall_time_s": loop.wall_time_s},
            status=status, steps_done=steps_done,
        )


__all__ = ["ATTACK_LOOP", "DEFAULT_DIVERGENCE_HINT", "AttackLoop", "Plateau", "all_finite"]
