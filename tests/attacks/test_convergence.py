"""The converged/not flag of a run, from its own history (attacker-side), by the rule its attack declares."""

from __future__ import annotations

import math

from datarecon.attacks.base import convergence_of
from datarecon.attacks.convergence import RESIDUAL_TOL, ConvergenceRule, assess_convergence

KKT = convergence_of("kkt")
BILEVEL = convergence_of("bilevel")


def _rows(values, key="rel_residual"):
    return [{"step": 10 * (i + 1), key: v} for i, v in enumerate(values)]


def test_kkt_residual_rule() -> None:
    good = assess_convergence(_rows([0.9, 0.1, 0.01]), KKT)
    assert good.converged and good.key == "rel_residual" and good.final == 0.01
    assert good.reason == f"objective residual (surrogate) 0.01 <= {RESIDUAL_TOL:g}"
    one_step = assess_convergence([{"step": 1, "rel_residual": 0.94, "loss": 60.0}], KKT)
    assert not one_step.converged and one_step.reason.startswith("objective residual (surrogate) 0.94 > ")
    assert good.steps == [10, 20, 30]


def test_diverged_unfinished_and_empty_runs_are_not_converged() -> None:
    assert assess_convergence(_rows([0.5, math.nan]), KKT).reason.startswith("diverged")
    assert not assess_convergence(_rows([0.5, 0.01]), KKT, status="diverged").converged
    assert assess_convergence(_rows([0.5, 0.01]), KKT, status="running").reason == "run not finished (status running)"
    empty = assess_convergence([])
    assert not empty.converged and empty.reason.startswith("too short to judge")


def test_loss_plateau_rule_against_a_hand_count() -> None:
    flat = [10.0 / (i + 1) for i in range(50)] + [0.2] * 50  # last 10% (10 rows) unchanged
    r = assess_convergence(_rows(flat, key="loss"))
    assert r.converged and r.key == "loss" and "plateaued" in r.reason
    falling = [1.0 - 0.005 * i for i in range(100)]  # last 10 rows: 0.55 -> 0.505, 8.2% change
    r = assess_convergence(_rows(falling, key="loss"))
    assert not r.converged and "still changing: 8.2% change over the last 10 logged steps" in r.reason


def test_the_verdict_judges_the_final_relative_residual_the_command_line_prints() -> None:
    """Issue 25 item 3: one number called "relative residual" (exact ReLU, final candidates); the
    history's surrogate value is the "objective residual". A run whose objective residual is below
    the tolerance but whose relative residual is not is not converged, and the reason says which."""
    r = assess_convergence(_rows([0.9, 0.1, 0.01]), KKT, record={"selection": {"relative_residual": {"value": 0.0177}}})
    assert r.converged and r.reason == f"relative residual 0.0177 <= {RESIDUAL_TOL:g}" and r.final == 0.01
    r = assess_convergence(_rows([0.9, 0.1, 0.01]), KKT, record={"selection": {"relative_residual": 0.12}})
    assert not r.converged and r.reason == f"relative residual 0.12 > {RESIDUAL_TOL:g}"


def test_a_loss_with_optimum_zero_that_fell_a_millionfold_has_converged() -> None:
    """Issue 25 item 4: "NOT converged" at loss 2.7e-8 (from 7.2) while still falling geometrically;
    the loss rule also accepts a fall to 1e-6 of the first value and names the failing criterion."""
    falling = [7.2 * 0.5 ** i for i in range(30)]  # 7.2 -> 1.3e-8, halving per row
    r = assess_convergence(_rows(falling, key="loss"))
    assert r.converged and r.reason.startswith("loss fell to 1.9e-09 of its first value 7.2 (<= 1e-06)")
    slow = [1.0 - 0.005 * i for i in range(100)]
    r = assess_convergence(_rows(slow, key="loss"))
    assert not r.converged and r.reason.endswith("and at 0.51 of its first value (> 1e-06)")


def test_the_fall_is_measured_from_the_loss_before_the_first_step() -> None:
    """A bilevel history logs from step 10 (3e-3 there, 4.6e-9 at step 50): measured from the loss at x0
    (7.2, run.json extra.param_distance_x0) it fell a billionfold and has converged."""
    rows = _rows([3.2e-3, 1.8e-5, 1.1e-6, 9.0e-8, 4.6e-9], key="loss")
    assert not assess_convergence(rows, BILEVEL).converged
    r = assess_convergence(rows, BILEVEL, record={"extra": {"param_distance_x0": 7.2}})
    assert r.converged and r.reason == "loss fell to 6.4e-10 of its first value 7.2 (<= 1e-06)"


def test_every_rule_is_declared_by_its_attack_and_a_method_not_installed_gets_the_loss_rule() -> None:
    """Generic code reads the declaration: a rule with another metric judges that metric (a history that logs
    only ``rel_residual`` says nothing to the loss rule), and an unknown method (an uninstalled plug-in, a
    pool) is judged by the default rule."""
    rows = _rows([0.9, 0.1, 0.01])
    assert assess_convergence(rows, convergence_of("no-such-attack")).reason.startswith("too short to judge")
    own = ConvergenceRule(metric="rel_residual", label="my residual", tol=0.05)
    assert assess_convergence(rows, own).reason == "my residual 0.01 <= 0.05"
    assert KKT.metric == "rel_residual" and BILEVEL.initial == "param_distance_x0"
