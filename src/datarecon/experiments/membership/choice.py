"""The strongest membership signal, chosen where its headline is not measured, and every signal's ROC.

With reference models (K ≥ 3) the choice is made on them (:func:`pseudo_target_choice`: each of the first few
plays the target in turn, the others its references; none of the target's ground truth is read); else on a
calibration part of the target's members and non-members, the headline then measured on the rest only; else by
the rule fixed in advance (each signal's declared rank, :func:`~datarecon.attacks.mia.ranked`). The headline is
never weaker than the loss threshold on the same candidates (:func:`~datarecon.evaluation.membership.
headline_verdict`), and its empirical ε lower bound is measured where its ROC is (:func:`epsilon_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from datarecon.attacks.mia import SIGNALS
from datarecon.evaluation.membership import (
    MembershipROC,
    SignalPower,
    calibration_split,
    choose_strongest,
    epsilon_lower_bound,
    fixed_rule,
    headline_verdict,
    membership_roc,
)
from datarecon.evaluation.privacy import MIN_CLASS_SIZE
from datarecon.experiments.membership.references import MIN_PSEUDO_REFERENCES, PSEUDO_TARGETS
from datarecon.experiments.membership.signals import PseudoTargets, SignalScores, pseudo_scores
from datarecon.kernel.engine import track

__all__ = ["Choice", "HALF_IN", "compare_signals", "epsilon_of", "pseudo_target_choice"]

#: the place of the signals measured on the half-in pool, in words
HALF_IN = "the half-in pool"


@dataclass(frozen=True)
class Choice:
    """The strongest signal, chosen without the target's ground truth (reference models as pseudo-targets).

    Attributes:
        name: the chosen signal; rule: how it was chosen; power: every signal's power there.
    """

    name: str | None
    rule: str
    power: dict[str, SignalPower]


def _calibration_fraction(is_member: np.ndarray, fraction: float) -> tuple[float, str]:
    """The calibration fraction to split with, and why there is none: a part with fewer than
    :data:`~datarecon.evaluation.privacy.MIN_CLASS_SIZE` members or non-members measures nothing (the one rule of
    every ROC), so the split is not made and the strongest signal follows the rule fixed in advance."""
    if fraction <= 0:
        return 0.0, "no calibration part was asked for"
    sizes = [int(np.floor(fraction * int(n) + 1e-9)) for n in (is_member.sum(), (~is_member).sum())]
    if min(sizes) >= MIN_CLASS_SIZE:
        return fraction, ""
    return 0.0, (f"a calibration part of {sizes[0]} members and {sizes[1]} non-members would be too small to choose "
                 f"on: each class needs at least {MIN_CLASS_SIZE}")


def _signal_entry(name: str, signals: SignalScores, mem: np.ndarray, cal: np.ndarray, power: dict[str, SignalPower],
                  choose_here: bool) -> dict[str, Any]:
    """One signal's record: its ROC on its scope (every candidate there), and the loss threshold on the same
    candidates where the scope is not all of them."""
    entry: dict[str, Any] = {"kind": SIGNALS.get(name).kind, "doc": SIGNALS.get(name).doc,
                             "online": SIGNALS.get(name).online}
    if name not in signals.scores:
        return {**entry, "applicable": False, "note": signals.not_applicable.get(name, "not measured")}
    s, scope = signals.scores[name], signals.where(name, mem.size)
    roc = membership_roc(s[scope & mem], s[scope & ~mem], name=name)
    if choose_here and (cal & scope).any():
        power[name] = SignalPower.of(membership_roc(s[cal & scope & mem], s[cal & scope & ~mem], name=name, n_boot=0))
    p = power.get(name)
    entry.update({"applicable": True, "note": signals.notes.get(name, ""), "report": roc.summary(), "line": roc.line(),
                  "scope": HALF_IN if not scope.all() else "all candidates",
                  "chosen_on": None if p is None else {"auc": p.auc, "tpr_at_1%_fpr": p.tpr}})
    if not scope.all() and "loss" in signals.scores:
        loss = signals.scores["loss"]
        entry["baseline_line"] = membership_roc(loss[scope & mem], loss[scope & ~mem], name="loss").line()
    return entry


def _headline(signals: SignalScores, mem: np.ndarray, rep: np.ndarray, best: str | None,
              rule: str) -> dict[str, Any]:
    """The headline: the chosen signal on the reported part of its scope, unless it is weaker than the loss
    threshold on the same candidates (:func:`~datarecon.evaluation.membership.headline_verdict`), then the loss
    threshold on the reported part, with the reason."""
    if best is None:
        return {"name": None, "rule": rule, "line": None, "report": None, "chosen": None, "demoted": ""}
    scope = signals.where(best, mem.size) & rep
    s = signals.scores[best]
    roc = membership_roc(s[scope & mem], s[scope & ~mem], name=best)
    why, same = "", None
    if "loss" in signals.scores and best != "loss":
        loss = signals.scores["loss"]
        same = membership_roc(loss[scope & mem], loss[scope & ~mem], name="loss")
        why = headline_verdict(roc, same)
    if why:
        loss = signals.scores["loss"]
        roc = membership_roc(loss[rep & mem], loss[rep & ~mem], name="loss")
    narrower = not scope.all()  # the half-in pool, or the reported part of a calibration split
    return {"name": roc.name, "rule": rule, "line": roc.line(), "report": roc.summary(), "chosen": best,
            "demoted": why, "scope": HALF_IN if not signals.where(roc.name, mem.size).all() else "all candidates",
            "baseline_same": same.line() if same is not None and narrower and not why else None}


def compare_signals(signals: SignalScores, is_member: np.ndarray, *, calibration: float, seed: int,
                    choice: Choice | None = None, progress: bool | str = False) -> dict[str, Any]:
    """Every signal's ROC on its candidates, and the strongest signal, chosen where its headline is not measured.

    Without ``choice`` the members and non-members are split (:func:`~datarecon.evaluation.membership.
    calibration_split`): the strongest signal is chosen on the calibration part and its headline ROC is measured
    on the rest only (the reported part). With ``choice`` (made on reference models, :func:`pseudo_target_choice`,
    which read none of the target's ground truth) its headline is measured on every candidate of its scope. The
    table of every signal is always measured on every candidate of its scope (all candidates, or the half-in pool
    for the online signals, beside the loss threshold on the same pool). A chosen signal weaker than the loss
    threshold on the same candidates is not the headline: the loss threshold is, with the reason.

    Args:
        signals: the scores and their scopes.
        is_member: (N,) bool ground truth.
        calibration: the calibration fraction; seed: the split's seed.
        choice: a choice made without the target's ground truth, or None.
        progress: one step per signal (its bootstrap intervals take a while on thousands of candidates).

    Returns:
        JSON-ready: ``split`` (sizes of both parts), ``signals`` (name → ``kind``, ``doc``, ``online``,
        ``applicable``, ``note``, ``scope``, ``report`` (ROC summary), ``line``, ``baseline_line`` (the loss on the
        same candidates, for a signal of the half-in pool), ``chosen_on``), ``strongest`` (``name``, ``rule``,
        ``line``, ``report``, ``chosen``: the signal chosen, ``demoted``: why the loss threshold replaced it),
        ``baseline`` (the loss threshold on every candidate), and the calibration mask under ``_calibration``
        (removed before writing JSON).
    """
    mem = np.asarray(is_member, dtype=bool)
    fraction, too_small = _calibration_fraction(mem, 0.0 if choice is not None else calibration)
    split = calibration_split(mem, fraction=fraction, seed=seed)
    rep, cal = split.report, split.calibration
    power: dict[str, SignalPower] = {} if choice is None else dict(choice.power)
    out = {name: _signal_entry(name, signals, mem, cal, power, choice is None)
           for name in track(SIGNALS.ordered(), desc="membership ROCs", unit="signal", mode=progress)}
    if choice is not None:
        best, rule = choice.name, choice.rule
    elif power:
        best, rule = choose_strongest(power)
    else:
        best, _ = choose_strongest({k: SignalPower(float("nan"), None, 0, 0) for k in signals.scores})
        rule = fixed_rule(list(signals.scores), too_small or "nothing to choose on")
    return {"split": {"fraction": split.fraction, "seed": split.seed,
                      "calibration": {"members": int((cal & mem).sum()), "nonmembers": int((cal & ~mem).sum())},
                      "report": {"members": int((rep & mem).sum()), "nonmembers": int((rep & ~mem).sum())}},
            "signals": out, "strongest": _headline(signals, mem, rep, best, rule),
            "baseline": {"name": "loss", "line": out["loss"].get("line")}, "_calibration": cal}


def pseudo_target_choice(p: PseudoTargets, *, progress: bool | str = False) -> Choice | None:
    """Choose the strongest signal on the attacker's own models: each of the first :data:`PSEUDO_TARGETS` reference
    models in turn plays the target (its members: the pool images it trained on; its references: the others),
    every signal is measured on it (an online signal on the half-in pool), and the signal with the highest mean TPR
    at 1 % FPR wins (mean AUC breaks ties). Reads none of the target's ground truth.

    Returns:
        The :class:`Choice`, or None when the reference models are too few (fewer than 3) to play both parts
        (the caller then splits the target's candidates instead).
    """
    count = min(PSEUDO_TARGETS, p.refs.count)
    if p.refs.count < MIN_PSEUDO_REFERENCES:
        return None
    rocs: dict[str, list[MembershipROC]] = {}
    every = np.ones(p.eligible.size, dtype=bool)
    for r in track(range(count), desc="strongest signal", unit="pseudo-target", mode=progress):
        mem = p.refs.inside[r].numpy()
        for name, sc in pseudo_scores(p, r).items():
            scope = p.eligible if SIGNALS.get(name).online else every
            rocs.setdefault(name, []).append(membership_roc(sc[scope & mem], sc[scope & ~mem], name=name, n_boot=0))
    power = {k: SignalPower.mean(v) for k, v in rocs.items()}
    left = [k for k in p.signals if k not in power]
    where = (f"{count} reference models as pseudo-targets (mean over them; the target's membership is not read"
             + (f"; {', '.join(left)} not measurable on them and not competing)" if left else ")"))
    best, rule = choose_strongest(power, where=where)
    return Choice(name=best, rule=rule, power=power)


def epsilon_of(signals: SignalScores, is_member: np.ndarray, reported: np.ndarray, name: str | None) -> dict[str, Any]:
    """The empirical ε lower bound of the headline signal on the reported part of its candidates."""
    if name is None:
        return {"lower": 0.0, "line": "empirical epsilon: no signal measured"}
    mask = signals.where(name, is_member.size) & reported
    s = signals.scores[name]
    bound = epsilon_lower_bound(s[mask & is_member], s[mask & ~is_member])
    return {**bound.summary(), "signal": name, "line": bound.line()}
