"""Did an attack converge? Judged from its own history (attacker-side signals only), by the rule the attack
declares (:class:`ConvergenceRule`, :attr:`datarecon.attacks.base.Attack.convergence`).

A rule names the history metric it judges and how:

* **an absolute rule** (``tol`` set; the KKT family's relative stationarity residual, whose optimum is
  0 and whose scale is fixed): converged iff the final value is at most ``tol``. Where the run's
  record holds the metric's exact form for the final candidates (the rule's ``final`` criterion of
  ``run.json`` ``selection``, e.g. the KKT family's ``relative_residual`` with the exact ReLU, the
  number the command line prints), that value is judged, else the last logged value (e.g. the
  objective residual with the surrogate ReLU derivative the attack optimises). One row is enough, so a
  one-step run (residual ~0.9) is flagged however good its numbers look.
* **the relative rule** (``tol`` None, e.g. the bilevel attack's upper-level ``loss`` ‖θ* − θ(x)‖²,
  whose optimum is 0): converged iff the metric fell to at most :data:`REDUCTION_TOL` times its first
  value (the rule's ``initial`` value of ``run.json`` ``extra`` when recorded, e.g. the loss before the
  first step, else the first logged one), or changed by at most :data:`PLATEAU_TOL` (relative) over the
  last :data:`PLATEAU_WINDOW` of the logged steps (it has plateaued). A verdict names the criterion that
  decided it and by how much.

A run that diverged or did not finish is not converged; the relative rule also needs at least
:data:`MIN_ROWS` history rows.

References:
    Haim et al. (2022) eq. 5 (the stationarity condition whose residual is measured);
    Runkel et al. (2024) eq. 2 (the bilevel upper-level loss).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datarecon.kernel.status import EVALUABLE, Status
from datarecon.utils.io import as_float

__all__ = ["RESIDUAL_TOL", "PLATEAU_TOL", "PLATEAU_WINDOW", "REDUCTION_TOL", "MIN_ROWS", "Convergence",
           "ConvergenceRule", "assess_convergence", "recorded_values"]

#: Largest final relative stationarity residual called converged (the KKT family's absolute rule).
RESIDUAL_TOL = 0.05
#: Largest relative change of the loss over the last window called a plateau.
PLATEAU_TOL = 0.01
#: Share of the logged steps that forms the last window.
PLATEAU_WINDOW = 0.1
#: Fewest history rows from which convergence is judged.
MIN_ROWS = 3
#: A loss whose optimum is 0 (‖θ* − θ(x)‖², ‖∇_θE‖²) that fell to at most this share of its first
#: logged value has converged, even if it is still falling by more than PLATEAU_TOL per window.
REDUCTION_TOL = 1e-6


@dataclass(frozen=True)
class ConvergenceRule:
    """How an attack's history says whether it converged (each attack declares one; the report, ``evaluate``
    and the early stop read it, never a method's metric names).

    Attributes:
        metric: the history key judged, a metric that falls as the attack progresses (the early stop
            watches it too).
        label: how reports and verdicts name it.
        tol: an absolute rule: converged iff the final value is at most ``tol`` (reports draw it as a line);
            None: the relative rule (a fall to :data:`REDUCTION_TOL` of the first value, or a plateau).
        final: the ``run.json`` ``selection`` criterion that holds the final candidates' exact value of the
            metric, judged instead of the last logged one ("" none).
        final_label: how reports name ``final``.
        initial: the ``run.json`` ``extra`` key holding the metric before the first step, from which the
            fall is measured ("" none: the first logged value).
        caption: what a report's convergence figure shows ("" : "<label> per logged step").
    """

    metric: str = "loss"
    label: str = "loss"
    tol: float | None = None
    final: str = ""
    final_label: str = ""
    initial: str = ""
    caption: str = ""


def recorded_values(rule: ConvergenceRule, record: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(final, initial) of ``rule`` read from a run record (``run.json``: ``selection[final]``, a number or
    ``{"value": ...}``, and ``extra[initial]``); None where the record has no finite number there."""
    record = record if isinstance(record, Mapping) else {}
    selection, extra = record.get("selection"), record.get("extra")
    final = selection.get(rule.final) if rule.final and isinstance(selection, Mapping) else None
    final = final.get("value") if isinstance(final, Mapping) else final
    initial = extra.get(rule.initial) if rule.initial and isinstance(extra, Mapping) else None
    values = [as_float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
              for v in (final, initial)]
    return tuple(v if math.isfinite(v) else None for v in values)  # type: ignore[return-value]


