"""Membership: is an image in the training set of a model? (``datarecon membership``)

Every signal of :data:`datarecon.attacks.mia.SIGNALS` on the same members and non-members:

* black-box: the loss (the threshold attack every membership paper compares with) and LiRA's
  logit-scaled confidence;
* white-box: the per-example gradient norm, and the first dense layer's training subspace
  (:func:`datarecon.attacks.subspace.subspace_scores`; not applicable where that layer does not read
  the images, e.g. the read-out of a CNN);
* reference models: LiRA offline and online, RMIA offline and online, from models trained with the
  target's recipe (:mod:`datarecon.experiments.references`), by default as many as a time budget allows
  (``references.count: auto``, estimated from the first models trained), or a skip line with their cost;
* any signal an installed package registers (entry-point group ``datarecon.membership_signals``).

:func:`evaluate_membership` measures them on the model's own training images (members) against
**non-members drawn from the unused part of its training split** (by default 2000, so that a TPR at
0.1 % FPR is estimable), with RMIA's population samples from the test split. The reference models
follow LiRA's design: they train on the members and as many non-members of each class (the
*half-in pool*), each on a random half, so that each of these candidates is IN for about half of
them; the signals that need IN models (LiRA and RMIA online) are measured on that pool, every other
signal on every candidate. The **strongest signal** is chosen where its headline is not measured
(on reference models playing the target, else on a calibration part of the candidates), and it is the
headline only when it is not weaker than the loss threshold on the same images
(:func:`~datarecon.evaluation.membership.headline_verdict`); else the loss threshold is, with the
reason. With ``out`` the result, the per-candidate scores, a table, an ROC figure, the most exposed
members and the reference models are written to a membership folder that the next call reuses and
``datarecon report`` renders.

:func:`score_images` scores a user's own images with a member call calibrated on a null the user can
see (by default the model's held-out test images). A user's own ``nn.Module`` is measured the same way
by :mod:`datarecon.experiments.membership_own`.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.attacks.mia import SIGNALS, MIASettings, TargetView, reference_signals, target_signals
from datarecon.attacks.mia.statistics import ExampleStatistics, example_statistics
from datarecon.attacks.subspace import analyse, subspace_scores
from datarecon.config import Seed, build_config
from datarecon.data import DataSpec, load_task
from datarecon.data.images import load_images, load_labels
from datarecon.data.selection import check_fingerprint, draw_outside
from datarecon.errors import DataReconError
from datarecon.evaluation.membership import (
    EXPECTED_GAIN,
    MembershipROC,
    SignalPower,
    calibrated_threshold,
    calibration_split,
    choose_strongest,
    epsilon_lower_bound,
    fixed_rule,
    headline_verdict,
    membership_roc,
    min_negatives,
)
from datarecon.evaluation.privacy import MIN_CLASS_SIZE, roc_curve
from datarecon.evaluation.records import read_membership_result
from datarecon.experiments.execution import Execution
from datarecon.experiments.reconstruct import attacker_knowledge
from datarecon.experiments.references import (
    KEPT_ALWAYS,
    POOL_FILE,
    REFERENCE_WEIGHTS,
    REFERENCES_DIR,
    RecipeTrainer,
    ReferenceJob,
    ReferencePool,
    ReferenceSettings,
    Trainer,
    done_record,
    load_reference_model,
    load_statistics,
    reference_config,
    subset,
    train_references,
    trained_times,
)
from datarecon.kernel.engine import track
from datarecon.kernel.files import (
    DONE_MARKER,
    MEMBERSHIP_EXPOSED,
    MEMBERSHIP_EXPOSED_CSV,
    MEMBERSHIP_RESULT,
    MEMBERSHIP_SCORES,
    MEMBERSHIP_TARGET,
    METRICS_FILE,
    RUN_JSON,
)
from datarecon.kernel.outdir import OutDir, is_empty
from datarecon.models.checkpoint import EXTRAS, model_identity, read_model_meta
from datarecon.models.pretrained import load_recorded_pretrained
from datarecon.models.spec import build_model, first_layer_init_std
from datarecon.report.figures import membership_roc_figure, save_figure
from datarecon.training.target import TrainConfig
from datarecon.utils.io import atomic_write_json, atomic_write_text, load_tensors, read_json, rows_to_csv, save_tensors

__all__ = ["AUTO_COUNTS", "Calibration", "Candidates", "MembershipCase", "MembershipSettings", "MembershipSetup",
           "Runtime", "SignalScores", "check_membership_folder", "compare_signals", "evaluate_case",
           "evaluate_membership", "membership_section", "prepare_membership", "read_membership_folder", "references_needed",
           "score_images", "target_record"]

#: the file of a membership folder that holds the result
RESULT_FILE = MEMBERSHIP_RESULT
#: the per-candidate scores, membership and split
SCORES_FILE = MEMBERSHIP_SCORES
ROC_FIGURE = "roc.png"
SIGNALS_CSV = "signals.csv"
#: the most exposed members' images (the report shows them) and every member ranked (a table)
EXPOSED_FILE = MEMBERSHIP_EXPOSED
EXPOSED_CSV = MEMBERSHIP_EXPOSED_CSV
#: how many of the most exposed members keep their images in :data:`EXPOSED_FILE`
EXPOSED_KEPT = 32
#: the format of the record of the model a membership folder measures (:data:`~datarecon.kernel.files.MEMBERSHIP_TARGET`)
TARGET_FORMAT = "datarecon-membership-target/1"
#: ``references.count: auto`` picks the largest of these counts whose estimated time fits the budget
AUTO_COUNTS = (16, 32, 64, 128, 256)
#: the online signals are flagged when the candidates of the half-in pool are IN for fewer models than this on average
FEW_IN_MODELS = 8
#: the place of the signals measured on the half-in pool, in words
HALF_IN = "the half-in pool"


class MembershipSettings(BaseModel):
    """How a membership evaluation draws its images and which attacks it runs (one-to-one with the flags).

    Attributes:
        nonmembers: non-members drawn from the unused part of the model's training split (at least 1000 resolve a
            TPR at 0.1% FPR)
        population: population samples for RMIA, drawn from the test split
        calibration_fraction: fraction of the members and of the non-members on which the strongest signal is chosen
            when no reference models choose it (the ROCs are reported on the rest)
        seed: seed of the draws and of the calibration split
        references: the reference models
        attacks: settings of the reference attacks
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    nonmembers: int = Field(default=2000, ge=1)
    population: int = Field(default=1000, ge=1)
    calibration_fraction: float = Field(default=0.3, ge=0, lt=1)
    seed: Seed = 0
    references: ReferenceSettings = ReferenceSettings()
    attacks: MIASettings = MIASettings()

    def without_references(self) -> MembershipSettings:
        """These settings with no reference models (``datarecon evaluate`` and the reproductions' quick rows)."""
        return self.model_copy(update={"references": self.references.fixed(0)})


