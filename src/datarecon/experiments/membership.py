"""Membership: is an image in the training set of a model? (``datarecon membership``)

Every signal of :data:`datarecon.attacks.mia.SIGNALS` on the same members and non-members:

* black-box: the loss (the threshold attack every membership paper compares with) and LiRA's
  logit-scaled confidence;
* white-box: the per-example gradient norm, and the first dense layer's training subspace
  (:func:`datarecon.attacks.subspace.subspace_scores`; not applicable where that layer does not read
  the images, e.g. the read-out of a CNN);
* reference models (``references.count`` > 0): LiRA offline and online, RMIA offline and online,
  from models trained with the target's recipe (:mod:`datarecon.experiments.references`).

:func:`evaluate_membership` measures them on the model's own training images (members) against
**non-members drawn from the unused part of its training split** (by default 2000, so that a TPR at
0.1 % FPR is estimable on the reported part), with RMIA's population samples from the test split.
The members and non-members are split once, seeded and stratified (:func:`~datarecon.evaluation.
membership.calibration_split`): the **strongest signal** is chosen on the calibration part
(:func:`~datarecon.evaluation.membership.choose_strongest`) and every reported ROC is measured on the
other part, so the choice never reads the numbers it headlines. With ``out`` the result, the
per-candidate scores, a table and an ROC figure (log FPR axis) are written to a membership folder,
which also keeps the reference models for the next call.

:func:`score_images` scores a user's own images with a member call calibrated on a null the user can
see (by default the model's held-out test images).

Model directories only (their data spec names the members; their normalisation maps display images
to model inputs); a user's own ``nn.Module`` is measured with :func:`membership_of_module`.
"""

from __future__ import annotations

import copy
import dataclasses
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
from datarecon.attacks.mia import SIGNALS, MIASettings, reference_signals
from datarecon.attacks.mia.reference import lira_offline, rmia
from datarecon.attacks.mia.statistics import ExampleStatistics, example_statistics, gradient_norms
from datarecon.attacks.subspace import analyse, subspace_scores
from datarecon.config import Seed, build_config
from datarecon.data import DataSpec, load_task
from datarecon.data.images import load_images, load_labels
from datarecon.data.selection import check_fingerprint, draw_outside
from datarecon.errors import DataReconError
from datarecon.evaluation.membership import (
    SignalPower,
    calibrated_threshold,
    calibration_split,
    choose_strongest,
    membership_roc,
    min_negatives,
)
from datarecon.evaluation.privacy import MIN_CLASS_SIZE, roc_curve
from datarecon.experiments.execution import Execution
from datarecon.experiments.reconstruct import attacker_knowledge
from datarecon.experiments.references import (
    POOL_FILE,
    REFERENCE_WEIGHTS,
    REFERENCES_DIR,
    ReferenceJob,
    ReferencePool,
    ReferenceSettings,
    done_record,
    load_reference_model,
    load_statistics,
    reference_config,
    reference_seed,
    subset,
    train_references,
)
from datarecon.kernel.engine import track
from datarecon.kernel.files import DONE_MARKER, MEMBERSHIP_TARGET, METRICS_FILE, RUN_JSON
from datarecon.kernel.outdir import OutDir, is_empty
from datarecon.models.checkpoint import EXTRAS, model_identity, read_model_meta
from datarecon.models.pretrained import load_recorded_pretrained
from datarecon.models.spec import build_model, first_layer_init_std
from datarecon.report.figures import membership_roc_figure, save_figure
from datarecon.training.target import TrainConfig
from datarecon.utils.io import atomic_write_json, atomic_write_text, load_tensors, read_json, rows_to_csv, save_tensors

__all__ = ["Calibration", "MembershipSettings", "MembershipSetup", "OwnReferences", "Runtime", "SignalScores",
           "check_membership_folder", "compare_signals", "evaluate_membership", "membership_of_module",
           "prepare_membership", "references_needed", "score_images"]

#: the file of a membership folder that holds the result
RESULT_FILE = "membership.json"
#: the per-candidate scores, membership and split
SCORES_FILE = "scores.safetensors"
ROC_FIGURE = "roc.png"
SIGNALS_CSV = "signals.csv"
#: the format of the record of the model a membership folder measures (:data:`~datarecon.kernel.files.MEMBERSHIP_TARGET`)
TARGET_FORMAT = "datarecon-membership-target/1"


class MembershipSettings(BaseModel):
    """How a membership evaluation draws its images and which attacks it runs (one-to-one with the flags).

    Attributes:
        nonmembers: non-members drawn from the unused part of the model's training split (at least 1000 on the
            reported part resolve a TPR at 0.1% FPR)
        population: population samples for RMIA, drawn from the test split
        calibration_fraction: fraction of the members and of the non-members on which the strongest signal is chosen
            (the ROCs are reported on the rest)
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
    """The model as the attacker sees it, its subspace and its input normalisation.

    Attributes:
        target: the attacker's view (float64).
        analysis: :class:`~datarecon.attacks.subspace.SubspaceAnalysis` of the first dense layer, or None.
        mean: (C, H, W) display → model shift (model input = display − mean).
        meta: model.json.
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
        x = display.to(torch.float64) - self.mean.to(torch.float64)
        return subspace_scores(self.target.model, self.target.params, self.analysis, x).numpy()

    def inputs(self, display: torch.Tensor) -> torch.Tensor:
        """Display-space images as model inputs (float64)."""
        return display.to(torch.float64) - self.mean.to(torch.float64)