@dataclass(frozen=True)
class Convergence:
    """Verdict on one run.

    Attributes:
        converged: The verdict.
        key: The metric judged (the rule's), or "" when the history does not log it.
        final: Its last logged value (None without one).
        reason: One line a reader can check (e.g. "relative residual 0.0076 <= 0.05").
        steps: ``[step]`` of the history rows (for the curve).
        values: ``[value]`` of ``key`` per row (NaN where missing).
    """

    converged: bool
    key: str
    final: float | None
    reason: str
    steps: list[int]
    values: list[float]


def assess_convergence(history: Sequence[Mapping[str, Any]], rule: ConvergenceRule = ConvergenceRule(), *,
                       status: str = Status.COMPLETE, record: Mapping[str, Any] | None = None,
                       plateau_tol: float = PLATEAU_TOL, window: float = PLATEAU_WINDOW,
                       reduction_tol: float = REDUCTION_TOL) -> Convergence:
    """Judge convergence from ``history.jsonl`` rows by ``rule`` (see the module docstring for the rules).

    Args:
        history: Rows ``{"step": int, metric: value, ...}`` in step order.
        rule: the attack's declared rule (:attr:`datarecon.attacks.base.Attack.convergence`).
        status: The run's status (``complete``, ``stopped-early``, ``diverged``, ``running``, ...).
        record: the run's ``run.json`` (the rule's ``final`` and ``initial`` values are read from it), or None.
        plateau_tol: See :data:`PLATEAU_TOL`.
        window: See :data:`PLATEAU_WINDOW`, in ``(0, 1]``.
        reduction_tol: See :data:`REDUCTION_TOL`.

    Returns:
        :class:`Convergence`.
    """
    rows = [r for r in history if isinstance(r, Mapping)]
    key = rule.metric if any(rule.metric in r for r in rows) else ""
    steps = [int(as_float(r.get("step", i + 1))) if math.isfinite(as_float(r.get("step", i + 1))) else i + 1
             for i, r in enumerate(rows)]
    values = [as_float(r.get(key)) for r in rows] if key else []
    finite = [v for v in values if math.isfinite(v)]
    final = finite[-1] if finite else None
    if status == Status.DIVERGED or (values and not math.isfinite(values[-1])):
        return Convergence(False, key, final, f"diverged ({key or rule.metric} not finite)", steps, values)
    if status not in EVALUABLE:
        return Convergence(False, key, final, f"run not finished (status {status})", steps, values)
    exact, initial = recorded_values(rule, record)
    if rule.tol is not None and key and (exact is not None or final is not None):
        judged, name = (exact, rule.final_label) if exact is not None else (final, rule.label)
        ok = judged <= rule.tol
        return Convergence(ok, key, final, f"{name} {judged:.3g} {'<=' if ok else '>'} {rule.tol:g}", steps, values)
    if len(finite) < MIN_ROWS:
        return Convergence(False, key, final, f"too short to judge ({len(finite)} history rows; "
                           f"at least {MIN_ROWS} needed)", steps, values)
    ok, reason = _relative(rule, finite, initial=initial, plateau_tol=plateau_tol, window=window,
                           reduction_tol=reduction_tol)
    return Convergence(ok, key, final, reason, steps, values)


def _relative(rule: ConvergenceRule, finite: list[float], *, initial: float | None, plateau_tol: float,
              window: float, reduction_tol: float) -> tuple[bool, str]:
    """The relative rule on the finite logged values ``finite`` (module docstring): (converged, reason)."""
    last = max(2, math.ceil(window * len(finite)))
    start, end = finite[-last], finite[-1]
    change = abs(end - start) / max(abs(start), 1e-12)
    first = initial if initial is not None and initial > 0 else finite[0]
    reduced = abs(end) / max(abs(first), 1e-300)
    plateau = change <= plateau_tol
    if reduced <= reduction_tol:
        return True, f"{rule.label} fell to {reduced:.2g} of its first value {first:.3g} (<= {reduction_tol:g})"
    what = "plateaued" if plateau else "still changing"
    reason = (f"{rule.label} {what}: {100 * change:.2g}% change over the last {last} logged steps "
              f"({'<=' if plateau else '>'} {100 * plateau_tol:g}%)")
    if not plateau:
        reason += f", and at {reduced:.2g} of its first value (> {reduction_tol:g})"
    return plateau, reason
