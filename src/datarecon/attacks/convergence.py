"""Did an attack converge? Judged from its own history (attacker-side signals only).

Two rules, chosen by what the history holds:

* **KKT family** (``rel_residual`` logged): converged iff the **relative residual**
  ``‖θ* − g‖² / ‖θ*‖²`` of the final candidates, with the exact ReLU model (``run.json``
  ``selection.relative_residual``, the number the command line prints), is at most
  :data:`RESIDUAL_TOL` (x = 0 gives 1). Without that value the last logged ``rel_residual`` is
  judged: the **objective residual**, the same ratio with the surrogate ReLU derivative the attack
  optimises (it differs from the relative residual, so reports name the two apart).
  A one-step run (residual ~0.9) is therefore flagged, however good its numbers look.
* **otherwise** (e.g. the bilevel attack's upper-level ``loss`` ‖θ* − θ(x)‖², whose optimum is 0):
  converged iff the loss fell to at most :data:`REDUCTION_TOL` times its first logged value, or
  changed by at most :data:`PLATEAU_TOL` (relative) over the last :data:`PLATEAU_WINDOW` of the
  logged steps (it has plateaued). A verdict names the criterion that decided it and by how much.

A run that diverged or did not finish is not converged; the plateau rule also needs at least
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
           "assess_convergence"]

#: Largest final relative stationarity residual called converged (KKT family).
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
class Convergence:
    """Verdict on one run.

    Attributes:
        converged: The verdict.
        key: The metric judged (``rel_residual`` or ``loss``), or "" without history.
        final: Its last logged value (None without one).
        reason: One line a reader can check ("relative residual 0.0076 <= 0.05").
        steps: ``[step]`` of the history rows (for the curve).
        values: ``[value]`` of ``key`` per row (NaN where missing).
    """

    converged: bool
    key: str
    final: float | None
    reason: str
    steps: list[int]
    values: list[float]


def assess_convergence(history: Sequence[Mapping[str, Any]], *, status: str = Status.COMPLETE,
                       residual_tol: float = RESIDUAL_TOL, plateau_tol: float = PLATEAU_TOL,
                       window: float = PLATEAU_WINDOW, relative_residual: float | None = None,
                       reduction_tol: float = REDUCTION_TOL, initial_loss: float | None = None) -> Convergence:
    """Judge convergence from ``history.jsonl`` rows (see the module docstring for the rules).

    Args:
        history: Rows ``{"step": int, metric: value, ...}`` in step order.
        status: The run's status (``complete``, ``stopped-early``, ``diverged``, ``running``, ...).
        residual_tol: See :data:`RESIDUAL_TOL`.
        plateau_tol: See :data:`PLATEAU_TOL`.
        window: See :data:`PLATEAU_WINDOW`, in ``(0, 1]``.
        relative_residual: The final candidates' relative residual with the exact ReLU model
            (``run.json`` ``selection.relative_residual.value``); judged instead of the history's
            objective residual when given (KKT family).
        reduction_tol: See :data:`REDUCTION_TOL`.
        initial_loss: The loss before the first step (e.g. the bilevel attack's ``param_distance_x0``);
            the fall is measured from it when given, else from the first logged value.

    Returns:
        :class:`Convergence`.
    """
    rows = [r for r in history if isinstance(r, Mapping)]
    key = "rel_residual" if any("rel_residual" in r for r in rows) else "loss" if any("loss" in r for r in rows) else ""
    steps = [int(as_float(r.get("step", i + 1))) if math.isfinite(as_float(r.get("step", i + 1))) else i + 1
             for i, r in enumerate(rows)]
    values = [as_float(r.get(key)) for r in rows] if key else []
    finite = [v for v in values if math.isfinite(v)]
    final = finite[-1] if finite else None
    if status == Status.DIVERGED or (values and not math.isfinite(values[-1])):
        return Convergence(False, key, final, f"diverged ({key} not finite)", steps, values)
    if status not in EVALUABLE:
        return Convergence(False, key, final, f"run not finished (status {status})", steps, values)
    exact = as_float(relative_residual)
    if key == "rel_residual" and math.isfinite(exact):  # an absolute rule on the final candidates
        ok = exact <= residual_tol
        return Convergence(ok, key, final, f"relative residual {exact:.3g} {'<=' if ok else '>'} {residual_tol:g}",
                           steps, values)
    if key == "rel_residual" and final is not None:  # an absolute rule: one row is enough
        ok = final <= residual_tol
        cmp = "<=" if ok else ">"
        return Convergence(ok, key, final, f"objective residual {final:.3g} {cmp} {residual_tol:g}", steps, values)
    if len(finite) < MIN_ROWS:
        return Convergence(False, key, final, f"too short to judge ({len(finite)} history rows; "
                           f"at least {MIN_ROWS} needed)", steps, values)
    last = max(2, math.ceil(window * len(finite)))
    start, end = finite[-last], finite[-1]
    change = abs(end - start) / max(abs(start), 1e-12)
    first = as_float(initial_loss)
    first = first if math.isfinite(first) and first > 0 else finite[0]
    reduced = abs(end) / max(abs(first), 1e-300)
    plateau = change <= plateau_tol
    fell = reduced <= reduction_tol
    if fell:
        return Convergence(True, key, final, f"loss fell to {reduced:.2g} of its first value {first:.3g} "
                           f"(<= {reduction_tol:g})", steps, values)
    what = "plateaued" if plateau else "still changing"
    reason = (f"loss {what}: {100 * change:.2g}% change over the last {last} logged steps "
              f"({'<=' if plateau else '>'} {100 * plateau_tol:g}%)")
    if not plateau:
        reason += f", and at {reduced:.2g} of its first value (> {reduction_tol:g})"
    return Convergence(plateau, key, final, reason, steps, values)