class Calibration(BaseModel):
    """Where the member call of a user's images comes from: the null, the false-positive rate and the signal.

    Attributes:
        null: images known NOT to be training images, to calibrate the threshold on (default: the
            model's held-out test images)
        fpr: false-positive rate of the member call (default 0.01)
        signal: the signal the member call uses (auto: the strongest of an evaluation kept in --out, else
            the loss with labels and the subspace without)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    null: Path | None = None
    fpr: float = 0.01
    signal: str = "auto"


@dataclass(frozen=True)
class MembershipSetup:
    """The model as the attacker sees it, its subspace and its input shift.

    Attributes:
        target: the attacker's view (float64).
        analysis: :class:`~datarecon.attacks.subspace.SubspaceAnalysis` of the first dense layer, or None.
        mean: (C, H, W) display → model shift (model input = display − mean; zeros for a user's own model, whose
            images are its inputs).
        meta: model.json ({} for a user's own model).
        threat: the threat-model record (:func:`~datarecon.attacks.knowledge.threat_model`).
    """

    target: Any
    analysis: Any
    mean: torch.Tensor
    meta: dict[str, Any]
    threat: dict[str, Any]

    @property
    def subspace_applies(self) -> bool:
        """Whether the first dense layer reads the images themselves (an MLP), so that the subspace test means
        what it says; a CNN's first dense layer reads features."""
        return self.analysis is not None and bool(self.analysis.layer.on_input)

    def scores(self, display: torch.Tensor) -> np.ndarray:
        """Subspace scores (higher = member) of display-space images (N, C, H, W)."""
        if self.analysis is None:
            raise DataReconError("the model has no dense layer to analyse; the subspace signal needs one")
        return subspace_scores(self.target.model, self.target.params, self.analysis, self.inputs(display)).numpy()

    def inputs(self, display: torch.Tensor) -> torch.Tensor:
        """Display-space images as model inputs, in the dtype of the model's parameters (float64 for a model
        directory; a user's model as its weights are)."""
        dtype = next(iter(self.target.params.values())).dtype
        return (display.to(torch.float64) - self.mean.to(torch.float64)).to(dtype)

    def subspace_note(self) -> str:
        """Why the subspace signal is not measured ("" where it is)."""
        if self.subspace_applies:
            return ""
        if self.analysis is not None:
            return "not applicable: the first dense layer reads the features of earlier layers, not the images"
        return "not applicable: the model has no dense layer"


def setup_of(target: Target, *, knowledge: KnowledgeSettings | None, meta: dict[str, Any] | None,
             mean: torch.Tensor) -> MembershipSetup:
    """Resolve the attacker's knowledge for ``target`` and analyse its first dense layer."""
    prior = AttackerPrior.balanced(m=1, num_outputs=target.num_outputs, input_shape=target.input_shape)
    prior, threat = attacker_knowledge(target, prior, knowledge or KnowledgeSettings(), model_meta=meta)
    return MembershipSetup(target=target, analysis=prior.subspace, mean=mean, meta=dict(meta or {}), threat=threat)


def prepare_membership(model_dir: str | Path, *, knowledge: KnowledgeSettings | None = None) -> MembershipSetup:
    """Load the model directory, resolve the attacker's knowledge and analyse the first dense layer.

    Raises:
        DataReconError: a bad model directory or known initialisation; a known n larger than the layer allows.
    """
    meta = read_model_meta(model_dir)
    target = Target.from_model_dir(model_dir, dtype=torch.float64)
    mean = load_tensors(Path(model_dir) / EXTRAS)["input_mean"].to(torch.float64)
    return setup_of(target, knowledge=knowledge, meta=meta, mean=mean)


def _task(meta: dict[str, Any], data_dir: str | Path | None) -> Any:
    task = load_task(DataSpec.model_validate(meta["data"]), data_dir=data_dir)
    check_fingerprint(task, meta.get("data_fingerprint"), where="the model", splits=("train",))
    return task


# ---------------------------------------------------------------------------------------------
# the signals, and their comparison


@dataclass(frozen=True)
class SignalScores:
    """Every signal's score of N candidates (higher = member), where each is measured, and the signals that do not
    apply.

    Attributes:
        scores: name → (N,) float64 numpy array (values outside the signal's scope are not read).
        not_applicable: name → why (e.g. ``subspace`` on a CNN, the reference signals without references).
        scope: name → (N,) bool, the candidates the signal is measured on (absent: all of them); the online signals
            are measured on the half-in pool.
        notes: name → a caveat printed beside its line (e.g. few IN models).
    """

    scores: dict[str, np.ndarray]
    not_applicable: dict[str, str]
    scope: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)

    def where(self, name: str, n: int) -> np.ndarray:
        """(N,) bool: the candidates ``name`` is measured on."""
        return self.scope.get(name, np.ones(n, dtype=bool))


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


def _where_text(mask: np.ndarray, mem: np.ndarray, scope_name: str) -> str:
    return f"{scope_name}: {int((mask & mem).sum())} members, {int((mask & ~mem).sum())} non-members"


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


# ---------------------------------------------------------------------------------------------
# the members, the non-members and the half-in pool


