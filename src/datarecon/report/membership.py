"""The membership audit report: a membership folder (``datarecon membership --evaluate --out DIR``) as a section
of the one HTML report (``datarecon report DIR``).

What privacy auditors read in ML Privacy Meter's and LiRA's reports, from the files the evaluation wrote
(``membership.json``, ``scores.safetensors``, ``exposed.safetensors``): the headline signal beside the loss
threshold on the same images, the reference models (their number, how many of them each candidate trained, or
why none were trained and what they would cost), the empirical ε lower bound, the ROC of every signal on log-log
axes, the members' and non-members' score histograms, and the most exposed training images with their
p-values. Every figure and table says which members and non-members it was measured on (every candidate, or
LiRA's half-in pool for the online signals). Plotting only: nothing is computed from ground truth here but the
curves and histograms of the scores the evaluation recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datarecon.errors import CheckpointError, DataReconError
from datarecon.evaluation.privacy import roc_curve
from datarecon.evaluation.records import read_membership_result
from datarecon.kernel.files import MEMBERSHIP_EXPOSED, MEMBERSHIP_RESULT, MEMBERSHIP_SCORES, MEMBERSHIP_TARGET
from datarecon.report.figures import figure_png, image_strip, membership_roc_figure, score_histograms
from datarecon.report.html import Card, FigureItem, Section, Table
from datarecon.report.text import reference_lines
from datarecon.utils.io import load_tensors

__all__ = ["is_membership_folder", "membership_sections"]

#: how many of the most exposed members the report shows
EXPOSED_SHOWN = 24


def is_membership_folder(path: str | Path) -> bool:
    """Whether ``path`` is a membership folder with a result (``datarecon membership --evaluate --out``)."""
    path = Path(path)
    return (path / MEMBERSHIP_RESULT).is_file() and (path / MEMBERSHIP_TARGET).is_file()


def _short(line: str | None) -> str:
    """A signal's line without its name (``AUC 0.97 (...), TPR ...``)."""
    return (line or "").split(": ", 1)[-1]


def _scope(scores: Mapping[str, torch.Tensor], name: str) -> np.ndarray:
    mem = scores["is_member"].numpy().astype(bool)
    key = f"scope.{name}"
    return scores[key].numpy().astype(bool) if key in scores else np.ones(mem.size, dtype=bool)


#: signals are shown weakest attacker first
KINDS = ("black-box", "white-box", "reference")


def _ordered(result: Mapping[str, Any]) -> list[str]:
    """The signals of a result, weakest attacker first (the kinds of :data:`KINDS`), then by name."""
    sig = result["signals"]
    return sorted(sig, key=lambda k: (KINDS.index(sig[k].get("kind")) if sig[k].get("kind") in KINDS else len(KINDS), k))


def _split_text(result: Mapping[str, Any], names: list[str]) -> str:
    """Which members and non-members the signals ``names`` were measured on, in words."""
    parts: dict[str, list[str]] = {}
    for name in names:
        rep = result["signals"][name].get("report") or {}
        where = f"{result['signals'][name].get('scope', 'all candidates')} ({rep.get('n_members')} members, " \
                f"{rep.get('n_nonmembers')} non-members)"
        parts.setdefault(where, []).append(name)
    return "; ".join(f"{', '.join(v)} on {k}" for k, v in parts.items())


