"""The headline and the privacy verdict in words: one wording for every report and command.

The numbers come from :mod:`datarecon.evaluation` (``metrics.json``: ``headline`` from
:func:`datarecon.evaluation.reports.headline`, ``privacy`` from
:func:`datarecon.evaluation.reports.privacy_section`) and from a membership result
(:func:`datarecon.experiments.membership.evaluate.evaluate_case`); this module only turns them into sentences,
so the demo, ``datarecon evaluate``, ``datarecon membership``, the HTML report and the reproductions say the
same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["headline_lead", "headline_lines", "threshold_text", "fraction", "count_of", "reference_lines",
           "strongest_lines"]


def fraction(k: int | None, n: int | None) -> str:
    """``"6 of 40 (15%)"``; ``"n/a"`` when either is missing."""
    if k is None or n is None:
        return "n/a"
    pct = f" ({100 * k / n:.0f}%)" if n else ""
    return f"{k} of {n}{pct}"


def count_of(k: int | None, n: int | None) -> str:
    """``"13 of 20"`` (``"n/a"`` when ``k`` is missing)."""
    return "n/a" if k is None else f"{k} of {n}"


def threshold_text(h: Mapping[str, Any], *, what: str = "images") -> str:
    """How the headline threshold was set: ``max(0.4, t)`` with ``t`` from the held-out null."""
    cal = h.get("calibrated") or {}
    n = h.get("n_train")
    t, floor = cal.get("null_threshold"), cal.get("floor")
    t_s = "undefined" if t is None else f"{t:.3f}"
    floor_s = "" if floor is None else f"max({floor:g}, t), "
    return (f"{floor_s}t = {t_s}: the lowest SSIM that {h.get('n_heldout_candidates')} held-out {what} used as "
            f"candidates pass for at most {cal.get('allowed')} of {n} ({100 * (cal.get('rate') or 0):g}%)")


def headline_lead(h: Mapping[str, Any]) -> str:
    """The headline in one sentence, the count beside its null (what every report shows first)."""
    n = h.get("n_train")
    rule = h.get("rule", "standard")
    thr = h.get("threshold")
    at = f"SSIM > {thr:.3f}" if thr is not None else "any SSIM"
    if rule == "retention":
        ret = h.get("retention")
        if not ret:
            return "ground-truth start: retention not measurable (the starting images were not recorded)"
        return (f"ground-truth start: {ret['count']} of {ret['of']} candidates stay at their training image "
                f"(SSIM > {ret['threshold']:.3f}); no reconstruction count (the attack started from the answer)")
    if h.get("count") is None:
        if h.get("calibrated") is None:
            return "not measurable without held-out images (no null beside the count)"
        return "no count: " + (list(h.get("notes") or []) or ["not measurable"])[0]
    null = f"held-out null {count_of(h.get('heldout'), n)}, noise {count_of(h.get('noise'), n)}"
    lead = f"{h['count']} of {n} training images reconstructed at {at} ({null})"
    excluded = (h.get("calibrated") or {}).get("excluded") or 0
    if rule == "init-shift":
        lead += (f"; {excluded} more above the threshold stayed at their starting image and do not count" if excluded
                 else "; data-initialised: only matches that moved away from their start count")
    return lead


def headline_lines(h: Mapping[str, Any], *, what: str = "images") -> list[str]:
    """The headline as the command line prints it: the count with its null and threshold, the rule,
    the papers' fixed-threshold count beside its nulls, then the notes.

    Args:
        h: ``metrics.json`` ``headline``.
        what: What the held-out images are called (``digits``).
    """
    if not h:
        return ["training images reconstructed: not measured (no training set to compare with)"]
    n = h.get("n_train")
    lead = headline_lead(h)
    lines = [lead]
    if h.get("calibrated"):
        lines.append("threshold: " + threshold_text(h, what=what))
    if h.get("rule", "standard") != "standard":
        lines.append("rule: " + str(h.get("rule_text")))
    paper = h.get("paper") or {}
    if paper.get("count") is not None:
        nulls = [f"held-out {what} reach {paper['heldout']}" if paper.get("heldout") is not None else
                 f"held-out {what} not measured", f"noise {paper['noise']}" if paper.get("noise") is not None else
                 "noise not measured"]
        lines.append(f"at the papers' fixed SSIM > {paper['threshold']:g} alone: {paper['count']} of {n}, "
                     f"{' and '.join(nulls)} there")
    ref = h.get("reference_scoring") or {}
    if ref.get("count") is not None:
        held = f"held-out {what} {ref['heldout']}" if ref.get("heldout") is not None else f"held-out {what} not measured"
        lines.append(f"as the papers' code scores it (uniform 3x3 SSIM window, matches may repeat, SSIM > "
                     f"{ref['threshold']:g}): {ref['count']} of {n}, {held}, noise {ref.get('noise')}")
    lines.extend(note for note in h.get("notes") or [] if note not in lead)
    return lines


def reference_lines(refs: dict[str, Any] | None) -> list[str]:
    """The reference models in words: how many and how chosen, where they trained and their IN counts; or why none
    were trained and what they would cost."""
    if not refs:
        return ["reference models: none (--references K or auto); the reference attacks (LiRA, RMIA) were not run"]
    auto = refs.get("auto") or {}
    if not refs.get("count"):
        return [auto.get("skipped", "reference models: none")]
    lines = [f"reference models: {refs['note']} ({refs['trained']} trained now, {refs['reused']} reused"
             + ("" if refs.get("kept") else "; not kept: pass --out DIR to keep and reuse them") + ")"]
    if auto:
        lines.append(f"reference models: {refs['count']} chosen by --references auto within --budget-minutes "
                     f"{auto['budget_minutes']:g} ({auto['seconds_per_model']:.1f} s per model measured on the first "
                     f"{auto['probe_models']}, {auto['workers']} worker(s); the largest of "
                     f"{', '.join(map(str, auto['counts_tried']))} whose time, as measured so far, fit; "
                     f"{auto['wall_time_s']:.0f} s in all)")
    return lines


def strongest_lines(result: dict[str, Any]) -> list[str]:
    """The headline beside the loss threshold, how it was chosen (and why the loss threshold replaced a weaker
    choice), and the empirical ε bound of the headline."""
    best = result["strongest"]
    lines = []
    if best["name"] is None:
        lines.append("strongest: none measured")
    elif best.get("demoted"):
        lines.append(f"strongest: {best['line']} (the loss threshold: {best['chosen']} was chosen by {best['rule']}, "
                     f"but {best['demoted']})")
    else:
        lines.append(f"strongest: {best['line']} (chosen by {best['rule']})")
        if best.get("baseline_same"):
            lines.append(f"beside it, on the same candidates: {best['baseline_same']}")
    lines.append(f"loss threshold (baseline): {result['baseline']['line']}")
    eps = result.get("epsilon") or {}
    if eps.get("line"):
        lines.append(f"{eps['line']} ({eps.get('signal')})" if eps.get("signal") else eps["line"])
    return lines
