"""The one early stop of an attack run (:class:`datarecon.attacks.loop.Plateau`): a plateau of the metric the
attack declares, with its memory checkpointed, its settings in the resume key, and refusals of settings that
would make it meaningless."""

from __future__ import annotations

import math

import pytest

from datarecon.attacks import ATTACKS
from datarecon.attacks.loop import Plateau
from datarecon.errors import DataReconError


def test_plateau_against_a_hand_count_and_its_state_roundtrip() -> None:
    a = Plateau("r", patience=3, rel_tol=0.1)
    seq = [1.0, 0.5, 0.49, 0.48, 0.47, 0.46]  # 0.49 < 0.5·0.9 is false: three steps without progress
    stops = [a({"r": v}) for v in seq]
    assert stops == [False, False, False, False, True, True]
    b = Plateau("r", patience=3, rel_tol=0.1)
    c = Plateau("r", patience=3, rel_tol=0.1)
    for v in seq[:3]:
        b({"r": v})
    c.load_state_dict(b.state_dict())
    assert [c({"r": v}) for v in seq[3:]] == stops[3:]
    assert not Plateau("r", patience=1)({"r": math.nan})  # a non-finite value is no evidence either way


@pytest.mark.parametrize("name", ATTACKS.names())
def test_every_attack_is_stopped_on_the_metric_it_declares(name: str) -> None:
    attack = ATTACKS.get(name)
    rule = Plateau.of(attack, patience=2, rel_tol=0.5)
    assert rule.settings() == {"key": attack.early_stop_metric, "patience": 2, "rel_tol": "0.5"}
    assert attack.early_stop_metric == attack.convergence.metric  # the built-ins stop on what they are judged by


@pytest.mark.parametrize(("patience", "tol", "words"), [(0, 1e-3, "at least 1"), (3, 0.0, "(0, 1)"),
                                                         (3, 1.0, "(0, 1)"), (3, 5.0, "(0, 1)")])
def test_a_meaningless_plateau_is_refused(patience: int, tol: float, words: str) -> None:
    """A relative improvement of 1 or more can never be met: the rule would stop after the patience whatever
    the run did (issue 49: --early-stop-tol 5)."""
    with pytest.raises(DataReconError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Plateau("loss", patience=patience, rel_tol=tol)


def test_a_declared_metric_the_steps_never_log_is_refused_at_the_first_step() -> None:
    rule = Plateau("never_logged", patience=3, rel_tol=0.1, attack="attack 'x'")
    with pytest.raises(DataReconError, match="attack 'x' declares early_stop_metric 'never_logged', which its steps "
                                             "do not log \\(they log box, loss\\)"):
        rule({"loss": 1.0, "box": 0.0})