def prepare_membership(model_dir: str | Path, *, knowledge: KnowledgeSettings | None = None) -> MembershipSetup:
    """Load the model directory, resolve the attacker's knowledge and analyse the first dense layer.

    Raises:
        DataReconError: a bad model directory or known initialisation; a known n larger than the layer allows.
    """
    meta = read_model_meta(model_dir)
    target = Target.from_model_dir(model_dir, dtype=torch.float64)
    mean = load_tensors(Path(model_dir) / EXTRAS)["input_mean"].to(torch.float64)
    prior = AttackerPrior.balanced(m=1, num_outputs=target.num_outputs, input_shape=target.input_shape)
    prior, threat = attacker_knowledge(target, prior, knowledge or KnowledgeSettings(), model_meta=meta)
    return MembershipSetup(target=target, analysis=prior.subspace, mean=mean, meta=meta, threat=threat)


def _task(meta: dict[str, Any], data_dir: str | Path | None) -> Any:
    task = load_task(DataSpec.model_validate(meta["data"]), data_dir=data_dir)
    check_fingerprint(task, meta.get("data_fingerprint"), where="the model", splits=("train",))
    return task


# ---------------------------------------------------------------------------------------------
# the signals, and their comparison on one split


@dataclass(frozen=True)
class SignalScores:
    """Every signal's score of N candidates (higher = member), and the signals that do not apply.

    Attributes:
        scores: name → (N,) float64 numpy array.
        not_applicable: name → why (e.g. ``subspace`` on a CNN, the reference signals without references).
    """

    scores: dict[str, np.ndarray]
    not_applicable: dict[str, str]


def basic_signals(model: torch.nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, *,
                  loss: Any) -> tuple[ExampleStatistics, dict[str, np.ndarray]]:
    """The target's statistics on (x, y) in model input space, and the black-box and gradient-norm signals."""
    stats = example_statistics(model, x, y, loss=loss, params=params)
    grads = gradient_norms(model, params, x, y, loss=loss)
    return stats, {"loss": (-stats.loss).numpy(), "confidence": stats.confidence.numpy(),
                   "gradient-norm": (-grads).numpy()}


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
        return 0.0, ""
    sizes = [int(np.floor(fraction * int(n) + 1e-9)) for n in (is_member.sum(), (~is_member).sum())]
    if min(sizes) >= MIN_CLASS_SIZE:
        return fraction, ""
    return 0.0, (f"a calibration part of {sizes[0]} members and {sizes[1]} non-members would be too small to choose "
                 f"on: each class needs at least {MIN_CLASS_SIZE}")


def compare_signals(signals: SignalScores, is_member: np.ndarray, *, calibration: float, seed: int,
                    choice: Choice | None = None, progress: bool | str = False) -> dict[str, Any]:
    """Every signal's ROC on all members and non-members, and the strongest signal, chosen where its headline is not
    measured.

    Without ``choice`` the members and non-members are split (:func:`~datarecon.evaluation.membership.
    calibration_split`): the strongest signal is chosen on the calibration part and its headline ROC is measured
    on the rest only (the reported part). With ``choice`` (made on reference models, :func:`pseudo_target_choice`,
    which read none of the target's ground truth) its headline is measured on every candidate. The table of every
    signal is always measured on every candidate, the same ones for every signal.

    Args:
        signals: the scores.
        is_member: (N,) bool ground truth.
        calibration: the calibration fraction; seed: the split's seed.
        choice: a choice made without the target's ground truth, or None.
        progress: one step per signal (its bootstrap intervals take a while on thousands of candidates).

    Returns:
        JSON-ready: ``split`` (sizes of both parts), ``signals`` (name → ``kind``, ``doc``, ``applicable``,
        ``note``, ``report`` (ROC summary on every candidate), ``line``, ``chosen_on`` (AUC and TPR where the
        choice was made)), ``strongest`` (``name``, ``rule``, ``line`` and ``report``: its ROC on the reported
        part), ``baseline`` (the loss threshold), and the calibration mask under ``_calibration`` (removed before
        writing JSON).
    """
    mem = np.asarray(is_member, dtype=bool)
    fraction, too_small = _calibration_fraction(mem, 0.0 if choice is not None else calibration)
    split = calibration_split(mem, fraction=fraction, seed=seed)
    rep, cal = split.report, split.calibration
    out: dict[str, Any] = {}
    power: dict[str, SignalPower] = {} if choice is None else dict(choice.power)
    for name in track(SIGNALS.ordered(), desc="membership ROCs", unit="signal", mode=progress):
        entry = {"kind": SIGNALS.get(name).kind, "doc": SIGNALS.get(name).doc}
        if name not in signals.scores:
            out[name] = {**entry, "applicable": False, "note": signals.not_applicable.get(name, "not measured")}
            continue
        s = signals.scores[name]
        roc = membership_roc(s[mem], s[~mem], name=name)
        if choice is None and cal.any():
            power[name] = SignalPower.of(membership_roc(s[cal & mem], s[cal & ~mem], name=name, n_boot=0))
        p = power.get(name)
        out[name] = {**entry, "applicable": True, "note": "", "report": roc.summary(), "line": roc.line(),
                     "chosen_on": None if p is None else {"auc": p.auc, "tpr_at_1%_fpr": p.tpr}}
    if choice is not None:
        best, rule = choice.name, choice.rule
    elif power:
        best, rule = choose_strongest(power)
    else:
        best, rule = choose_strongest({k: SignalPower(float("nan"), None, 0, 0) for k in signals.scores})
        rule = f"the rule fixed in advance ({too_small})" if too_small else rule
    headline = None
    if best is not None:
        s = signals.scores[best]
        headline = membership_roc(s[rep & mem], s[rep & ~mem], name=best)
    return {"split": {"fraction": split.fraction, "seed": split.seed,
                      "calibration": {"members": int((cal & mem).sum()), "nonmembers": int((cal & ~mem).sum())},
                      "report": {"members": int((rep & mem).sum()), "nonmembers": int((rep & ~mem).sum())}},
            "signals": out,
            "strongest": {"name": best, "rule": rule, "line": headline.line() if headline else None,
                          "report": headline.summary() if headline else None},
            "baseline": {"name": "loss", "line": out["loss"].get("line")}, "_calibration": cal}


