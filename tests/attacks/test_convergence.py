"""The converged/not flag of a run, from its own history (attacker-side)."""

from __future__ import annotations

import math

from datarecon.attacks.convergence import RESIDUAL_TOL, assess_convergence


def _rows(values, key="rel_residual"):
    return [{"step": 10 * (i + 1), key: v} for i, v in enumerate(values)]


def test_kkt_residual_rule() -> None:
    good = assess_convergence(_rows([0.9, 0.1, 0.01]))
    assert good.converged and good.key == "rel_residual" and good.final == 0.01
    assert good.reason == f"relative residual 0.01 <= {RESIDUAL_TOL:g}"
    one_step = assess_convergence([{"step": 1, "rel_residual": 0.94, "loss": 60.0}])
    assert not one_step.converged and one_step.reason.startswith("relative residual 0.94 > ")
    assert good.steps == [10, 20, 30]


def test_diverged_unfinished_and_empty_runs_are_not_converged() -> None:
    assert assess_convergence(_rows([0.5, math.nan])).reason.startswith("diverged")
    assert not assess_convergence(_rows([0.5, 0.01]), status="diverged").converged
    assert assess_convergence(_rows([0.5, 0.01]), status="running").reason == "run not finished (status running)"
    empty = assess_convergence([])
    assert not empty.converged and empty.reason.startswith("too short to judge")


def test_loss_plateau_rule_against_a_hand_count() -> None:
    flat = [10.0 / (i + 1) for i in range(50)] + [0.2] * 50  # last 10% (10 rows) unchanged
    r = assess_convergence(_rows(flat, key="loss"))
    assert r.converged and r.key == "loss" and "plateaued" in r.reason
    falling = [1.0 - 0.005 * i for i in range(100)]  # last 10 rows: 0.55 -> 0.505, 8.2% change
    r = assess_convergence(_rows(falling, key="loss"))
    assert not r.converged and "still changing: 8.2% change over the last 10 logged steps" in r.reason