def _read_tensors(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """The folder's scores (``is_member`` (N,) booleans, ``score.<signal>`` (N,) numbers, ``scope.<signal>`` (N,)
    booleans) and its most exposed members (``x`` (k, C, H, W), ``index``, ``y``, ``score``, ``p_value`` (k,)),
    checked before anything is plotted from them.

    Raises:
        CheckpointError: a missing or misshapen tensor (one line naming the file, the tensor and the fix).
    """
    fix = f"rerun `datarecon membership --model M --evaluate --out {folder}` to rewrite it"
    scores = load_tensors(folder / MEMBERSHIP_SCORES)
    member = scores.get("is_member")
    if member is None or member.dim() != 1 or member.dtype != torch.bool:
        raise CheckpointError(f"{folder / MEMBERSHIP_SCORES} is damaged or was changed by hand (no 'is_member' "
                              f"booleans, one per candidate); {fix}")
    for key, v in scores.items():
        kind = torch.bool if key.startswith("scope.") else None
        if key.startswith(("score.", "scope.")) and (tuple(v.shape) != tuple(member.shape) or (
                v.dtype != torch.bool if kind else not v.dtype.is_floating_point)):
            raise CheckpointError(f"{folder / MEMBERSHIP_SCORES} is damaged or was changed by hand ('{key}' is not "
                                  f"{member.numel()} {'booleans' if kind else 'numbers'}, one per candidate); {fix}")
    if not (folder / MEMBERSHIP_EXPOSED).is_file():
        return scores, None
    exposed = load_tensors(folder / MEMBERSHIP_EXPOSED)
    x = exposed.get("x")
    k = x.shape[0] if x is not None and x.dim() == 4 else None
    bad = "x" if k is None else next((name for name in ("index", "y", "score", "p_value")
                                      if name not in exposed or tuple(exposed[name].shape) != (k,)), None)
    if bad is not None:
        raise CheckpointError(f"{folder / MEMBERSHIP_EXPOSED} is damaged or was changed by hand ('{bad}' is not "
                              + ("images (k, C, H, W)" if bad == "x" else f"{k} values, one per image") + f"); {fix}")
    return scores, exposed


def _cards(result: Mapping[str, Any]) -> list[Card]:
    best, base = result["strongest"], result["baseline"]
    head_rows: list[tuple[str, Any]] = [("chosen by", best.get("rule"))]
    if best.get("demoted"):
        head_rows.append(("replaced by the loss threshold", f"{best.get('chosen')}: {best['demoted']}"))
    if best.get("baseline_same"):
        head_rows.append(("loss threshold, same images", _short(best["baseline_same"])))
    head_rows.append(("loss threshold, every candidate", _short(base.get("line"))))
    ci = (best.get("report") or {}).get("auc_ci")
    leak = isinstance(ci, list) and ci[0] > 0.5
    cand = result.get("candidates") or {}
    who = [("members", (cand.get("members") or {}).get("source")),
           ("non-members", f"{(cand.get('nonmembers') or {}).get('count')} "
                           f"{(cand.get('nonmembers') or {}).get('source', '')}"),
           ("half-in pool", (cand.get("half_in") or {}).get("count")),
           ("population (RMIA)", (cand.get("population") or {}).get("count")),
           ("attacker knows", (result.get("knowledge") or {}).get("summary"))]
    refs = result.get("references") or {}
    ref_rows: list[tuple[str, Any]] = [("models", refs.get("count") or 0)]
    if refs.get("in_models"):
        ins = refs["in_models"]
        ref_rows += [("IN models per half-in candidate", f"mean {ins['mean']:.1f} of {ins['models']} (min "
                                                         f"{ins['min']:.0f}, max {ins['max']:.0f})"),
                     ("trained / reused", f"{refs.get('trained')} / {refs.get('reused')}"),
                     ("recipe", refs.get("recipe"))]
    eps = result.get("epsilon") or {}
    eps_rows: list[tuple[str, Any]] = [("signal", eps.get("signal")), ("point estimate", eps.get("estimate")),
                                       ("threshold at FPR", eps.get("fpr")), ("TPR there", eps.get("tpr")),
                                       ("delta", eps.get("delta")),
                                       ("measured on", f"{eps.get('members')} members, {eps.get('nonmembers')} "
                                                       "non-members (the headline's candidates)"),
                                       ("how", eps.get("note"))]
    eps_lead = (f"epsilon >= {eps['lower']:.2f} with {eps.get('confidence', 0.95):.0%} confidence: no training with a "
                "smaller (epsilon, delta) guarantee would let this attack succeed this often"
                if eps.get("fpr") is not None else "No lower bound above 0: this attack shows no DP violation here.")
    return [Card("Membership: the strongest signal beside the loss threshold",
                 head_rows, lead=best.get("line") or "No signal was measured.", status="warn" if leak else "ok"),
            Card("Who was measured", who),
            Card("Reference models (LiRA, RMIA)", ref_rows, lead=" ".join(reference_lines(refs or None)),
                 status="" if refs.get("count") else "warn"),
            Card("Empirical epsilon lower bound", eps_rows, lead=eps_lead,
                 status="warn" if eps.get("fpr") is not None else "ok")]


def _figures(result: Mapping[str, Any], scores: Mapping[str, torch.Tensor], exposed: Mapping[str, torch.Tensor] | None
             ) -> list[FigureItem]:
    mem = scores["is_member"].numpy().astype(bool)
    names = [k for k in _ordered(result) if result["signals"][k].get("applicable") and f"score.{k}" in scores]
    rocs, panels = {}, {}
    for name in names:
        s, scope = scores[f"score.{name}"].numpy(), _scope(scores, name)
        fpr, tpr, _ = roc_curve(mem[scope], s[scope])
        rocs[name] = (fpr, tpr, (result["signals"][name].get("report") or {}).get("auc"))
        panels[name] = (s[scope & mem], s[scope & ~mem])
    split = _split_text(result, names)
    figs = []
    if rocs:
        figs.append(FigureItem(f"ROC of every signal on log-log axes (as LiRA plots them; dashed: 1% and 0.1% FPR, "
                               f"dotted: chance); measured on: {split}.",
                               figure_png(membership_roc_figure(rocs, n_members=int(mem.sum()),
                                                                n_nonmembers=int((~mem).sum()),
                                                                strongest=result["strongest"]["name"]))))
        figs.append(FigureItem(f"Score of the members and of the non-members, per signal (higher: called a member; "
                               f"densities, the counts in each legend; the lowest 1% of the scores gathered in the first "
                               f"bin; where that would crowd the scores into one bin, a panel shows each score's "
                               f"percentile among all its scores instead, as its axis says); measured on: {split}.",
                               figure_png(score_histograms(panels))))
    if exposed is not None and exposed["x"].shape[0]:
        k = min(EXPOSED_SHOWN, int(exposed["x"].shape[0]))
        x = exposed["x"][:k].to(torch.float32)
        scaled = bool(x.min() < 0 or x.max() > 1)
        if scaled:  # a user's model's inputs: shown scaled to their range
            x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
        titles = [f"#{i + 1} p={float(exposed['p_value'][i]):.3g}" for i in range(k)]
        name = result["strongest"]["name"]
        figs.append(FigureItem(
            f"The {k} training images the headline signal ({name}) scores highest, ranked; p: the fraction of the "
            f"non-members of the same candidates that score as high (a small p: the model singles the image out)"
            + ("; inputs scaled to their range for display" if scaled else "") + ".",
            figure_png(image_strip(x, titles))))
    return figs


def _tables(result: Mapping[str, Any], exposed: Mapping[str, torch.Tensor] | None) -> tuple[list[Table], list[str]]:
    """The table of every signal and of the most exposed members; the signals' notes (shown under the tables, not
    in a column: the table stays within the page)."""
    rows, notes = [], []
    for name in _ordered(result):
        v = result["signals"][name]
        rep = v.get("report") or {}
        ci, tpr, tci = rep.get("auc_ci"), rep.get("tpr_at_fpr") or {}, rep.get("tpr_ci") or {}

        def with_ci(f: str) -> str | None:
            t, c = tpr.get(f), tci.get(f)
            return None if t is None else f"{t:.3f}" + (f" [{c[0]:.2f}–{c[1]:.2f}]" if c else "")

        measured = v.get("applicable")
        rows.append([name + (" (strongest)" if name == result["strongest"]["name"] else ""), v.get("kind"),
                     v.get("scope") if measured else "not measured", rep.get("n_members"), rep.get("n_nonmembers"),
                     rep.get("auc"), f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else None, with_ci("0.01"), with_ci("0.001")])
        if v.get("note"):
            notes.append(f"{name}: {v['note']}")
    tables = [Table("Every signal on the candidates of its scope (all candidates, or the half-in pool for the online "
                    "signals); TPR with its bootstrap 95% interval",
                    ["signal", "kind", "measured on", "members", "non-members", "ROC AUC", "95% CI", "TPR @ 1% FPR",
                     "TPR @ 0.1% FPR"], rows, transpose=False)]
    if exposed is not None and exposed["x"].shape[0]:
        k = min(EXPOSED_SHOWN, int(exposed["x"].shape[0]))
        tables.append(Table(f"The most exposed training images by {result['strongest']['name']} (all members ranked: "
                            "exposed.csv)", ["rank", "index in its split", "label", "score", "p-value"],
                            [[i + 1, int(exposed["index"][i]), float(exposed["y"][i]), float(exposed["score"][i]),
                              float(exposed["p_value"][i])] for i in range(k)]))
    return tables, notes


def membership_sections(folder: str | Path) -> Section:
    """The report section of a membership folder: cards, figures, tables and the settings.

    Raises:
        DataReconError: a folder without a result or scores (``datarecon membership --evaluate --out DIR`` writes
            them).
    """
    folder = Path(folder)
    if not is_membership_folder(folder) or not (folder / MEMBERSHIP_SCORES).is_file():
        raise DataReconError(f"{folder} holds no membership result; run `datarecon membership --model M --evaluate "
                             f"--out {folder}` first")
    result = read_membership_result(folder / MEMBERSHIP_RESULT)
    scores, exposed = _read_tensors(folder)
    tables, notes = _tables(result, exposed)
    children = (Section("Figures", figures=_figures(result, scores, exposed), level=3),
                Section("Tables", tables=tables, notes=notes, level=3))
    return Section(f"{folder.name}: membership of {result.get('model')}", cards=_cards(result),
                   text=[str(folder)], children=children,
                   code=json.dumps(result.get("settings"), indent=2, sort_keys=True),
                   code_title="Settings of the evaluation (membership.json: settings)")
