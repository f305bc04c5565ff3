"""The membership folder: one model per folder, and what an evaluation writes into it.

A folder records the model it measures first (``target.json``: its path and content identity,
:func:`target_record`); a call for another model, or into a folder that records none, is refused without
``--overwrite`` (:func:`check_membership_folder`, the one output rule of membership folders, whatever the number of
reference models). An evaluation writes ``membership.json``, ``signals.csv``, ``scores.safetensors``, the ROC
figure and the most exposed members (:func:`write_membership`); ``datarecon report`` and ``evaluate --membership``
read them back (:func:`read_membership_folder`, :func:`membership_section`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datarecon.attacks.mia import SIGNALS
from datarecon.errors import DataReconError
from datarecon.evaluation.privacy import roc_curve
from datarecon.evaluation.records import read_membership_result
from datarecon.experiments.membership.candidates import Candidates
from datarecon.experiments.membership.reference_store import REFERENCES_DIR, finished_references
from datarecon.experiments.membership.signals import SignalScores
from datarecon.kernel.files import (
    MEMBERSHIP_EXPOSED,
    MEMBERSHIP_EXPOSED_CSV,
    MEMBERSHIP_RESULT,
    MEMBERSHIP_ROC,
    MEMBERSHIP_SCORES,
    MEMBERSHIP_SIGNALS_CSV,
    MEMBERSHIP_TARGET,
    REFERENCE_PREFIX,
    RUN_JSON,
)
from datarecon.kernel.outdir import OutDir, is_empty
from datarecon.kernel.resume import folder_state
from datarecon.models.checkpoint import model_identity
from datarecon.report.figures import membership_roc_figure, save_figure
from datarecon.utils.io import atomic_write_json, atomic_write_text, read_json, rows_to_csv, save_tensors

__all__ = ["EXPOSED_CSV", "EXPOSED_FILE", "EXPOSED_KEPT", "RESULT_FILE", "ROC_FIGURE", "SCORES_FILE", "SIGNALS_CSV",
           "TARGET_FORMAT", "check_membership_folder", "finished_evaluation", "kept_folder", "membership_section", "read_membership_folder",
           "ready_folder", "target_record", "write_membership"]

#: the file of a membership folder that holds the result
RESULT_FILE = MEMBERSHIP_RESULT
#: the per-candidate scores, membership and split
SCORES_FILE = MEMBERSHIP_SCORES
ROC_FIGURE = MEMBERSHIP_ROC
SIGNALS_CSV = MEMBERSHIP_SIGNALS_CSV
#: the most exposed members' images (the report shows them) and every member ranked (a table)
EXPOSED_FILE = MEMBERSHIP_EXPOSED
EXPOSED_CSV = MEMBERSHIP_EXPOSED_CSV
#: how many of the most exposed members keep their images in :data:`EXPOSED_FILE`
EXPOSED_KEPT = 32
#: the format of the record of the model a membership folder measures (:data:`~datarecon.kernel.files.MEMBERSHIP_TARGET`)
TARGET_FORMAT = "datarecon-membership-target/1"


def target_record(model_dir: str | Path) -> dict[str, Any]:
    """What a membership folder records of the model directory it measures: its path and content identity."""
    return {"format": TARGET_FORMAT, "model": str(Path(model_dir).resolve()), "identity": model_identity(model_dir)}


def _record_of(model: str | Path | dict[str, Any]) -> dict[str, Any]:
    return model if isinstance(model, dict) else target_record(model)


def check_membership_folder(out: str | Path, model: str | Path | dict[str, Any], *, option: str = "--out") -> None:
    """Refuse a membership folder that measures another model, or does not say which: its result and its reference
    models (trained with that model's recipe on that model's candidates) are no reuse for this one, and a call into
    it would replace them. The one output rule of membership folders, whatever the number of reference models.

    Args:
        out: the folder.
        model: the model directory measured, or the record of a user's model (:func:`target_record`'s fields).
        option: the option that named the folder: ``--out`` (a call that writes into it) or ``--membership`` (an
            evaluation that reads its result: the fix then names the folder of the run's own model).

    Raises:
        DataReconError: the folder's model, what would be replaced, and the two ways on.
    """
    out = Path(out)
    if not out.is_dir() or is_empty(out):
        return
    mine = _record_of(model)
    try:
        found = read_json(out / MEMBERSHIP_TARGET) if (out / MEMBERSHIP_TARGET).is_file() else None
    except DataReconError:
        found = None
    if isinstance(found, dict) and found.get("identity") == mine["identity"]:
        return
    if not isinstance(found, dict) or not found.get("model"):
        whose = "a model it does not record (written by an earlier datarecon version, or damaged)"
    elif found["model"] == mine["model"]:
        whose = f"an earlier version of {found['model']} (its weights or config changed since)"
    else:
        whose = f"another model, {found['model']}"
    if option != "--out":
        raise DataReconError(f"{option} {out} is the membership folder of {whose}, not of {mine['model']}, the model "
                             f"this run attacked; pass the folder of `datarecon membership --model {mine['model']} "
                             "--evaluate --out DIR`")
    kept = len(list((out / REFERENCES_DIR).glob(f"{REFERENCE_PREFIX}*"))) if (out / REFERENCES_DIR).is_dir() else 0
    lost = "its result" + (f" and its {kept} reference models" if kept else "")
    raise DataReconError(f"--out {out} is the membership folder of {whose}; a call into it would replace {lost}: "
                         "choose another --out, or pass --overwrite to replace them")


def ready_folder(out: str | Path | OutDir | None, model: str | Path | dict[str, Any]) -> Path | None:
    """The output folder, prepared now (a claimed :class:`~datarecon.kernel.outdir.OutDir` is cleared and started only
    once every input has been accepted, so a refused call leaves no trace), with the record of its model written
    first. A folder of another model is refused (:func:`check_membership_folder`) unless it is being replaced."""
    if out is None:
        return None
    if isinstance(out, OutDir):
        if not out.clear:
            check_membership_folder(out.path, model)
        path = out.prepare()
    else:
        path = Path(out)
        check_membership_folder(path, model)
        path.mkdir(parents=True, exist_ok=True)
    if not (path / MEMBERSHIP_TARGET).is_file():
        atomic_write_json(path / MEMBERSHIP_TARGET, _record_of(model))
    return path


def finished_evaluation(out: str | Path | OutDir | None, *, record: dict[str, Any], settings: dict[str, Any],
                        candidates: dict[str, Any], knowledge: dict[str, Any]) -> dict[str, Any] | None:
    """The result a membership folder holds of this very evaluation, or None (no folder, ``--overwrite``, no result,
    or one of another evaluation): a finished evaluation called again takes no step and writes nothing.

    ``membership.json``, written last, is the folder's completion record, read by the one reading of a resumed folder
    (:func:`datarecon.kernel.resume.folder_state`) with the fields that say which evaluation wrote it as its key: the
    model, the settings and where the candidates came from, as JSON reads them back; then the attacker's knowledge
    (its summary aside: it also says whether reference models were trained), and every reference model it
    records is still finished. The folder is first checked to measure this model (``record``,
    :func:`check_membership_folder`: another model's is refused); the reference models' pool was checked before,
    against its fingerprint.
    """
    if out is None or (isinstance(out, OutDir) and out.clear):
        return None
    path = out.path if isinstance(out, OutDir) else Path(out)
    check_membership_folder(path, record)
    key = json.loads(json.dumps({"model": record["model"], "settings": settings, "candidates": candidates}))
    state = folder_state(path, record=RESULT_FILE, key=key)
    if not state.finished or state.record is None:
        return None

    def facts(threat: Any) -> Any:
        return {k: v for k, v in threat.items() if k != "summary"} if isinstance(threat, dict) else threat

    if facts(state.record.get("knowledge")) != facts(json.loads(json.dumps(knowledge))):
        return None
    count = int((state.record.get("references") or {}).get("count") or 0)
    if not set(range(count)) <= set(finished_references(state.path)):  # a reference model lost since: trained again
        return None
    try:  # checked, as every reader of the result; a damaged one is written again
        result = read_membership_result(state.path / RESULT_FILE)
    except DataReconError:
        return None
    signals = result.get("signals") or {}
    order = [n for n in SIGNALS.ordered() if n in signals] + [n for n in signals if n not in SIGNALS]
    return {**result, "signals": {n: signals[n] for n in order}}  # the file's keys are sorted: the signals' order


def _table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One CSV row per signal: kind, where measured, AUC with its interval, TPRs, or why it does not apply."""
    rows = []
    for name, v in result["signals"].items():
        rep = v.get("report") or {}
        ci = rep.get("auc_ci") or [None, None]
        tpr = rep.get("tpr_at_fpr") or {}
        rows.append({"signal": name, "kind": v["kind"], "applicable": v["applicable"], "scope": v.get("scope"),
                     "members": rep.get("n_members"), "nonmembers": rep.get("n_nonmembers"), "auc": rep.get("auc"),
                     "auc_ci_low": ci[0], "auc_ci_high": ci[1], "tpr_at_1%_fpr": tpr.get("0.01"),
                     "tpr_at_0.1%_fpr": tpr.get("0.001"),
                     "strongest": name == result["strongest"]["name"], "note": v.get("note", "")})
    return rows


def _exposed(out: Path, result: dict[str, Any], signals: SignalScores, cand: Candidates) -> None:
    """The members ranked by the headline signal (every signal's score beside it, and the fraction of non-members
    that score as high: a per-example p-value), as a table; the images of the first :data:`EXPOSED_KEPT`."""
    name = result["strongest"]["name"]
    if name is None:
        return
    mem = cand.is_member
    scope = signals.where(name, mem.size)
    s = signals.scores[name]
    members = np.flatnonzero(mem & scope)
    null = np.sort(s[scope & ~mem])
    order = members[np.argsort(-s[members], kind="stable")]
    rows = []
    for rank, i in enumerate(order, start=1):
        p = (1.0 + null.size - np.searchsorted(null, s[i], side="left")) / (1.0 + null.size)
        rows.append({"rank": rank, "index": int(cand.indices[i]), "label": float(cand.y[i]), "score": float(s[i]),
                     "p_value": float(p), **{f"score_{k}": float(v[i]) for k, v in signals.scores.items()}})
    atomic_write_text(out / EXPOSED_CSV, rows_to_csv(rows))
    top = torch.as_tensor(order[:EXPOSED_KEPT])
    save_tensors(out / EXPOSED_FILE, {"x": cand.x[top].to(torch.float32), "y": cand.y[top].to(torch.float64),
                                      "index": cand.indices[top], "score": torch.as_tensor(s[order[:EXPOSED_KEPT]]),
                                      "p_value": torch.as_tensor([r["p_value"] for r in rows[:EXPOSED_KEPT]])})


def write_membership(out: Path, result: dict[str, Any], signals: SignalScores, cand: Candidates,
                     calibration: np.ndarray) -> None:
    """Write ``membership.json``, ``signals.csv``, ``scores.safetensors``, the ROC figure and the most exposed
    members (``exposed.csv``, ``exposed.safetensors``) into ``out``."""
    tensors = {f"score.{k}": torch.tensor(v) for k, v in signals.scores.items()}  # copies: no two share memory
    tensors.update({f"scope.{k}": torch.tensor(v) for k, v in signals.scope.items()})
    tensors.update({"is_member": torch.tensor(cand.is_member), "calibration": torch.tensor(calibration),
                    "half_in": torch.tensor(cand.eligible), "indices": cand.indices,
                    "population_indices": cand.z_indices})
    save_tensors(out / SCORES_FILE, tensors)
    atomic_write_text(out / SIGNALS_CSV, rows_to_csv(_table_rows(result)))
    labels = cand.is_member
    rocs = {}
    for name, s in signals.scores.items():
        scope = signals.where(name, labels.size)
        fpr, tpr, _ = roc_curve(labels[scope], s[scope])
        rocs[name] = (fpr, tpr, result["signals"][name]["report"]["auc"])
    save_figure(membership_roc_figure(rocs, n_members=int(labels.sum()), n_nonmembers=int((~labels).sum()),
                                      strongest=result["strongest"]["name"]), out / ROC_FIGURE)
    _exposed(out, result, signals, cand)
    atomic_write_json(out / RESULT_FILE, result)


def kept_folder(out: str | Path | OutDir | None, model_dir: str | Path) -> Path | None:
    """The membership folder whose kept evaluation and reference models a call may read (checked to be this
    model's); None without one, or when ``--overwrite`` replaces it."""
    if out is None or (isinstance(out, OutDir) and out.clear):
        return None
    path = out.path if isinstance(out, OutDir) else Path(out)
    check_membership_folder(path, model_dir)
    return path


def membership_section(result: dict[str, Any]) -> dict[str, Any]:
    """The compact membership record a run's ``metrics.json`` keeps for its report: the strongest signal, the
    loss baseline, every signal's AUC and TPRs (or why not) and where it was measured, where the non-members came
    from, the split, the reference models and the empirical ε bound."""
    signals = {}
    for name, v in result["signals"].items():
        rep = v.get("report") or {}
        signals[name] = {"kind": v["kind"], "applicable": v["applicable"], "note": v.get("note", ""),
                         "scope": v.get("scope"), "auc": rep.get("auc"), "auc_ci": rep.get("auc_ci"),
                         "tpr_at_fpr": rep.get("tpr_at_fpr"), "tpr_ci": rep.get("tpr_ci"),
                         "n_members": rep.get("n_members"), "n_nonmembers": rep.get("n_nonmembers"),
                         "line": v.get("line")}
    return {"strongest": result["strongest"], "baseline": result["baseline"], "signals": signals,
            "candidates": result["candidates"], "split": result["split"], "references": result.get("references"),
            "epsilon": result.get("epsilon"), "knowledge": (result.get("knowledge") or {}).get("summary")}


def read_membership_folder(run_dir: str | Path, folder: str | Path) -> dict[str, Any]:
    """The result a membership folder holds for the model the run ``run_dir`` attacked (``evaluate --membership``;
    checked before any run is evaluated).

    Raises:
        DataReconError: a run of a user's own model, a folder without a result, of another model, or damaged.
    """
    model_dir = read_json(Path(run_dir) / RUN_JSON).get("model_dir")
    if not model_dir:
        raise DataReconError(f"{run_dir} attacked a model given as package.module:factory; --membership reads the "
                             "membership folder of a model directory's run")
    if not (Path(folder) / RESULT_FILE).is_file():
        # a folder of something else is no --out for the measurement: name a new one then
        out = folder if not Path(folder).is_dir() or is_empty(Path(folder)) else "DIR"
        raise DataReconError(f"--membership {folder} holds no {RESULT_FILE}; run `datarecon membership --model "
                             f"{model_dir} --evaluate --out {out}` first and pass that folder")
    check_membership_folder(folder, model_dir, option="--membership")
    return read_membership_result(Path(folder) / RESULT_FILE)
