"""One membership evaluation: every signal of a model on its members against non-members it never saw.

:func:`evaluate_membership` measures a model directory (its training images against non-members drawn from
the unused part of its training split, :mod:`.candidates`); :func:`evaluate_case` any case (a user's own model
too, :mod:`.own`): the reference models trained or reused (:mod:`.references`), every signal scored by its registry
entry (:mod:`.signals`), the strongest chosen where its headline is not measured and the empirical ε bound
(:mod:`.choice`), and with a folder everything written there (:mod:`.folder`). :func:`attach_membership` adds the
result to a run's ``metrics.json`` (the report's membership card).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.errors import DataReconError
from datarecon.experiments.membership.candidates import draw_candidates
from datarecon.experiments.membership.case import MembershipCase, model_task, prepare_membership, training_config
from datarecon.experiments.membership.choice import compare_signals, epsilon_of, pseudo_target_choice
from datarecon.experiments.membership.folder import (
    check_membership_folder,
    finished_evaluation,
    membership_section,
    read_membership_folder,
    ready_folder,
    target_record,
    write_membership,
)
from datarecon.experiments.membership.references import (
    References,
    case_references,
    check_reference_count,
    check_reference_folder,
)
from datarecon.experiments.membership.settings import MembershipSettings, Runtime
from datarecon.experiments.membership.signals import SignalScores, case_signals, reference_analysis
from datarecon.experiments.membership.trainers import RecipeTrainer
from datarecon.kernel.files import METRICS_FILE, RUN_JSON
from datarecon.kernel.outdir import OutDir
from datarecon.utils.io import atomic_write_json, read_json

__all__ = ["attach_membership", "evaluate_case", "evaluate_membership"]


def _check_references(case: MembershipCase, settings: MembershipSettings, out: str | Path | OutDir | None) -> None:
    """Refuse, before the folder is written, a fixed number of reference models that cannot be trained or kept, and
    a folder whose reference models this call would replace (another pool, other settings)."""
    ref = settings.references
    if not ref.count:
        return
    if not ref.auto:
        if out is None:
            raise DataReconError(f"--references {ref.count} needs --out DIR: the reference models are kept there (and "
                                 "reused by the next call)")
        if case.trainer is None:
            raise DataReconError(case.no_trainer)
        check_reference_count(case.candidates, int(ref.count), ref.seed)
    if out is None or case.trainer is None or (isinstance(out, OutDir) and out.clear):
        return
    folder = out.path if isinstance(out, OutDir) else Path(out)
    if folder.is_dir():
        check_membership_folder(folder, case.record)  # another model's folder: said as such, first
        check_reference_folder(case, folder, ref)


def _signals(case: MembershipCase, settings: MembershipSettings, refs: References) -> SignalScores:
    """Every signal of the case's candidates, with the reference models' statistics where there are some."""
    mean_in = ((refs.record or {}).get("in_models") or {}).get("mean", 0.0)
    return case_signals(case, settings.attacks, refs.stats, missing=refs.missing, mean_in=mean_in)


def evaluate_case(case: MembershipCase, *, settings: MembershipSettings = MembershipSettings(),
                  out: str | Path | OutDir | None = None, runtime: Runtime = Runtime()) -> dict[str, Any]:
    """Every membership signal of one case (a model, its candidates, its reference recipe) on its candidates.

    With ``references.count: auto`` and no ``out`` the reference models train in a temporary folder, deleted
    afterwards (the result says so); a fixed count needs ``out``, where they are kept and reused.

    Returns:
        JSON-ready: ``model``, ``knowledge``, ``candidates``, ``split``, ``signals``, ``strongest``, ``baseline``,
        ``references`` (None without), ``epsilon`` (the empirical ε bound of the headline), ``subspace``,
        ``wall_time_s``.

    Raises:
        DataReconError: references without ``out`` or without a recipe, too few of them, a folder of another
            model or pool, or whose reference models were made with other settings.
    """
    t0 = time.perf_counter()
    _check_references(case, settings, out)
    done = finished_evaluation(out, record=case.record, settings=settings.model_dump(mode="json"),
                               candidates=case.candidates.provenance, knowledge=case.setup.threat)
    if done is not None:
        return done
    outp = ready_folder(out, case.record)
    with tempfile.TemporaryDirectory(prefix="datarecon-references-") as tmp:
        folder = outp if outp is not None else Path(tmp)
        refs = case_references(case, settings, folder, runtime)
        signals = _signals(case, settings, refs)
        choice = None
        if refs.pseudo is not None:
            analysis_of = None
            if "subspace" in signals.scores and isinstance(case.trainer, RecipeTrainer):
                analysis_of = reference_analysis(case.trainer.config, case.knowledge, settings.references.seed)
            choice = pseudo_target_choice(dataclasses.replace(refs.pseudo, signals=tuple(signals.scores),
                                                              analysis_of=analysis_of), progress=runtime.progress)
    cmp = compare_signals(signals, case.candidates.is_member, calibration=settings.calibration_fraction,
                          seed=settings.seed, choice=choice, progress=runtime.progress)
    cal = cmp.pop("_calibration")
    threat = dict(case.setup.threat)
    if refs.stats is not None:
        threat["summary"] = threat.get("summary", "") + "; the training recipe (for the reference models)"
    if refs.record is not None:
        refs.record["kept"] = outp is not None
    result = {"model": case.record["model"], "knowledge": threat, "settings": settings.model_dump(mode="json"),
              "candidates": case.candidates.provenance, **cmp, "references": refs.record,
              "epsilon": epsilon_of(signals, case.candidates.is_member, ~cal, cmp["strongest"]["name"]),
              "subspace": case.setup.analysis.summary() if case.setup.analysis is not None else None,
              "wall_time_s": time.perf_counter() - t0}
    if outp is not None:
        write_membership(outp, result, signals, case.candidates, cal)
    return result


def evaluate_membership(model_dir: str | Path, *, settings: MembershipSettings = MembershipSettings(),
                        knowledge: KnowledgeSettings | None = None, out: str | Path | OutDir | None = None,
                        runtime: Runtime = Runtime()) -> dict[str, Any]:
    """Every membership signal on the model's training images against non-members it never saw (ground truth).

    Args:
        model_dir: the model directory.
        settings: how many non-members and population samples, the calibration split, the reference models (auto:
            as many as ``references.budget_minutes`` allows).
        knowledge: the attacker's knowledge (known θ_init, n) for the subspace signal.
        out: a membership folder (the reference models, scores, table and figures go there): a path, or a
            claimed :class:`~datarecon.kernel.outdir.OutDir`, prepared once the model, the knowledge and the data
            have been accepted; None: nothing is written (reference models of ``auto`` train in a temporary folder).
        runtime: where reference models train, the data folder, the progress sink.

    Returns:
        JSON-ready, as :func:`evaluate_case`.

    Raises:
        DataReconError: a bad model directory or knowledge, missing data, no non-member left, a fixed number of
            references without ``out``.
    """
    setup = prepare_membership(model_dir, knowledge=knowledge)
    task = model_task(setup.meta, runtime.data_dir)
    cand = draw_candidates(setup.meta, task, settings, data_dir=runtime.data_dir)
    trainer, why = None, ""
    if settings.references.count:
        try:
            trainer = RecipeTrainer(training_config(setup.meta))
        except DataReconError as exc:
            why = str(exc)
    case = MembershipCase(setup=setup, candidates=cand, trainer=trainer, record=target_record(model_dir),
                          no_trainer=why, knowledge=knowledge or KnowledgeSettings())
    result = evaluate_case(case, settings=settings, out=out, runtime=runtime)
    return {**result, "model": str(model_dir)}


def attach_membership(run_dir: str | Path, *, data_dir: str | Path | None = None,
                      settings: MembershipSettings = MembershipSettings(),
                      folder: str | Path | None = None) -> dict[str, Any] | None:
    """Add the membership of the model a run attacked to the run's ``metrics.json``: the result a membership folder
    holds (``folder``: ``datarecon membership --evaluate --out DIR`` of the same model, reference attacks included),
    else the signals without reference models, measured now.

    Runs of a model directory only (a user's own model has no data spec to draw non-members from).

    Returns:
        The section written (:func:`~datarecon.experiments.membership.folder.membership_section`), or None for a run
        without a model directory.

    Raises:
        DataReconError: an unevaluated run, missing data, a folder of another model or without a result.
    """
    run_dir = Path(run_dir)
    model_dir = read_json(run_dir / RUN_JSON).get("model_dir")
    if not model_dir:
        if folder is not None:
            raise DataReconError(f"{run_dir} attacked a model given as package.module:factory; --membership reads the "
                                 "membership folder of a model directory's run")
        return None
    metrics = read_json(run_dir / METRICS_FILE)
    if folder is not None:
        result = read_membership_folder(run_dir, folder)
    else:
        result = evaluate_membership(model_dir, settings=settings.without_references(),
                                     runtime=Runtime(data_dir=data_dir, log=lambda _: None))
    metrics["membership"] = membership_section(result)
    atomic_write_json(run_dir / METRICS_FILE, metrics)
    return metrics["membership"]