# ---------------------------------------------------------------------------------------------
# the model's own members against non-members it never saw


@dataclass(frozen=True)
class Candidates:
    """The members and non-members of an evaluation, and the population samples of RMIA.

    Attributes:
        x: (N, C, H, W) display images, members first; y: (N,) labels; classes: (N,) task-class index.
        is_member: (N,) bool.
        indices: (N,) int64 index of each image in its split (the training split for every candidate).
        z_x, z_y: (M, ...) population samples (test split), z_indices (M,).
        provenance: JSON-ready: where each set came from (sources, counts, what was available).
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: torch.Tensor
    is_member: np.ndarray
    indices: torch.Tensor
    z_x: torch.Tensor
    z_y: torch.Tensor
    z_indices: torch.Tensor
    provenance: dict[str, Any]


def _task_classes(y: torch.Tensor) -> torch.Tensor:
    return ((y > 0).to(torch.int64) if y.dtype.is_floating_point else y.to(torch.int64).clone())


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


def draw_candidates(meta: dict[str, Any], task: Any, settings: MembershipSettings, *,
                    data_dir: str | Path | None) -> Candidates:
    """The model's training images (members), ``settings.nonmembers`` images of the same classes from the unused
    part of its training split (non-members), and ``settings.population`` test-split images (RMIA's population).

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
    y = torch.cat([members.y, non.y])
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
    return Candidates(x=torch.cat([members.x, non.x]), y=y, classes=_task_classes(y),
                      is_member=np.r_[np.ones(len(members), bool), np.zeros(len(non), bool)],
                      indices=torch.cat([members.indices, non.indices]), z_x=pop.x, z_y=pop.y,
                      z_indices=pop.indices, provenance=prov)


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


def _fits(in_count: np.ndarray, models: int) -> bool:
    """Whether LiRA's and RMIA's per-candidate fits are possible: some candidate in two models, some outside two."""
    return bool((in_count >= 2).any()) and bool(((models - in_count) >= 2).any())


def references_needed(classes: torch.Tensor, per_class: int, *, seed: int, count: int) -> int | None:
    """The fewest reference models, ``count`` or more, whose training subsets (known before any is trained: they
    follow from the seed, :func:`~datarecon.experiments.references.subset`) let every reference signal be fitted,
    also with each of the first :data:`PSEUDO_TARGETS` left out as a pseudo-target; None beyond
    :data:`MAX_NEEDED_SEARCH`.

    Raises:
        DataReconError: a task class with fewer pool images than a model trains on.
    """
    n = int(classes.shape[0])
    first: list[np.ndarray] = []  # the models that play the target in turn (only these are left out)
    in_count = np.zeros(n, dtype=np.int64)
    for k in range(max(count, MAX_NEEDED_SEARCH)):
        row = np.zeros(n, dtype=np.int64)
        row[subset(classes, per_class, seed=seed, index=k)] = 1
        if k < PSEUDO_TARGETS:
            first.append(row)
        in_count += row
        models = k + 1
        if models < count or not _fits(in_count, models):
            continue
        if models < MIN_PSEUDO_REFERENCES or all(_fits(in_count - row, models - 1) for row in first):
            return models
    return None


def check_reference_count(cand: Candidates, meta: dict[str, Any], settings: MembershipSettings) -> None:
    """Refuse, before any reference model is trained, a count K too small for LiRA's and RMIA's fits, naming the
    number needed.

    Raises:
        DataReconError: K too small (with the fewest that suffice), or a class with too few candidates.
    """
    k = settings.references.count
    if not k:
        return
    per_class = int(meta["data"]["n_per_class"])
    needed = references_needed(cand.classes, per_class, seed=settings.references.seed, count=k)
    if needed == k:
        return
    fix = f"pass --references {needed} or more, or" if needed is not None else (
        f"even {MAX_NEEDED_SEARCH} would not do; pass")
    raise DataReconError(f"--references {k} is too few: LiRA and RMIA fit each candidate from the reference models "
                         f"that did and did not train on it (again with each of the first {PSEUDO_TARGETS} left out, to "
                         f"choose the strongest signal), which {k} models of {per_class} images per class from "
                         f"{cand.x.shape[0]} candidates cannot do; {fix} fewer --nonmembers (each candidate is then in "
                         "more of them)")


def _references(out: Path | None, meta: dict[str, Any], cand: Candidates, settings: MembershipSettings,
                runtime: Runtime) -> tuple[Any, dict[str, Any], PseudoTargets]:
    """Train (or reuse) the reference models on the candidate pool; their statistics, a record, and what a choice
    of the strongest signal on them needs."""
    k = settings.references.count
    if out is None:
        raise DataReconError(f"--references {k} needs --out DIR: the reference models are kept there (and reused "
                             "by the next call)")
    config = _training_config(meta)
    pool = ReferencePool(x=cand.x, y=cand.y, classes=cand.classes, z_x=cand.z_x, z_y=cand.z_y)
    key = pool.fingerprint()
    if (out / POOL_FILE).is_file():
        if ReferencePool.load(out / POOL_FILE).fingerprint() != key:
            raise DataReconError(f"{out} holds reference models of this model on another pool (other --nonmembers, "
                                 "--population or --draw-seed, or other data); pass the same draws again, choose "
                                 "another --out, or pass --overwrite to replace them")
    else:
        pool.save(out / POOL_FILE)
    per_class = int(meta["data"]["n_per_class"])
    refs = train_references(ReferenceJob(out=out, config=config, pool_key=key, settings=settings.references,
                                         per_class=per_class), execution=runtime.execution, device=runtime.device,
                            log=runtime.log, progress=runtime.progress)
    inside = refs.inside.to(torch.float64)
    record = {"count": refs.count, "trained": refs.trained, "reused": refs.count - refs.trained,
              "wall_time_s": refs.wall_time_s, "per_class": per_class, "pool": int(cand.x.shape[0]),
              "pool_fingerprint": key, "seed": settings.references.seed,
              "mean_models_per_candidate": float(inside.sum(0).mean()),
              "mean_models_per_nonmember": float(inside[:, ~torch.as_tensor(cand.is_member)].sum(0).mean()),
              "recipe": {f: getattr(config, f) if f != "arch" else config.arch.model_dump(mode="json") for f in
                         ("arch", "loss", "weight_decay", "optimizer", "lr", "momentum", "epochs", "schedule",
                          "batch_size", "dtype")},
              "note": (f"{refs.count} reference models trained with the model's recorded recipe on "
                       f"{per_class} images per class drawn from the {cand.x.shape[0]} candidates (members and "
                       f"non-members alike): each candidate is in {float(inside.sum(0).mean()):.1f} of them on "
                       "average; the offline signals use only the models that did not train on it")}
    keep = settings.references.keep_weights
    pseudo = PseudoTargets(refs=refs, attacks=settings.attacks, signals=(), pool_x=cand.x, pool_y=cand.y,
                           loss=config.loss, model_of=(lambda r: load_reference_model(out, r, config)) if keep else None)
    return refs, record, pseudo


def _signals(setup: MembershipSetup, cand: Candidates, settings: MembershipSettings, out: Path | None,
             runtime: Runtime) -> tuple[SignalScores, dict[str, Any] | None, PseudoTargets | None]:
    """Every applicable signal of the candidates, the reference models' record and what a choice on them needs
    (both None without reference models)."""
    target = setup.target
    dtype = torch.float64
    x = setup.inputs(cand.x).to(dtype)
    stats, scores = basic_signals(target.model, target.params, x, cand.y, loss=target.loss)
    missing: dict[str, str] = {}
    if setup.subspace_applies:
        scores["subspace"] = setup.scores(cand.x)
    else:
        missing["subspace"] = ("not applicable: the first dense layer reads the features of earlier layers, not the "
                               "images" if setup.analysis is not None else "not applicable: the model has no dense layer")
    record, pseudo = None, None
    if settings.references.count:
        refs, record, pseudo = _references(out, setup.meta, cand, settings, runtime)
        zstats = example_statistics(target.model, setup.inputs(cand.z_x).to(dtype), cand.z_y, loss=target.loss,
                                    params=target.params)
        scores.update({k: v.numpy() for k, v in reference_signals(stats, zstats.loss, refs, settings.attacks).items()})
    else:
        for name in SIGNALS.names():
            if SIGNALS.get(name).kind == "reference":
                missing[name] = "not run: no reference models (--references K)"
    return SignalScores(scores=scores, not_applicable=missing), record, pseudo


#: reference models taken in turn as pseudo-targets to choose the strongest signal
PSEUDO_TARGETS = 4


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
        model_of: ``r -> (model, input shift)`` of reference model r (for the gradient-norm and subspace
            signals); None: those signals do not compete.
        subspace_of: ``(model, params, x, r) -> scores``: the subspace signal of reference model r as the
            target's was made (its knowledge); None: it does not compete.
    """

    refs: Any
    attacks: MIASettings
    signals: tuple[str, ...]
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    loss: Any
    model_of: Callable[[int], tuple[torch.nn.Module, torch.Tensor]] | None = None
    subspace_of: Callable[..., np.ndarray] | None = None


def _pseudo_scores(p: PseudoTargets, r: int) -> dict[str, np.ndarray]:
    """Every competing signal with reference model ``r`` as the target and the others as its references."""
    refs = p.refs
    stats = ExampleStatistics(loss=refs.loss[r], probability=torch.exp(-refs.loss[r]), confidence=refs.confidence[r])
    scores = {"loss": (-refs.loss[r]).numpy(), "confidence": refs.confidence[r].numpy()}
    others = refs.select([k for k in range(refs.count) if k != r])
    scores.update({k: v.numpy() for k, v in reference_signals(stats, refs.population_loss[r], others,
                                                               p.attacks).items()})
    if p.model_of is not None and {"gradient-norm", "subspace"} & set(p.signals):
        model, shift = p.model_of(r)
        dtype = next(model.parameters()).dtype
        x = (p.pool_x - shift).to(dtype)
        params = {k: v.detach() for k, v in model.named_parameters()}
        scores["gradient-norm"] = (-gradient_norms(model, params, x, p.pool_y, loss=p.loss)).numpy()
        if p.subspace_of is not None and "subspace" in p.signals:
            scores["subspace"] = p.subspace_of(model, params, x, r)
    return {k: v for k, v in scores.items() if k in p.signals}


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
    every signal is measured on it, and the signal with the highest mean TPR at 1 % FPR wins (mean AUC breaks
    ties). Reads none of the target's ground truth.

    Returns:
        The :class:`Choice`, or None when the reference models are too few (fewer than 3) to play both parts
        (the caller then splits the target's candidates instead).
    """
    count = min(PSEUDO_TARGETS, p.refs.count)
    if p.refs.count < MIN_PSEUDO_REFERENCES:
        return None
    rocs: dict[str, list[Any]] = {}
    for r in track(range(count), desc="strongest signal", unit="pseudo-target", mode=progress):
        mem = p.refs.inside[r].numpy()
        for name, sc in _pseudo_scores(p, r).items():
            rocs.setdefault(name, []).append(membership_roc(sc[mem], sc[~mem], name=name, n_boot=0))
    power = {k: SignalPower.mean(v) for k, v in rocs.items()}
    left = [k for k in p.signals if k not in power]
    where = (f"{count} reference models as pseudo-targets (mean over them; the target's membership is not read"
             + (f"; {', '.join(left)} not measurable on them and not competing)" if left else ")"))
    best, rule = choose_strongest(power, where=where)
    return Choice(name=best, rule=rule, power=power)


def target_record(model_dir: str | Path) -> dict[str, Any]:
    """What a membership folder records of the model it measures: its path and content identity."""
    return {"format": TARGET_FORMAT, "model": str(Path(model_dir).resolve()), "identity": model_identity(model_dir)}


def check_membership_folder(out: str | Path, model_dir: str | Path) -> None:
    """Refuse a membership folder that measures another model, or does not say which: its result and its reference
    models (trained with that model's recipe on that model's candidates) are no reuse for this one, and a call into
    it would replace them. The one output rule of membership folders, whatever the number of reference models.

    Raises:
        DataReconError: the folder's model, what would be replaced, and the two ways on.
    """
    out = Path(out)
    if not out.is_dir() or is_empty(out):
        return
    mine = target_record(model_dir)
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
    kept = len(list((out / REFERENCES_DIR).glob("ref-*"))) if (out / REFERENCES_DIR).is_dir() else 0
    lost = "its result" + (f" and its {kept} reference models" if kept else "")
    raise DataReconError(f"--out {out} is the membership folder of {whose}; a call into it would replace {lost}: "
                         "choose another --out, or pass --overwrite to replace them")


def _ready(out: str | Path | OutDir | None, model_dir: str | Path) -> Path | None:
    """The output folder, prepared now (a claimed :class:`~datarecon.kernel.outdir.OutDir` is cleared and started only
    once every input has been accepted, so a refused call leaves no trace), with the record of its model written
    first. A folder of another model is refused (:func:`check_membership_folder`) unless it is being replaced."""
    if out is None:
        return None
    if isinstance(out, OutDir):
        if not out.clear:
            check_membership_folder(out.path, model_dir)
        path = out.prepare()
    else:
        path = Path(out)
        check_membership_folder(path, model_dir)
        path.mkdir(parents=True, exist_ok=True)
    if not (path / MEMBERSHIP_TARGET).is_file():
        atomic_write_json(path / MEMBERSHIP_TARGET, target_record(model_dir))
    return path


def evaluate_membership(model_dir: str | Path, *, settings: MembershipSettings = MembershipSettings(),
                        knowledge: KnowledgeSettings | None = None, out: str | Path | OutDir | None = None,
                        runtime: Runtime = Runtime()) -> dict[str, Any]:
    """Every membership signal on the model's training images against non-members it never saw (ground truth).

    Args:
        model_dir: the model directory.
        settings: how many non-members and population samples, the calibration split, the reference models.
        knowledge: the attacker's knowledge (known θ_init, n) for the subspace signal.
        out: a membership folder (the reference models, scores, table and figure go there): a path, or a
            claimed :class:`~datarecon.kernel.outdir.OutDir`, prepared once the model, the knowledge and the data
            have been accepted; None: nothing is written (and no reference models can be kept).
        runtime: where reference models train, the data folder, the progress sink.

    Returns:
        JSON-ready: ``model``, ``knowledge``, ``candidates`` (where members, non-members and population came
        from), ``split``, ``signals`` (every signal's reported and calibration ROC, or why it does not apply),
        ``strongest``, ``baseline``, ``references`` (None without), ``subspace``, ``wall_time_s``.

    Raises:
        DataReconError: a bad model directory or knowledge, missing data, no non-member left, references without ``out``.
    """
    t0 = time.perf_counter()
    setup = prepare_membership(model_dir, knowledge=knowledge)
    task = _task(setup.meta, runtime.data_dir)
    cand = draw_candidates(setup.meta, task, settings, data_dir=runtime.data_dir)
    if settings.references.count and out is None:
        raise DataReconError(f"--references {settings.references.count} needs --out DIR: the reference models are kept "
                             "there (and reused by the next call)")
    if settings.references.count:
        _training_config(setup.meta)  # a model that records no recipe: refused before the folder is written
    check_reference_count(cand, setup.meta, settings)
    outp = _ready(out, model_dir)
    signals, refs, pseudo = _signals(setup, cand, settings, outp, runtime)
    choice = None
    if pseudo is not None:
        sub = None
        if pseudo.model_of is not None and "subspace" in signals.scores:
            sub = _subspace_of_reference(_training_config(setup.meta), knowledge or KnowledgeSettings(),
                                         settings.references.seed)
        choice = pseudo_target_choice(dataclasses.replace(pseudo, signals=tuple(signals.scores), subspace_of=sub),
                                      progress=runtime.progress)
    cmp = compare_signals(signals, cand.is_member, calibration=settings.calibration_fraction, seed=settings.seed,
                          choice=choice, progress=runtime.progress)
    cal = cmp.pop("_calibration")
    threat = dict(setup.threat)
    if refs is not None:
        threat["summary"] = threat.get("summary", "") + "; the training recipe (for the reference models)"
    result = {"model": str(model_dir), "knowledge": threat, "settings": settings.model_dump(mode="json"),
              "candidates": cand.provenance, **cmp, "references": refs,
              "subspace": setup.analysis.summary() if setup.analysis is not None else None,
              "wall_time_s": time.perf_counter() - t0}
    if outp is not None:
        write_membership(outp, result, signals, cand, cal)
    return result


def _table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One CSV row per signal: kind, AUC with its interval, TPRs, calibration AUC, or why it does not apply."""
    rows = []
    for name, v in result["signals"].items():
        rep = v.get("report") or {}
        ci = rep.get("auc_ci") or [None, None]
        tpr = rep.get("tpr_at_fpr") or {}
        rows.append({"signal": name, "kind": v["kind"], "applicable": v["applicable"], "auc": rep.get("auc"),
                     "auc_ci_low": ci[0], "auc_ci_high": ci[1], "tpr_at_1%_fpr": tpr.get("0.01"),
                     "tpr_at_0.1%_fpr": tpr.get("0.001"),
                     "calibration_auc": (v.get("calibration") or {}).get("auc"),
                     "strongest": name == result["strongest"]["name"], "note": v.get("note", "")})
    return rows


def write_membership(out: Path, result: dict[str, Any], signals: SignalScores, cand: Candidates,
                     calibration: np.ndarray) -> None:
    """Write ``membership.json``, ``signals.csv``, ``scores.safetensors`` and the ROC figure into ``out``."""
    tensors = {f"score.{k}": torch.as_tensor(v) for k, v in signals.scores.items()}
    tensors.update({"is_member": torch.as_tensor(cand.is_member), "calibration": torch.as_tensor(calibration),
                    "indices": cand.indices, "population_indices": cand.z_indices})
    save_tensors(out / SCORES_FILE, tensors)
    atomic_write_text(out / SIGNALS_CSV, rows_to_csv(_table_rows(result)))
    labels = cand.is_member
    rocs = {}
    for name, s in signals.scores.items():
        fpr, tpr, _ = roc_curve(labels, s)
        rocs[name] = (fpr, tpr, result["signals"][name]["report"]["auc"])
    save_figure(membership_roc_figure(rocs, n_members=int(labels.sum()), n_nonmembers=int((~labels).sum()),
                                      strongest=result["strongest"]["name"]), out / ROC_FIGURE)
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
    """LiRA offline and RMIA offline of each set of images against the kept reference models (none of which
    trained on them: the images were not in the pool)."""
    config = _training_config(setup.meta)
    pool = ReferencePool.load(out / POOL_FILE)
    if any(done_record(out, k).get("pool") != pool.fingerprint() for k in kept):
        raise DataReconError(f"{out / POOL_FILE} is not the pool its reference models were trained on (changed or "
                             f"damaged); rerun the --evaluate call into {out} with --overwrite to train them again")
    stats = load_statistics(out, max(kept) + 1).select(kept)
    target = setup.target
    z = example_statistics(target.model, setup.inputs(pool.z_x), pool.z_y, loss=target.loss, params=target.params)
    models = [load_reference_model(out, k, config) for k in kept]
    results = []
    for s in sets:
        mine = example_statistics(target.model, setup.inputs(s.x), s.y, loss=target.loss, params=target.params)
        ref = [example_statistics(m, (s.x - mean).to(next(m.parameters()).dtype), s.y, loss=config.loss)
               for m, mean in models]
        conf = torch.stack([r.confidence for r in ref])
        loss = torch.stack([r.loss for r in ref])
        outside = torch.zeros_like(conf, dtype=torch.bool)
        results.append({
            "lira-offline": lira_offline(mine.confidence, conf, outside, variance_prior=attacks.variance_prior).numpy(),
            "rmia": rmia(-mine.loss, -loss, outside, -z.loss, -stats.population_loss, a=attacks.rmia_a,
                         gamma=attacks.rmia_gamma).numpy()})
    return results


def _image_signals(setup: MembershipSetup, sets: list[Labelled], out: Path | None,
                   attacks: MIASettings) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    """Every signal available for images nobody knows the membership of, for each set; and notes."""
    notes: list[str] = []
    target = setup.target
    results = []
    for s in sets:
        _, scores = basic_signals(target.model, target.params, setup.inputs(s.x), s.y, loss=target.loss)
        if setup.subspace_applies:
            scores["subspace"] = setup.scores(s.x)
        results.append(scores)
    kept = _kept_references(out)
    if kept:
        for scores, more in zip(results, _offline_reference_scores(setup, sets, out, kept, attacks)):  # type: ignore[arg-type]
            scores.update(more)
        notes.append(f"lira-offline and rmia use the {len(kept)} reference models kept in {out} (none trained on "
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
# a user's own nn.Module


@dataclass(frozen=True)
class _InMemoryReferences:
    """Reference statistics of models trained in memory (:func:`membership_of_module`)."""

    confidence: torch.Tensor
    loss: torch.Tensor
    inside: torch.Tensor
    population_loss: torch.Tensor
    models: tuple[torch.nn.Module, ...]

    @property
    def count(self) -> int:
        return int(self.inside.shape[0])

    def select(self, models: list[int]) -> _InMemoryReferences:
        idx = torch.as_tensor(models, dtype=torch.int64)
        return _InMemoryReferences(self.confidence[idx], self.loss[idx], self.inside[idx], self.population_loss[idx],
                                   tuple(self.models[i] for i in models))


def _train_in_memory(train: Callable[..., torch.nn.Module], pool: ReferencePool, *, members_y: torch.Tensor,
                     count: int, seed: int, loss: Any) -> _InMemoryReferences:
    """K models of ``train(x, y, seed)``, each on as many images of each class as the members hold, drawn from the pool."""
    classes = pool.classes
    per_class = {int(c): int((_task_classes(members_y) == c).sum()) for c in torch.unique(classes)}
    conf, losses, zloss, inside, models = [], [], [], [], []
    for k in range(count):
        gen = torch.Generator().manual_seed(reference_seed(seed, k, "subset"))
        pos = torch.cat([torch.nonzero(classes == c)[:, 0][torch.randperm(int((classes == c).sum()), generator=gen)[:m]]
                         for c, m in per_class.items()])
        model = train(pool.x[pos], pool.y[pos], reference_seed(seed, k, "init")).eval()
        st = example_statistics(model, pool.x, pool.y, loss=loss)
        conf.append(st.confidence)
        losses.append(st.loss)
        zloss.append(example_statistics(model, pool.z_x, pool.z_y, loss=loss).loss)
        mask = torch.zeros(pool.x.shape[0], dtype=torch.bool)
        mask[pos] = True
        inside.append(mask)
        models.append(model)
    return _InMemoryReferences(torch.stack(conf), torch.stack(losses), torch.stack(inside), torch.stack(zloss),
                               tuple(models))


@dataclass(frozen=True)
class OwnReferences:
    """Reference models of a user's own module, trained by the user's recipe.

    Attributes:
        train: ``train(x, y, seed) -> nn.Module``: trains a fresh model on (x, y) as the target was trained.
        count: how many (≥ 3 lets them choose the strongest signal as pseudo-targets).
        seed: seed of their subsets and of the seeds passed to ``train``.
    """

    train: Callable[..., torch.nn.Module]
    count: int
    seed: int = 0


def membership_of_module(model: torch.nn.Module, *, loss: Any, members: tuple[torch.Tensor, torch.Tensor],
                         nonmembers: tuple[torch.Tensor, torch.Tensor],
                         population: tuple[torch.Tensor, torch.Tensor] | None = None,
                         references: OwnReferences | None = None, calibration_fraction: float = 0.3,
                         attacks: MIASettings = MIASettings()) -> dict[str, Any]:
    """Every membership signal on a user's own ``nn.Module`` (bring your own model), from tensors.

    Args:
        model: the trained network (copied, eval mode); inputs in its own input space.
        loss: a ``LOSSES`` name or ``loss(outputs, labels) -> scalar``.
        members: (x, y) of examples it trained on; nonmembers: (x, y) of examples it did not (≥ 1000 resolve a TPR
            at 0.1 % FPR).
        population: (x, y) of further examples it did not train on, never a candidate (RMIA's z); None: the RMIA
            signals are not measured.
        references: your training recipe and how many reference models to train with it on subsets of
            members ∪ nonmembers (as many images of each class as ``members`` holds); None: no reference signals.
        calibration_fraction: the calibration part (seed 0) when the strongest signal is not chosen on reference
            models.
        attacks: the reference attacks' settings.

    Returns:
        JSON-ready, as :func:`evaluate_membership`: ``signals``, ``split``, ``strongest``, ``baseline``,
        ``references``.

    Raises:
        DataReconError: empty or mismatched inputs.
    """
    (xm, ym), (xn, yn) = members, nonmembers
    if xm.shape[0] == 0 or xn.shape[0] == 0 or xm.shape[0] != ym.shape[0] or xn.shape[0] != yn.shape[0]:
        raise DataReconError("pass members and non-members as (x, y) with one label per example, neither empty")
    net = copy.deepcopy(model).eval()
    params = {k: v.detach() for k, v in net.named_parameters()}
    x, y = torch.cat([xm, xn]), torch.cat([ym, yn])
    is_member = np.r_[np.ones(xm.shape[0], bool), np.zeros(xn.shape[0], bool)]
    stats, scores = basic_signals(net, params, x, y, loss=loss)
    missing = {"subspace": "not measured for a module (use a model directory, or attacks.subspace directly)"}
    choice, record = None, None
    if references is not None and population is None:
        missing.update({k: "not measured: pass population=(x, y) for RMIA" for k in ("rmia", "rmia-online")})
    if references is not None and references.count:
        zx, zy = population if population is not None else (xn[:1], yn[:1])
        pool = ReferencePool(x=x, y=y, classes=_task_classes(y), z_x=zx, z_y=zy)
        refs = _train_in_memory(references.train, pool, members_y=ym, count=references.count, seed=references.seed,
                                loss=loss)
        zl = example_statistics(net, zx, zy, loss=loss, params=params).loss
        ref_scores = reference_signals(stats, zl, refs, attacks)
        scores.update({k: v.numpy() for k, v in ref_scores.items() if k not in missing})
        pseudo = PseudoTargets(refs=refs, attacks=attacks, signals=tuple(scores), pool_x=x, pool_y=y, loss=loss,
                               model_of=lambda r: (refs.models[r], torch.zeros(())))
        choice = pseudo_target_choice(pseudo) if population is not None else None
        record = {"count": references.count, "mean_models_per_candidate": float(refs.inside.double().sum(0).mean())}
    else:
        missing.update({k: "not run: no reference models (references=OwnReferences(train, K))" for k in SIGNALS.names()
                        if SIGNALS.get(k).kind == "reference"})
    cmp = compare_signals(SignalScores(scores, missing), is_member, calibration=calibration_fraction, seed=0,
                          choice=choice)
    cmp.pop("_calibration")
    return {**cmp, "references": record}


# ---------------------------------------------------------------------------------------------
# the membership section of a run's evaluation (the report's membership card)


def membership_section(result: dict[str, Any]) -> dict[str, Any]:
    """The compact membership record a run's ``metrics.json`` keeps for its report: the strongest signal, the
    loss baseline, every signal's AUC and TPRs (or why not), where the non-members came from, the split."""
    signals = {}
    for name, v in result["signals"].items():
        rep = v.get("report") or {}
        signals[name] = {"kind": v["kind"], "applicable": v["applicable"], "note": v.get("note", ""),
                         "auc": rep.get("auc"), "auc_ci": rep.get("auc_ci"), "tpr_at_fpr": rep.get("tpr_at_fpr"),
                         "n_members": rep.get("n_members"), "n_nonmembers": rep.get("n_nonmembers")}
    return {"strongest": result["strongest"], "baseline": result["baseline"], "signals": signals,
            "candidates": result["candidates"], "split": result["split"], "references": result.get("references"),
            "knowledge": (result.get("knowledge") or {}).get("summary")}


def attach_membership(run_dir: str | Path, *, data_dir: str | Path | None = None,
                      settings: MembershipSettings = MembershipSettings()) -> dict[str, Any] | None:
    """Measure the membership signals of the model a run attacked and add them to the run's ``metrics.json``.

    Runs of a model directory only (a user's own model has no data spec to draw non-members from); reference
    models are not trained here (``datarecon membership --references K`` does that).

    Returns:
        The section written (:func:`membership_section`), or None for a run without a model directory.

    Raises:
        DataReconError: an unevaluated run, missing data.
    """
    run_dir = Path(run_dir)
    model_dir = read_json(run_dir / RUN_JSON).get("model_dir")
    if not model_dir:
        return None
    metrics = read_json(run_dir / METRICS_FILE)
    result = evaluate_membership(model_dir, settings=settings.model_copy(update={"references": ReferenceSettings()}),
                                 runtime=Runtime(data_dir=data_dir, log=lambda _: None))
    metrics["membership"] = membership_section(result)
    atomic_write_json(run_dir / METRICS_FILE, metrics)
    return metrics["membership"]