@dataclass(frozen=True)
class Candidates:
    """The members and non-members of an evaluation, the half-in pool and the population samples of RMIA.

    Attributes:
        x: (N, C, H, W) images, members first (display images of a model directory, the inputs of a user's model);
            y: (N,) labels; classes: (N,) task-class index.
        is_member: (N,) bool.
        indices: (N,) int64 index of each image in its split (its position in the given files for a user's model).
        eligible: (N,) bool: the half-in pool, the members and as many non-members of each class, which the
            reference models train on (:func:`half_in_pool`).
        per_class: task class → how many images of it each reference model trains on (the members' count).
        z_x, z_y: (M, ...) population samples (test split), z_indices (M,).
        provenance: JSON-ready: where each set came from (sources, counts, what was available).
        shortfall: why the half-in pool could not hold as many non-members as members of a class ("" when it can).
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: torch.Tensor
    is_member: np.ndarray
    indices: torch.Tensor
    eligible: np.ndarray
    per_class: dict[int, int]
    z_x: torch.Tensor
    z_y: torch.Tensor
    z_indices: torch.Tensor
    provenance: dict[str, Any]
    shortfall: str = ""


def task_classes(y: torch.Tensor) -> torch.Tensor:
    """The task-class index of labels: ±1 → 0/1, class indices as they are."""
    return (y > 0).to(torch.int64) if y.dtype.is_floating_point else y.to(torch.int64).clone()


def half_in_pool(classes: torch.Tensor, is_member: np.ndarray, *, seed: int) -> tuple[np.ndarray, dict[int, int], str]:
    """LiRA's half-in pool: every member and, for each class, as many non-members as it has members (a seeded draw),
    so that reference models trained on the members' count of each class from it hold each of these candidates with
    probability one half.

    Returns:
        ((N,) bool pool, class → the members' count, why a class has fewer non-members than members or "").
    """
    c = np.asarray(classes, dtype=np.int64)
    mem = np.asarray(is_member, dtype=bool)
    pool = mem.copy()
    per_class = {int(k): int(((c == k) & mem).sum()) for k in np.unique(c[mem])}
    gen = torch.Generator().manual_seed(int(seed) + 2)
    short = []
    for k, m in per_class.items():
        non = np.flatnonzero((c == k) & ~mem)
        pick = non[torch.randperm(non.size, generator=gen).numpy()[:m]] if non.size else non
        pool[pick] = True
        if non.size < m:
            short.append(f"class {k} has {non.size} non-members for {m} members")
    why = ("the half-in pool needs as many non-members as members of each class, and " + "; ".join(short) +
           "; draw more --nonmembers") if short else ""
    return pool, per_class, why


def _pretraining_images(meta: dict[str, Any], dataset: str) -> torch.Tensor | None:
    """The training-split indices the pretrained model of a fine-tuning trained on (same dataset), or None: they
    shaped the weights too, so they are no non-members of the fine-tuned model."""
    pre = meta.get("pretrained") or {}
    if not pre.get("path") or (pre.get("data") or {}).get("dataset") != dataset:
        return None
    try:
        seen = load_recorded_pretrained(meta).indices.get("train")
    except DataReconError as exc:
        raise DataReconError(f"the model was fine-tuned from {pre['path']}, whose training images cannot be read "
                             f"({exc}); they must be left out of the non-members: restore that directory") from None
    return None if seen is None else seen.to(torch.int64)


def assemble_candidates(members: tuple[torch.Tensor, torch.Tensor], nonmembers: tuple[torch.Tensor, torch.Tensor],
                        population: tuple[torch.Tensor, torch.Tensor], *, indices: tuple[torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor],
                        provenance: dict[str, Any], seed: int) -> Candidates:
    """Candidates from members, non-members and population samples (each (x, y)), with the half-in pool drawn."""
    y = torch.cat([members[1], nonmembers[1]])
    classes = task_classes(y)
    is_member = np.r_[np.ones(members[0].shape[0], bool), np.zeros(nonmembers[0].shape[0], bool)]
    eligible, per_class, shortfall = half_in_pool(classes, is_member, seed=seed)
    prov = {**provenance, "half_in": {"count": int(eligible.sum()), "members": int(members[0].shape[0]),
                                      "nonmembers": int(eligible.sum()) - int(members[0].shape[0]),
                                      "source": "the members and as many non-members of each class (seed "
                                                f"{seed + 2}), the pool the reference models train on"}}
    return Candidates(x=torch.cat([members[0], nonmembers[0]]), y=y, classes=classes, is_member=is_member,
                      indices=torch.cat([indices[0], indices[1]]), eligible=eligible, per_class=per_class,
                      z_x=population[0], z_y=population[1], z_indices=indices[2], provenance=prov, shortfall=shortfall)


def draw_candidates(meta: dict[str, Any], task: Any, settings: MembershipSettings, *,
                    data_dir: str | Path | None) -> Candidates:
    """The model's training images (members), ``settings.nonmembers`` images of the same classes from the unused
    part of its training split (non-members), the half-in pool among them, and ``settings.population`` test-split
    images (RMIA's population).

    Raises:
        DataReconError: no non-member is left in the training split.
    """
    spec = DataSpec.model_validate(meta["data"])
    members = task.train
    seen = _pretraining_images(meta, spec.dataset)
    exclude = members.indices if seen is None else torch.cat([members.indices, seen])
    non, available = draw_outside(spec, split="train", exclude=exclude, count=settings.nonmembers,
                                  seed=settings.seed, data_dir=data_dir)
    if len(non) == 0:
        raise DataReconError(f"every {spec.dataset} training image of the task's classes trained the model: no "
                             "non-member is left to measure against")
    pop, pop_available = draw_outside(spec, split="test", count=settings.population, seed=settings.seed + 1,
                                      data_dir=data_dir)
    prov = {
        "members": {"count": len(members), "source": f"the model's {len(members)} training images (its data spec)"},
        "nonmembers": {"count": len(non), "available": available, "requested": settings.nonmembers,
                       "source": f"drawn uniformly (seed {settings.seed}) from the {available} {spec.dataset} "
                                 "training-split images of the task's classes that did not train the model"
                                 + (" (nor the pretrained model it was fine-tuned from)" if seen is not None else "")},
        "population": {"count": len(pop), "available": pop_available,
                       "source": f"drawn uniformly (seed {settings.seed + 1}) from the {pop_available} {spec.dataset} "
                                 "test-split images of the task's classes (never a candidate, never in a reference "
                                 "model's training set)"},
    }
    return assemble_candidates((members.x, members.y), (non.x, non.y), (pop.x, pop.y),
                               indices=(members.indices, non.indices, pop.indices), provenance=prov,
                               seed=settings.seed)


def _training_config(meta: dict[str, Any]) -> Any:
    """The model's recorded training config (the recipe reference models repeat).

    Raises:
        DataReconError: a model directory that records no training config.
    """
    training = dict(meta.get("training") or {})
    if not training:
        raise DataReconError("reference models repeat the recipe a model directory records, and this one records "
                             "none; pass --references 0")
    training.pop("config_hash", None)
    return build_config(TrainConfig, training, where="the model's recorded training config")


@dataclass(frozen=True)
class Runtime:
    """Where an evaluation's reference models train and how it reports.

    Attributes:
        execution: backend, workers, Ray address, threads per task (:class:`~datarecon.experiments.execution.Execution`).
        device: torch device of the reference models' training.
        data_dir: data folder (None: ``$DATARECON_DATA`` / cache).
        log: sink of the lines that say what runs (reference models trained, kept, scoring).
        progress: progress of the reference models (one step per model) and of the scoring (one step per
            pseudo-target, then per signal): a :data:`~datarecon.kernel.engine.PROGRESS_MODES` name or a bool (True:
            a bar on a terminal, plain lines in a log; False: none).
    """

    execution: Execution = Execution()
    device: str = "cpu"
    data_dir: str | Path | None = None
    log: Callable[[str], None] = print
    progress: bool | str = False


#: the most reference models :func:`references_needed` tries before it gives up
MAX_NEEDED_SEARCH = 2000
#: the fewest reference models that can take turns as pseudo-targets (one plays the target, two stay references)
MIN_PSEUDO_REFERENCES = 3
#: reference models taken in turn as pseudo-targets to choose the strongest signal (their weights are always kept)
PSEUDO_TARGETS = KEPT_ALWAYS


def _fits(in_count: np.ndarray, models: int) -> bool:
    """Whether LiRA's and RMIA's per-candidate fits are possible: some candidate in two models, some outside two."""
    return bool((in_count >= 2).any()) and bool(((models - in_count) >= 2).any())


def references_needed(classes: torch.Tensor, per_class: int | dict[int, int], *, seed: int, count: int,
                      eligible: np.ndarray | None = None) -> int | None:
    """The fewest reference models, ``count`` or more, whose training subsets (known before any is trained: they
    follow from the seed, :func:`~datarecon.experiments.references.subset`) let every reference signal be fitted,
    also with each of the first :data:`PSEUDO_TARGETS` left out as a pseudo-target; None beyond
    :data:`MAX_NEEDED_SEARCH`.

    Raises:
        DataReconError: a task class with fewer eligible pool images than a model trains on.
    """
    n = int(classes.shape[0])
    first: list[np.ndarray] = []  # the models that play the target in turn (only these are left out)
    in_count = np.zeros(n, dtype=np.int64)
    for k in range(max(count, MAX_NEEDED_SEARCH)):
        row = np.zeros(n, dtype=np.int64)
        row[subset(classes, per_class, seed=seed, index=k, eligible=eligible)] = 1
        if k < PSEUDO_TARGETS:
            first.append(row)
        in_count += row
        models = k + 1
        if models < count or not _fits(in_count, models):
            continue
        if models < MIN_PSEUDO_REFERENCES or all(_fits(in_count - row, models - 1) for row in first):
            return models
    return None


def check_reference_count(cand: Candidates, count: int, seed: int) -> None:
    """Refuse, before any reference model is trained, a count K too small for LiRA's and RMIA's fits, naming the
    number needed, and a half-in pool that cannot be half in.

    Raises:
        DataReconError: K too small (with the fewest that suffice), or a class with too few non-members.
    """
    if not count:
        return
    if cand.shortfall:
        raise DataReconError(cand.shortfall)
    needed = references_needed(cand.classes, cand.per_class, seed=seed, count=count, eligible=cand.eligible)
    if needed == count:
        return
    fix = f"pass --references {needed} or more" if needed is not None else f"even {MAX_NEEDED_SEARCH} would not do"
    raise DataReconError(f"--references {count} is too few: LiRA and RMIA fit each candidate from the reference "
                         f"models that did and did not train on it (again with each of the first {PSEUDO_TARGETS} "
                         f"left out, to choose the strongest signal), which {count} models cannot do; {fix}")


# ---------------------------------------------------------------------------------------------
# what one evaluation measures, and its reference models


@dataclass(frozen=True)
class MembershipCase:
    """What one evaluation measures: the model as the attacker sees it, the candidates, how reference models train.

    Attributes:
        setup: the target, its subspace analysis and input shift (:class:`MembershipSetup`).
        candidates: members, non-members, the half-in pool and the population (:class:`Candidates`).
        trainer: how a reference model trains (:class:`~datarecon.experiments.references.RecipeTrainer` for a model
            directory, :class:`~datarecon.experiments.references.FunctionTrainer` for a user's model), or None.
        record: what the membership folder records of the model (:func:`target_record`).
        no_trainer: why there is no trainer (said where reference models were asked for).
        knowledge: the attacker's knowledge (the subspace signal of the pseudo-targets is made the same way).
    """

    setup: MembershipSetup
    candidates: Candidates
    trainer: Trainer | None
    record: dict[str, Any]
    no_trainer: str = ""
    knowledge: KnowledgeSettings = KnowledgeSettings()


@dataclass(frozen=True)
class References:
    """The reference models of an evaluation: their statistics (None when none were trained), the record printed
    and kept, what a choice of the strongest signal on them needs, and why the reference signals are missing."""

    stats: Any
    record: dict[str, Any] | None
    pseudo: PseudoTargets | None
    missing: str


def _pool(cand: Candidates) -> ReferencePool:
    return ReferencePool(x=cand.x, y=cand.y, classes=cand.classes, z_x=cand.z_x, z_y=cand.z_y,
                         eligible=torch.as_tensor(cand.eligible))


def _job(case: MembershipCase, folder: Path, settings: ReferenceSettings) -> ReferenceJob:
    """The reference models' job in ``folder`` (its pool written there, or checked against the one it holds)."""
    pool = _pool(case.candidates)
    key = pool.fingerprint()
    if (folder / POOL_FILE).is_file():
        if ReferencePool.load(folder / POOL_FILE).fingerprint() != key:
            raise DataReconError(f"{folder} holds reference models of this model on another pool (other --nonmembers, "
                                 "--population or --draw-seed, or other data); pass the same draws again, choose "
                                 "another --out, or pass --overwrite to replace them")
    else:
        pool.save(folder / POOL_FILE)
    assert case.trainer is not None
    return ReferenceJob(out=folder, trainer=case.trainer, pool_key=key, settings=settings,
                        per_class=case.candidates.per_class)


def _auto_count(case: MembershipCase, folder: Path, settings: ReferenceSettings,
                runtime: Runtime) -> tuple[int | None, dict[str, Any]]:
    """``count: auto``: train the first model(s) (one per worker) and time them, then climb :data:`AUTO_COUNTS`: the
    next count is trained when its remaining models, at the time per model of the models trained last, fit what is
    left of the budget (the models' own training times, as their completion markers record them, on the workers
    given; on a machine whose load changes the estimate follows it, one count at a time); None when even the
    smallest does not fit, with the line that says what the reference models would cost and may gain."""
    workers = max(int(runtime.execution.workers or 1), 1)
    cand = case.candidates
    done = min(workers, AUTO_COUNTS[0])
    t0 = time.perf_counter()
    train_references(_job(case, folder, settings.fixed(done)), execution=runtime.execution, device=runtime.device,
                     log=runtime.log, progress=False)
    times = trained_times(folder, range(done)) or [time.perf_counter() - t0]
    first = per_model = float(np.median(times))
    budget = settings.budget_minutes * 60
    count = None
    for k in AUTO_COUNTS:
        k = max(k, references_needed(cand.classes, cand.per_class, seed=settings.seed, count=k,
                                     eligible=cand.eligible) or k)
        if (sum(times) + (k - done) * per_model) / workers > budget:
            break
        train_references(_job(case, folder, settings.fixed(k)), execution=runtime.execution, device=runtime.device,
                         log=runtime.log, progress=runtime.progress)
        latest = trained_times(folder, range(done, k))
        times += latest
        per_model = float(np.median(latest)) if latest else per_model
        count, done = k, k
    record = {"mode": "auto", "budget_minutes": settings.budget_minutes, "probe_models": min(workers, AUTO_COUNTS[0]),
              "workers": workers, "seconds_per_model": first, "counts_tried": list(AUTO_COUNTS),
              "wall_time_s": time.perf_counter() - t0}
    if count is not None:
        return count, record
    smallest = AUTO_COUNTS[0]
    minutes = smallest * first / workers / 60
    record["skipped"] = (f"reference attacks (LiRA, RMIA) not run: {smallest} reference models would take about "
                         f"{minutes:.1f} min ({first:.1f} s each, measured on the first {record['probe_models']}, on "
                         f"{workers} worker(s)), more than --budget-minutes {settings.budget_minutes:g}; "
                         f"{EXPECTED_GAIN}; pass --budget-minutes {math.ceil(minutes * 1.2)} or --references "
                         f"{smallest} --out DIR")
    return None, record


def _in_counts(inside: torch.Tensor, eligible: np.ndarray) -> dict[str, float]:
    """How many reference models each candidate of the half-in pool is IN for: mean, min, max, and the count K."""
    counts = inside[:, torch.as_tensor(eligible)].to(torch.float64).sum(0)
    return {"mean": float(counts.mean()), "min": float(counts.min()), "max": float(counts.max()),
            "models": int(inside.shape[0]), "candidates": int(eligible.sum())}


def _references(case: MembershipCase, settings: MembershipSettings, folder: Path | None,
                runtime: Runtime) -> References:
    """Train (or reuse) the reference models in ``folder``: ``settings.references.count`` of them, or with ``auto``
    as many as the budget allows; their statistics, record and what the choice on pseudo-targets needs."""
    ref = settings.references
    if ref.count == 0:
        return References(None, None, None, "not run: no reference models (--references K or auto)")
    if case.trainer is None:
        return References(None, None, None, f"not run: {case.no_trainer}")
    if case.candidates.shortfall:
        return References(None, None, None, f"not run: {case.candidates.shortfall}")
    assert folder is not None
    auto = None
    count = ref.count
    if ref.auto:
        count, auto = _auto_count(case, folder, ref, runtime)
        if count is None:
            return References(None, {"count": 0, "auto": auto}, None, auto["skipped"])
    stats = train_references(_job(case, folder, ref.fixed(count)), execution=runtime.execution, device=runtime.device,
                             log=runtime.log, progress=runtime.progress)
    cand = case.candidates
    counts = _in_counts(stats.inside, cand.eligible)
    record = {"count": stats.count, "trained": stats.trained, "reused": stats.count - stats.trained,
              "wall_time_s": stats.wall_time_s, "per_class": {str(k): v for k, v in cand.per_class.items()},
              "pool": int(cand.x.shape[0]), "half_in": int(cand.eligible.sum()), "seed": ref.seed,
              "pool_fingerprint": _pool(cand).fingerprint(), "in_models": counts, "auto": auto,
              "recipe": case.trainer.label,
              "note": (f"{stats.count} reference models trained with {case.trainer.label}, each on half of the "
                       f"{int(cand.eligible.sum())} candidates of the half-in pool (the members and as many "
                       f"non-members of each class): each of them is IN for {counts['mean']:.1f} of the "
                       f"{stats.count} models on average (min {counts['min']:.0f}, max {counts['max']:.0f}); the other "
                       f"{int((~cand.eligible).sum())} non-members are OUT for all of them")}
    pseudo = PseudoTargets(refs=stats, attacks=settings.attacks, signals=(), pool_x=cand.x, pool_y=cand.y,
                           loss=case.trainer.loss, eligible=cand.eligible,
                           model_of=lambda r: load_reference_model(folder, r, case.trainer))  # type: ignore[arg-type]
    return References(stats, record, pseudo, "")


def _signals(case: MembershipCase, settings: MembershipSettings, refs: References) -> SignalScores:
    """Every applicable signal of the candidates, each with the candidates it is measured on."""
    setup, cand = case.setup, case.candidates
    target = setup.target
    x = setup.inputs(cand.x)
    stats = example_statistics(target.model, x, cand.y, loss=target.loss, params=target.params)
    view = TargetView(model=target.model, params=target.params, x=x, y=cand.y, loss=target.loss, stats=stats)
    scores = {k: v.numpy() for k, v in target_signals(view).items()}
    missing: dict[str, str] = {}
    if setup.subspace_applies:
        scores["subspace"] = setup.scores(cand.x)
    else:
        missing["subspace"] = setup.subspace_note()
    scope, notes = {}, {}
    if refs.stats is not None:
        z = example_statistics(target.model, setup.inputs(cand.z_x), cand.z_y, loss=target.loss, params=target.params)
        scores.update({k: v.numpy() for k, v in reference_signals(stats, z.loss, refs.stats, settings.attacks).items()})
        missing.update({k: "not measured: it needs population samples, and none were given" for k in SIGNALS.names()
                        if SIGNALS.get(k).kind == "reference" and k not in scores})
        mean_in = (refs.record or {}).get("in_models", {}).get("mean", 0.0)
        for name in SIGNALS.ordered():
            if SIGNALS.get(name).online and name in scores:
                scope[name] = cand.eligible
                if mean_in < FEW_IN_MODELS:
                    notes[name] = (f"few IN models: each candidate is IN for {mean_in:.1f} reference models on "
                                   f"average (fewer than {FEW_IN_MODELS}), so its IN Gaussian leans on the pooled "
                                   "variance; more --references")
    else:
        missing.update({k: refs.missing for k in SIGNALS.names() if SIGNALS.get(k).kind == "reference"})
    return SignalScores(scores=scores, not_applicable=missing, scope=scope, notes=notes)


# ---------------------------------------------------------------------------------------------
# the strongest signal, chosen on reference models playing the target


@dataclass(frozen=True)
class PseudoTargets:
    """What :func:`pseudo_target_choice` needs: the reference models and how the target's signals were made.

    Attributes:
        refs: the K reference models' statistics (``confidence``, ``loss``, ``inside``, ``population_loss``,
            ``select``; :class:`~datarecon.experiments.references.ReferenceStatistics`).
        attacks: the reference attacks' settings.
        signals: the names of the target's signals (only these compete).
        pool_x: (N, ...) the pool images, as the reference models take them after their own input shift;
            pool_y: (N,) their labels; loss: the training loss.
        eligible: (N,) bool, the half-in pool (where the online signals are measured).
        model_of: ``r -> (model, input shift)`` of reference model r (kept for the first :data:`PSEUDO_TARGETS`).
        subspace_of: ``(model, params, x, r) -> scores``: the subspace signal of reference model r as the
            target's was made (its knowledge); None: it does not compete.
    """

    refs: Any
    attacks: MIASettings
    signals: tuple[str, ...]
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    loss: Any
    eligible: np.ndarray
    model_of: Callable[[int], tuple[torch.nn.Module, torch.Tensor]]
    subspace_of: Callable[..., np.ndarray] | None = None


def _pseudo_scores(p: PseudoTargets, r: int) -> dict[str, np.ndarray]:
    """Every competing signal with reference model ``r`` as the target and the others as its references."""
    refs = p.refs
    stats = ExampleStatistics(loss=refs.loss[r], probability=torch.exp(-refs.loss[r]), confidence=refs.confidence[r])
    model, shift = p.model_of(r)
    dtype = next(model.parameters()).dtype
    x = (p.pool_x - shift).to(dtype)
    params = {k: v.detach() for k, v in model.named_parameters()}
    view = TargetView(model=model, params=params, x=x, y=p.pool_y, loss=p.loss, stats=stats)
    wanted = set(p.signals)
    kinds = ("black-box", "white-box") if wanted - {"loss", "confidence"} else ("black-box",)
    scores = {k: v.numpy() for k, v in target_signals(view, kinds=kinds).items() if k in wanted}
    others = refs.select([k for k in range(refs.count) if k != r])
    scores.update({k: v.numpy() for k, v in reference_signals(stats, refs.population_loss[r], others,
                                                               p.attacks).items()})
    if p.subspace_of is not None and "subspace" in wanted:
        scores["subspace"] = p.subspace_of(model, params, x, r)
    return {k: v for k, v in scores.items() if k in wanted}


def _subspace_of_reference(config: Any, knowledge: KnowledgeSettings, seed: int) -> Callable[..., np.ndarray]:
    """The subspace signal of reference model r as the attacker made the target's: with its n, and with θ_init
    when the attacker knows the target's (for its own model that is the initialisation it drew)."""
    arch = config.arch_spec()

    def scores(model: torch.nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, r: int) -> np.ndarray:
        known = None
        if knowledge.known_init is not None:
            init_seed = reference_config(config, seed=seed, index=r, device="cpu").seed
            init = build_model(arch, generator=torch.Generator().manual_seed(init_seed), dtype=x.dtype)
            known = {k: v.detach() for k, v in init.named_parameters()}
        analysis = analyse(model, params, known_init=known, n=knowledge.n, fit_coefficient=config.weight_decay > 0,
                           init_std=None if known is not None else first_layer_init_std(arch),
                           generator=torch.Generator().manual_seed(0))
        return subspace_scores(model, params, analysis, x).numpy()

    return scores


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
        for name, sc in _pseudo_scores(p, r).items():
            scope = p.eligible if SIGNALS.get(name).online else every
            rocs.setdefault(name, []).append(membership_roc(sc[scope & mem], sc[scope & ~mem], name=name, n_boot=0))
    power = {k: SignalPower.mean(v) for k, v in rocs.items()}
    left = [k for k in p.signals if k not in power]
    where = (f"{count} reference models as pseudo-targets (mean over them; the target's membership is not read"
             + (f"; {', '.join(left)} not measurable on them and not competing)" if left else ")"))
    best, rule = choose_strongest(power, where=where)
    return Choice(name=best, rule=rule, power=power)


# ---------------------------------------------------------------------------------------------
# the membership folder: one model per folder


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
    kept = len(list((out / REFERENCES_DIR).glob("ref-*"))) if (out / REFERENCES_DIR).is_dir() else 0
    lost = "its result" + (f" and its {kept} reference models" if kept else "")
    raise DataReconError(f"--out {out} is the membership folder of {whose}; a call into it would replace {lost}: "
                         "choose another --out, or pass --overwrite to replace them")


def _ready(out: str | Path | OutDir | None, model: str | Path | dict[str, Any]) -> Path | None:
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


# ---------------------------------------------------------------------------------------------
# one evaluation


def _check_references(case: MembershipCase, settings: MembershipSettings, out: object) -> None:
    """Refuse, before the folder is written, a fixed number of reference models that cannot be trained or kept."""
    ref = settings.references
    if ref.auto or not ref.count:
        return
    if out is None:
        raise DataReconError(f"--references {ref.count} needs --out DIR: the reference models are kept there (and "
                             "reused by the next call)")
    if case.trainer is None:
        raise DataReconError(case.no_trainer)
    check_reference_count(case.candidates, int(ref.count), ref.seed)


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
            model or pool.
    """
    t0 = time.perf_counter()
    _check_references(case, settings, out)
    outp = _ready(out, case.record)
    with tempfile.TemporaryDirectory(prefix="datarecon-references-") as tmp:
        folder = outp if outp is not None else Path(tmp)
        refs = _references(case, settings, folder, runtime)
        signals = _signals(case, settings, refs)
        choice = None
        if refs.pseudo is not None:
            sub = None
            if "subspace" in signals.scores and isinstance(case.trainer, RecipeTrainer):
                sub = _subspace_of_reference(case.trainer.config, case.knowledge, settings.references.seed)
            choice = pseudo_target_choice(dataclasses.replace(refs.pseudo, signals=tuple(signals.scores),
                                                              subspace_of=sub), progress=runtime.progress)
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
              "epsilon": _epsilon(signals, case.candidates.is_member, ~cal, cmp["strongest"]["name"]),
              "subspace": case.setup.analysis.summary() if case.setup.analysis is not None else None,
              "wall_time_s": time.perf_counter() - t0}
    if outp is not None:
        write_membership(outp, result, signals, case.candidates, cal)
    return result


def _epsilon(signals: SignalScores, is_member: np.ndarray, reported: np.ndarray, name: str | None) -> dict[str, Any]:
    """The empirical ε lower bound of the headline signal on the reported part of its candidates."""
    if name is None:
        return {"lower": 0.0, "line": "empirical epsilon: no signal measured"}
    mask = signals.where(name, is_member.size) & reported
    s = signals.scores[name]
    bound = epsilon_lower_bound(s[mask & is_member], s[mask & ~is_member])
    return {**bound.summary(), "signal": name, "line": bound.line()}


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
    task = _task(setup.meta, runtime.data_dir)
    cand = draw_candidates(setup.meta, task, settings, data_dir=runtime.data_dir)
    trainer, why = None, ""
    if settings.references.count:
        try:
            trainer = RecipeTrainer(_training_config(setup.meta))
        except DataReconError as exc:
            why = str(exc)
    case = MembershipCase(setup=setup, candidates=cand, trainer=trainer, record=target_record(model_dir),
                          no_trainer=why, knowledge=knowledge or KnowledgeSettings())
    result = evaluate_case(case, settings=settings, out=out, runtime=runtime)
    return {**result, "model": str(model_dir)}


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


# ---------------------------------------------------------------------------------------------
# a user's own images


IMAGES_FILE = "images.json"


@dataclass(frozen=True)
class Labelled:
    """Display images with labels (given, or the model's predictions), and where the labels came from."""

    x: torch.Tensor
    y: torch.Tensor
    names: list[str]
    labels: str


def _labelled(setup: MembershipSetup, x: torch.Tensor, y: np.ndarray | None, names: list[str]) -> Labelled:
    """Labels in the model's convention: the given ones (checked), else the model's own predictions."""
    target = setup.target
    binary = target.num_outputs == 1
    if y is None:
        with torch.no_grad():
            out = target.forward(setup.inputs(x))
        pred = torch.where(out[:, 0] >= 0, 1.0, -1.0).double() if binary else out.argmax(1)
        return Labelled(x, pred, names, "the model's predictions (no labels given)")
    if binary:
        if not np.isin(y, (-1, 1)).all():
            raise DataReconError("labels of a one-output model must be -1 or +1")
        return Labelled(x, torch.as_tensor(y, dtype=torch.float64), names, "given")
    if not (np.equal(np.mod(y, 1), 0).all() and y.min() >= 0 and y.max() < target.num_outputs):
        raise DataReconError(f"labels must be class indices 0..{target.num_outputs - 1}")
    return Labelled(x, torch.as_tensor(y, dtype=torch.int64), names, "given")


def _kept_references(out: Path | None) -> list[int]:
    """The indices of the finished reference models whose weights a membership folder keeps."""
    if out is None or not (out / REFERENCES_DIR).is_dir():
        return []
    found = []
    for d in sorted((out / REFERENCES_DIR).glob("ref-*")):
        if (d / DONE_MARKER).is_file() and (d / REFERENCE_WEIGHTS).is_file() and d.name[4:].isdigit():
            found.append(int(d.name[4:]))
    return found


def _offline_reference_scores(setup: MembershipSetup, sets: list[Labelled], out: Path, kept: list[int],
                              attacks: MIASettings) -> list[dict[str, np.ndarray]]:
    """Every reference signal that needs no IN model (LiRA offline, RMIA, a plug-in's) of each set of images against
    the kept reference models (none of which trained on them: the images were not in the pool)."""
    trainer = RecipeTrainer(_training_config(setup.meta))
    pool = ReferencePool.load(out / POOL_FILE)
    if any(done_record(out, k).get("pool") != pool.fingerprint() for k in kept):
        raise DataReconError(f"{out / POOL_FILE} is not the pool its reference models were trained on (changed or "
                             f"damaged); rerun the --evaluate call into {out} with --overwrite to train them again")
    stats = load_statistics(out, max(kept) + 1).select(kept)
    target = setup.target
    z = example_statistics(target.model, setup.inputs(pool.z_x), pool.z_y, loss=target.loss, params=target.params)
    models = [load_reference_model(out, k, trainer) for k in kept]
    results = []
    for s in sets:
        mine = example_statistics(target.model, setup.inputs(s.x), s.y, loss=target.loss, params=target.params)
        ref = [example_statistics(m, (s.x - mean).to(next(m.parameters()).dtype), s.y, loss=trainer.loss)
               for m, mean in models]
        conf = torch.stack([r.confidence for r in ref])
        refs = dataclasses.replace(stats, confidence=conf, loss=torch.stack([r.loss for r in ref]),
                                   inside=torch.zeros_like(conf, dtype=torch.bool))
        results.append({k: v.numpy() for k, v in reference_signals(mine, z.loss, refs, attacks, online=False).items()})
    return results


def _image_signals(setup: MembershipSetup, sets: list[Labelled], out: Path | None,
                   attacks: MIASettings) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """Every signal available for images nobody knows the membership of, for each set; and notes."""
    notes: list[str] = []
    target = setup.target
    results = []
    for s in sets:
        x = setup.inputs(s.x)
        stats = example_statistics(target.model, x, s.y, loss=target.loss, params=target.params)
        view = TargetView(model=target.model, params=target.params, x=x, y=s.y, loss=target.loss, stats=stats)
        scores = {k: v.numpy() for k, v in target_signals(view).items()}
        if setup.subspace_applies:
            scores["subspace"] = setup.scores(s.x)
        results.append(scores)
    kept = _kept_references(out)
    if kept:
        for scores, more in zip(results, _offline_reference_scores(setup, sets, out, kept, attacks)):  # type: ignore[arg-type]
            scores.update(more)
        notes.append(f"the reference signals use the {len(kept)} reference models kept in {out} (none trained on "
                     "these images); the online signals need models trained on them and are not available")
    return results, notes


def _pick_signal(signal: str, available: list[str], out: Path | None, labels: str) -> tuple[str, str]:
    """The member call's signal: the one asked for, or (``auto``) the strongest of an evaluation kept in ``out``
    when available for images, else the loss with given labels, else the subspace where it applies."""
    if signal != "auto":
        SIGNALS.get(signal)
        if signal not in available:
            raise DataReconError(f"signal {signal!r} is not available for these images (available: "
                                 f"{', '.join(available)}); choose one of them or auto")
        return signal, "chosen with --signal"
    if out is not None and (out / RESULT_FILE).is_file():
        best = (read_json(out / RESULT_FILE).get("strongest") or {}).get("name")
        if best in available:
            return best, f"the strongest signal of the evaluation in {out}"
    if labels == "given" or "subspace" not in available:
        return "loss", "auto: no evaluation in --out to take the strongest signal from; the loss threshold"
    return "subspace", "auto: no evaluation in --out and no labels; the subspace test (needs none)"


def score_images(model_dir: str | Path, images: str | Path, *, calibration: Calibration = Calibration(),
                 knowledge: KnowledgeSettings | None = None, out: str | Path | OutDir | None = None,
                 attacks: MIASettings = MIASettings(), runtime: Runtime = Runtime()) -> dict[str, Any]:
    """Score a user's images against the model, each signal with a p-value against a visible null.

    Args:
        model_dir: the model directory.
        images: a folder of PNGs, an .npz or a .safetensors file (:func:`datarecon.data.images.load_images`);
            labels as array ``y`` of the file (else the model's predictions are taken).
        calibration: the null (images known not to be members, same forms; None: the model's held-out test
            images), the member call's false-positive rate in (0, 1) and its signal (a
            :data:`~datarecon.attacks.mia.SIGNALS` name or ``auto``).
        knowledge: the attacker's knowledge (known θ_init, n) for the subspace signal.
        out: a claimed membership folder (its kept reference models add LiRA offline and RMIA; the result
            goes to ``images.json``); None: nothing is written.
        attacks: the reference attacks' settings.
        runtime: the data folder (the default null).

    Returns:
        JSON-ready: ``images`` (name, score, p_value, member, and every signal's score and p-value),
        ``signal``, ``signal_rule``, ``threshold``, ``null``, ``labels``, ``knowledge``, ``notes``.

    Raises:
        DataReconError: bad images, labels or null (one line), an fpr outside (0, 1), an unknown signal or
            one not available, a model without held-out images and no ``null``.
    """
    null, fpr, signal = calibration.null, calibration.fpr, calibration.signal
    if not 0.0 < fpr < 1.0:
        raise DataReconError(f"--fpr must lie in (0, 1), got {fpr}; e.g. 0.01")
    if signal != "auto":
        SIGNALS.get(signal)
    t0 = time.perf_counter()
    setup = prepare_membership(model_dir, knowledge=knowledge)
    shape = tuple(setup.target.input_shape)
    x, names = load_images(images, input_shape=shape)
    mine = _labelled(setup, x, load_labels(images, count=x.shape[0]), names)
    nul, source = _null(setup, null, model_dir, runtime.data_dir)
    kept = _kept_folder(out, model_dir)
    (s_img, s_null), notes = _image_signals(setup, [mine, nul], kept, attacks)
    chosen, rule = _pick_signal(signal, list(s_img), kept, mine.labels)
    thr = calibrated_threshold(s_null[chosen], fpr)
    pvals = {k: (1.0 + (s_null[k][None, :] >= s_img[k][:, None]).sum(1)) / (1.0 + s_null[k].size) for k in s_img}
    rows = [{"name": nm, "score": float(s_img[chosen][i]), "p_value": float(pvals[chosen][i]),
             "member": bool(s_img[chosen][i] >= thr),
             "signals": {k: {"score": float(s_img[k][i]), "p_value": float(pvals[k][i])} for k in s_img}}
            for i, nm in enumerate(mine.names)]
    if s_null[chosen].size < min_negatives(fpr):
        notes.append(f"the null has {s_null[chosen].size} images, fewer than 1/fpr = {min_negatives(fpr)}: the "
                     "false-positive rate is not resolved; pass a larger --null")
    if mine.labels != "given":
        notes.append("no labels were given (array y of the .npz or .safetensors file): the model's own predictions "
                     "are the labels, which makes the loss-based signals weaker")
    result = {"model": str(model_dir), "fpr": fpr, "signal": chosen, "signal_rule": rule, "threshold": thr,
              "images": rows, "members": int(sum(r["member"] for r in rows)), "n_images": len(rows),
              "labels": mine.labels, "null": {"source": source, "count": int(s_null[chosen].size), "labels": nul.labels},
              "knowledge": setup.threat, "notes": notes, "wall_time_s": time.perf_counter() - t0}
    outp = _ready(out, model_dir)  # every input accepted: only now is the folder written
    if outp is not None:
        atomic_write_json(outp / IMAGES_FILE, result)
    return result


def _null(setup: MembershipSetup, null: Path | None, model_dir: str | Path,
          data_dir: str | Path | None) -> tuple[Labelled, str]:
    """The null images of a member call (the given ones, else the model's held-out test images) and their source."""
    if null is not None:
        xn, names = load_images(null, input_shape=tuple(setup.target.input_shape))
        return _labelled(setup, xn, load_labels(null, count=xn.shape[0]), names), str(null)
    task = _task(setup.meta, data_dir)
    if len(task.heldout) == 0:
        raise DataReconError(f"{model_dir} has no held-out images to calibrate on; pass --null with images known not "
                             "to be training images")
    return Labelled(task.heldout.x, task.heldout.y, [], "given"), "the model's held-out test images (its data spec)"


def _kept_folder(out: str | Path | OutDir | None, model_dir: str | Path) -> Path | None:
    """The membership folder whose kept evaluation and reference models a call may read (checked to be this
    model's); None without one, or when ``--overwrite`` replaces it."""
    if out is None or (isinstance(out, OutDir) and out.clear):
        return None
    path = out.path if isinstance(out, OutDir) else Path(out)
    check_membership_folder(path, model_dir)
    return path


# ---------------------------------------------------------------------------------------------
# the membership section of a run's evaluation (the report's membership card)


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


def attach_membership(run_dir: str | Path, *, data_dir: str | Path | None = None,
                      settings: MembershipSettings = MembershipSettings(),
                      folder: str | Path | None = None) -> dict[str, Any] | None:
    """Add the membership of the model a run attacked to the run's ``metrics.json``: the result a membership folder
    holds (``folder``: ``datarecon membership --evaluate --out DIR`` of the same model, reference attacks included),
    else the signals without reference models, measured now.

    Runs of a model directory only (a user's own model has no data spec to draw non-members from).

    Returns:
        The section written (:func:`membership_section`), or None for a run without a model directory.

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
