"""Building blocks shared by the paper reproductions: target training, attack runs,
evaluation and figure pieces (each a :class:`~datarecon.experiments.pipeline.pieces.Piece`).

The attack pieces respect the threat model: an attack sees a :class:`~datarecon.attacks.base.Target`
(θ*, architecture, loss, weight decay) and an :class:`~datarecon.attacks.base.AttackerPrior`
(labels, input shape, pixel box). Training images reach an attack only through an
initialisation the experiment explicitly chooses (ground truth / partition / mixture,
Runkel et al. 2024 §4.3, §4.5); the ground truth otherwise enters only the evaluation pieces.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.batched import resolve_mode
from datarecon.attacks.init import INITS, InitSources
from datarecon.config import MAX_SEED, MAX_STEPS
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.errors import DataReconError
from datarecon.evaluation import EvaluationConfig, RunRecord, evaluation_against, noise_images
from datarecon.evaluation.run_eval import init_name_of, read_init
from datarecon.experiments.reconstruct import RunOptions, build_run, execute, execute_batch, prepare
from datarecon.experiments.pipeline.pieces import Context, Piece
from datarecon.kernel.status import EVALUABLE, Status
from datarecon.kernel.files import CANDIDATES, CANDIDATES_CSV, METRICS_FILE, RUN_JSON
from datarecon.kernel.losses import margins as out_margins
from datarecon.models.checkpoint import load_model_dir
from datarecon.training.target import (ArchConfig, MarginAscentConfig, StopConfig, TargetMeasures, TrainConfig,
                                      train_target)
from datarecon.utils.io import atomic_write_json, load_tensors, read_json, save_tensors, write_csv

RUN_SUBDIR = "run"


#: a reproduction's training writes this many history rows and checkpoints over its epochs; an attack
#: run this many checkpoints over its steps, at least MIN_CHECKPOINT_PERIOD steps apart
HISTORY_ROWS, TRAIN_CHECKPOINTS, ATTACK_CHECKPOINTS, MIN_CHECKPOINT_PERIOD = 50, 20, 10, 10


class TargetTraining(BaseModel):
    """How one target is trained (the data spec is shared and added by the reproduction).

    Maps onto :class:`datarecon.training.target.TrainConfig` (same field meanings).
    ``kkt_score`` records the KKT-regime score (``datarecon.training.kkt_regime_score``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    arch: ArchConfig
    loss: str = "logistic"
    weight_decay: float = Field(default=0.0, ge=0)
    optimizer: str = "gd"
    lr: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    epochs: int = Field(default=1000, ge=1, le=MAX_STEPS)
    schedule: str = "constant"
    max_lr_factor: float | None = Field(default=1e6, ge=1)
    margin_ascent: MarginAscentConfig = MarginAscentConfig()
    stop: StopConfig = StopConfig()
    dtype: Literal["float32", "float64"] = "float64"
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    kkt_score: bool = False

    def train_config(self, data: Mapping[str, Any], *, device: str) -> TrainConfig:
        """The full :class:`TrainConfig` for ``data`` (a DataSpec mapping): 50 history rows and a checkpoint
        every 5% of the epochs, so a killed reproduction run with ``--resume`` loses at most that much."""
        fields = self.model_dump(mode="json", exclude={"kkt_score"})
        return TrainConfig.model_validate({**fields, "data": dict(data), "device": device,
                                           "log_every": max(1, self.epochs // HISTORY_ROWS),
                                           "checkpoint_every": max(1, self.epochs // TRAIN_CHECKPOINTS)})


class EvalSettings(BaseModel):
    """Evaluation settings (``datarecon.evaluation.evaluation_against``).

    Attributes:
        window: SSIM window ("gaussian" = 11x11 σ 1.5, scikit-image conventions); it changes values.
        metric: primary nearest-neighbour metric ("ssim": "structurally most similar").
        n_floor_noise: uniform-noise images for the real/fake floor of the privacy measurement.
        grid_max: candidates kept for the figures' grids.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: str = "gaussian"
    metric: str = "ssim"
    n_floor_noise: int = Field(default=1000, ge=0)
    grid_max: int = Field(default=40, ge=1)


# ---------------------------------------------------------------------------------------------
# training


#: bilevel run-record distances carried into metrics summaries (see ``BilevelAttack.finish``).
#: Version of the headline rule in evaluation pieces' specs: a change re-evaluates existing folders.
HEADLINE_VERSION = 2
PARAM_DISTANCE_KEYS = ("param_distance", "param_distance_per_parameter", "param_distance_x0",
                       "param_distance_x0_per_parameter")


#: column order of the reference sets in tables (others follow, sorted)
SET_ORDER = ("train", "partition", "heldout", "noise")


def ordered_items(d: Mapping[str, Any], first: Sequence[str] = SET_ORDER) -> list[tuple[str, Any]]:
    """``d``'s items with the keys of ``first`` in that order, then the rest sorted: tables get the
    same columns whether a summary came from memory or from a marker (JSON, sorted keys)."""
    head = [(k, d[k]) for k in first if k in d]
    return head + sorted((k, v) for k, v in d.items() if k not in first)


def by_fpr(tpr: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """TPR-at-FPR items, largest FPR first (1 %, then 0.1 %)."""
    return sorted(tpr.items(), key=lambda kv: -float(kv[0]))


def train_piece(key: str, training: TargetTraining, data: Mapping[str, Any], *,
                estimate: Callable[[str], float | None] | None = None) -> Piece:
    """Train a target into ``OUT/<key>/`` (a model directory, ``datarecon.models.checkpoint``); with
    ``ctx.resume`` an unfinished training continues from its checkpoint.

    Args:
        estimate: ``estimate(device) -> seconds`` for ``--dry-run`` (:mod:`.cost`); None: no estimate.
    """

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        cfg = training.train_config(data, device=ctx.device)
        res = train_target(cfg, data_dir=ctx.data_dir, out=d / "model", resume=ctx.resume, overwrite=not ctx.resume,
                           progress=ctx.progress, measures=TargetMeasures(kkt_score=training.kkt_score), nested=True)
        return {"metrics": res.metrics, "model_dir": "model", "config_hash": cfg.hash()}

    return Piece(key=key, run=run, spec={"training": training.model_dump(mode="json"), "data": dict(data)},
                 kind="train", estimate=estimate)


def checkpoint_period(steps: int) -> int:
    """Steps between an attack run's checkpoints in a reproduction: a tenth of its steps (at least 10),
    so a killed run continued with ``--resume`` loses at most that (the cost of a checkpoint:
    docs/PERFORMANCE.md §6.2)."""
    return max(MIN_CHECKPOINT_PERIOD, steps // ATTACK_CHECKPOINTS)


def model_dir(ctx: Context, key: str) -> Path:
    """The model directory of piece ``key``: the one :func:`train_piece` wrote in its folder, or the existing model
    directory a piece names by its absolute path (``audit --model DIR``)."""
    named = (ctx.summaries.get(key) or {}).get("model_dir")
    if isinstance(named, str) and Path(named).is_absolute():
        return Path(named)
    return ctx.dir(key) / "model"


# ---------------------------------------------------------------------------------------------
# candidate sources (experimenter side)


def paired_sources(train_x: torch.Tensor, train_y: torch.Tensor, part_x: torch.Tensor, part_y: torch.Tensor,
                   m: int):
    """Training and partition images for m candidates, paired by label.

    Candidate i starts from training image ``i mod n`` and from the next unused partition image
    with the same label, so mixtures λ₁x_GT + (1 − λ₁)x_part never mix classes.

    Returns:
        ``(InitSources, labels)`` with exactly m images per source (model input space) and the
        (m,) labels of the candidates.

    Raises:
        DataReconError: too few partition images of some class.
    """
    n = train_x.shape[0]
    gidx = torch.arange(m) % n
    labels = train_y[gidx]
    used: dict[float, list[int]] = {}
    for c in torch.unique(part_y).tolist():
        used[c] = torch.nonzero(part_y == c).view(-1).tolist()
    pidx = []
    for y in labels.tolist():
        pool = used.get(y, [])
        if not pool:
            raise DataReconError(
                f"not enough partition images of label {y:g} for {m} candidates; raise n_partition_per_class"
            )
        pidx.append(pool.pop(0))
    pidx_t = torch.tensor(pidx, dtype=torch.int64)
    src = InitSources(ground_truth=train_x[gidx], ground_truth_labels=labels,
                      partition=part_x[pidx_t], partition_labels=part_y[pidx_t])
    return src, labels


def load_model_and_task(path: Path, *, data_dir, dtype: torch.dtype = torch.float64, device: str = "cpu"):
    """(bundle, task, normalisation) of a model directory (experimenter / evaluation side)."""
    bundle = load_model_dir(path, device=device, dtype=dtype)
    task = load_task(DataSpec.model_validate(bundle.data), data_dir=data_dir)
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    return bundle, task, norm


# ---------------------------------------------------------------------------------------------
# attacks


def _typed_run(ctx: Context, *, model_key: str, method: str, config: BaseModel, init: Mapping[str, Any],
               candidates_factor: int, seed: int, every: int) -> tuple[Any, int, Any]:
    """(ReconstructionRun, m, sources) of one attack run on the target of ``model_key``: the
    experimenter side picks n and, for data inits only, the images, paired by label so mixtures never
    mix classes; the attacker side (target, prior, x0) is :func:`~datarecon.experiments.reconstruct.prepare`'s."""
    mdir = model_dir(ctx, model_key)
    _, task, norm = load_model_and_task(mdir, data_dir=ctx.data_dir)
    m = candidates_factor * len(task.train)
    sources = None
    if INITS.get(init["name"]).data:
        sources, _ = paired_sources(norm.to_model(task.train.x).double(), task.train.y,
                                    norm.to_model(task.partition.x).double(), task.partition.y, m)
    spec = build_run({"model": str(mdir), "attack": {"method": method, **config.model_dump()}, "init": dict(init),
                      "candidates": m, "seed": seed, "device": str(ctx.device), "checkpoint": {"every": every}})
    return spec, m, sources


def _run_summary(rec: Any, x0: torch.Tensor, run_dir: Path, m: int) -> dict[str, Any]:
    """The marker summary of one finished attack run (status, selection values, distances)."""
    meta = read_json(run_dir / RUN_JSON)
    return {"status": rec.status, "steps_done": rec.steps_done, "m": m,
            "wall_time_s": meta.get("wall_time_s"), "final": _scalars(meta.get("final", {})),
            "selection": {k: (v.get("value") if isinstance(v, dict) else v)
                          for k, v in (meta.get("selection") or {}).items()},
            "selection_direction": {k: v.get("better") for k, v in (meta.get("selection") or {}).items()
                                    if isinstance(v, dict)},
            "param_distance": (meta.get("extra") or {}).get("param_distance"),
            "init_shift": float((rec.x.cpu().double() - x0.cpu().double()).flatten(1).norm(dim=1).mean())}


def attack_piece(key: str, *, model_key: str, method: str, attack: BatchRun, candidates_factor: int = 1,
                 estimate: Callable[[str], float | None] | None = None) -> Piece:
    """Run one attack on the target of ``model_key``; the run directory is ``OUT/<key>/run``.

    The piece builds a :class:`~datarecon.experiments.reconstruct.ReconstructionRun` and runs it
    with :func:`~datarecon.experiments.reconstruct.execute`, like every other run.

    Args:
        method: the attack's registry name (``kkt``, ``decoreco``, ``gradnorm``, ``bilevel``).
        attack: the run (:class:`BatchRun`): the attack's frozen config (steps included); the
            initialisation ``{"name": INITS key, **params}`` (``datarecon.attacks.init.make_init``);
            the seed of the generator for x₀ and the attack's own randomness; extra fields for
            run.json (e.g. the mixture weights of a landscape point).
        candidates_factor: m = factor × n (n = training-set size, which the attacker knows).
        estimate: ``estimate(device) -> seconds`` for ``--dry-run`` (:mod:`.cost`); None: no estimate.
    """
    attack_config, init, seed, record = attack.config, attack.init, attack.seed, attack.record

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        steps = int(getattr(attack_config, "steps", 100))
        spec, m, sources = _typed_run(ctx, model_key=model_key, method=method, config=attack_config, init=init,
                                      candidates_factor=candidates_factor, seed=seed, every=checkpoint_period(steps))
        setup = prepare(spec, data_dir=ctx.data_dir, sources=sources)
        rec = execute(spec, d / RUN_SUBDIR, RunOptions(resume=ctx.resume, overwrite=not ctx.resume, progress=ctx.progress, nested=True),
                      setup=setup, record=record)
        x0 = setup.x0
        save_tensors(d / "x0.safetensors", {"x0": x0.detach().cpu()})
        selection = rec.summary.get("selection") or {}
        return {"status": rec.status, "steps_done": rec.steps_done, "m": m,
                "wall_time_s": rec.summary.get("wall_time_s"), "final": _scalars(rec.summary.get("final", {})),
                "selection": {k: (v.get("value") if isinstance(v, dict) else v) for k, v in selection.items()},
                "selection_direction": {k: v.get("better") for k, v in selection.items() if isinstance(v, dict)},
                "param_distance": (rec.summary.get("extra") or {}).get("param_distance"),
                "init_shift": float((rec.x.cpu().double() - x0.cpu().double()).flatten(1).norm(dim=1).mean())}

    spec = {"attack": type(attack_config).__name__, "config": attack_config.model_dump(mode="json"),
            "init": dict(init), "factor": candidates_factor, "seed": seed, "record": dict(record or {})}
    return Piece(key=key, run=run, spec=spec, deps=(model_key,), kind="attack", estimate=estimate)


@dataclass(frozen=True)
class BatchRun:
    """One run of an :func:`attack_batch_piece`: its own config, initialisation, seed and record."""

    config: BaseModel
    init: Mapping[str, Any]
    seed: int = 0
    record: Mapping[str, Any] = field(default_factory=dict)


#: How the runs of a reproduction that share a target are executed: ``separate`` (one piece per run),
#: or one piece stepping them together with :func:`datarecon.attacks.batched.run_batched` in its
#: ``batched`` or ``looped`` mode, or ``auto``: the mode :data:`datarecon.attacks.batched.AUTO_MODE` names for the device.
RUN_GROUPING = ("separate", "auto", "batched", "looped")
RunGrouping = Literal["separate", "auto", "batched", "looped"]
def attack_batch_piece(key: str, *, model_key: str, method: str,
                       runs: Mapping[str, BatchRun], candidates_factor: int = 1, mode: str = "batched",
                       estimate: Callable[[str], float | None] | None = None) -> Piece:
    """Run several attacks on the target of ``model_key`` as one batch (:func:`~datarecon.attacks.batched.run_batched`).

    Run ``name`` is written exactly as :func:`attack_piece` writes a run, under ``OUT/<key>/<name>/``
    (``run/`` and ``x0.safetensors``); the piece's summary holds each run's summary under
    ``runs[name]``. With ``ctx.resume`` every run continues from its own checkpoint.

    Args:
        runs: name → :class:`BatchRun` (name: a folder name).
        method, candidates_factor, estimate: as in :func:`attack_piece` (estimate for the batch).
        mode: ``batched``, ``looped`` (:data:`datarecon.attacks.batched.MODES`) or ``auto``
            (:func:`datarecon.attacks.batched.resolve_mode` on the piece's device).
    """

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        dtypes = {getattr(r.config, "dtype", "float64") for r in runs.values()}
        if len(dtypes) != 1:
            raise DataReconError(f"the runs of batch {key} use several dtypes {sorted(dtypes)}; a batch shares "
                                 "one target, so give them one dtype")
        steps = max(getattr(r.config, "steps", 100) for r in runs.values())
        specs, setups, ms = [], [], []
        for r in runs.values():
            spec, m, sources = _typed_run(ctx, model_key=model_key, method=method, config=r.config, init=r.init,
                                          candidates_factor=candidates_factor, seed=r.seed, every=checkpoint_period(steps))
            specs.append(spec)
            setups.append(prepare(spec, data_dir=ctx.data_dir, sources=sources))
            ms.append(m)
        setups = [replace(s, record={**s.record, **r.record}) for s, r in zip(setups, runs.values(), strict=True)]
        recs = execute_batch(specs, [d / name / RUN_SUBDIR for name in runs],
                             RunOptions(resume=ctx.resume, progress=ctx.progress, nested=True), setups=setups,
                             mode=resolve_mode(mode, ctx.device))
        out: dict[str, Any] = {}
        for name, setup, m, rec in zip(runs, setups, ms, recs, strict=True):
            save_tensors(d / name / "x0.safetensors", {"x0": setup.x0.detach().cpu()})
            out[name] = _run_summary(rec, setup.x0, d / name / RUN_SUBDIR, m)
        return {"runs": out, "mode": resolve_mode(mode, ctx.device)}

    spec = {"attack": sorted({type(r.config).__name__ for r in runs.values()}), "factor": candidates_factor,
            "mode": mode, "runs": {n: {"config": r.config.model_dump(mode="json"), "init": dict(r.init), "seed": r.seed,
                                       "record": dict(r.record)} for n, r in runs.items()}}
    return Piece(key=key, run=run, spec=spec, deps=(model_key,), kind="attack", estimate=estimate)


def run_dir(ctx: Context, key: str, member: str | None = None) -> Path:
    """The run directory of attack piece ``key`` (of its run ``member`` for an :func:`attack_batch_piece`)."""
    return ctx.dir(key) / (member or "") / RUN_SUBDIR


def run_summary(ctx: Context, key: str, member: str | None = None) -> dict[str, Any]:
    """The summary of attack piece ``key`` (of its run ``member`` for an :func:`attack_batch_piece`)."""
    s = ctx.summary(key)
    return s["runs"][member] if member is not None else s


def _scalars(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool)) or v is None}


# ---------------------------------------------------------------------------------------------
# evaluation


def evaluate_display(display: torch.Tensor, record, *, bundle, task, norm, settings: EvalSettings,
                     light: bool, seed: int = 0):
    """:func:`~datarecon.evaluation.evaluation_against` with the train / partition / held-out / noise sets of ``task``.

    ``record`` (a :class:`~datarecon.evaluation.RunRecord`): the attack's per-candidate labels,
    scores and λ, and where the candidates started (``init`` in display space and ``init_name``: the
    headline rule of data starts); the training margins are added here. ``light`` skips the null
    baselines and the noise floor (landscape points).
    """
    refs = {"train": task.train.x, "partition": task.partition.x, "heldout": task.heldout.x,
            "noise": noise_images(len(task.train), task.input_shape, generator=torch.Generator().manual_seed(seed))}
    with torch.no_grad():
        xm = norm.to_model(task.train.x).to(next(bundle.model.parameters()).dtype)
        train_margins = out_margins(bundle.model(xm), task.train.y.to(xm.dtype) if task.train.y.is_floating_point()
                                    else task.train.y).double()
    config = EvaluationConfig(metric=settings.metric, window=settings.window, baselines=not light,
                              real_floor=None if light else "noise", n_floor_noise=settings.n_floor_noise,
                              baseline_seed=seed)
    return evaluation_against(display, references=refs, record=replace(record, margins=train_margins),
                               config=config, progress=False)


def save_grid(path: Path, ev, display: torch.Tensor, task, *, order: torch.Tensor, metric: str) -> None:
    """Candidates (display, clamped) in ``order`` with their nearest train / partition images."""
    out: dict[str, torch.Tensor] = {"order": order, "candidates": display.clamp(0, 1)[order].float(),
                                    "n_candidates": torch.tensor([display.shape[0]], dtype=torch.int64)}
    for name in ("train", "partition"):
        nb = ev.neighbours.get((name, metric))
        if nb is not None:
            out[f"{name}_index"] = nb.index[order]
            out[f"{name}_score"] = nb.score[order].float()
            out[name] = getattr(task, name).x[nb.index[order]].float()
    save_tensors(path, out, metadata={"metric": metric})


def evaluate_piece(key: str, *, model_key: str, run_key: str, settings: EvalSettings, light: bool = False,
                   score_name: str = "margin", member: str | None = None) -> Piece:
    """Evaluate the run of ``run_key`` (its run ``member`` when ``run_key`` is an :func:`attack_batch_piece`):
    ``metrics.json``, ``candidates.csv`` and the figure grids.

    Grids (``grid-<order>.safetensors``: the first ``grid_max`` candidates with their nearest
    training / partition images) in three orders: ``candidate`` (the paper's "first
    reconstructions"), ``train-similarity`` (best matches first) and ``score`` (the attacker-side
    score ``score_name``, highest first; what an adversary without data would look at).
    """

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        bundle, task, norm = load_model_and_task(model_dir(ctx, model_key), data_dir=ctx.data_dir)
        rdir = run_dir(ctx, run_key, member)
        t = load_tensors(rdir / CANDIDATES)
        meta = read_json(rdir / RUN_JSON)
        x = t["x"].double()
        nonfinite = int((~torch.isfinite(x)).flatten(1).any(dim=1).sum())
        # a diverged run keeps its last finite state, which may still be huge; keep it finite for float32
        display = norm.to_display(torch.nan_to_num(x, nan=0.0).clamp(-1e6, 1e6)).float()
        scores = {k[6:]: v.reshape(-1) for k, v in t.items() if k.startswith("score_")}
        x0 = run_init(rdir, m=x.shape[0])
        ev = evaluate_display(display, RunRecord(labels=t.get("labels"), scores=scores, multipliers=t.get("multipliers"),
                                                 init=None if x0 is None else norm.to_display(x0.double()).float(),
                                                 init_name=init_name_of(meta)),
                              bundle=bundle, task=task, norm=norm, settings=settings, light=light)
        summary = dict(ev.summary)
        for k in PARAM_DISTANCE_KEYS:
            summary[k] = (meta.get("extra") or {}).get(k)
        summary["nonfinite_candidates"] = nonfinite
        summary["run"] = {"method": meta.get("method"), "status": meta.get("status"),
                          "steps_done": meta.get("steps_done"), "init": meta.get("init")}
        atomic_write_json(d / METRICS_FILE, summary)
        write_csv(d / CANDIDATES_CSV, ev.rows)
        m = display.shape[0]
        nb = ev.neighbours[("train", settings.metric)]
        s = nb.score.double()
        orders = {"candidate": torch.arange(m),
                  "train-similarity": torch.sort(-s if nb.higher_is_better else s, stable=True).indices}
        if score_name in scores:
            orders["score"] = torch.sort(-scores[score_name].double(), stable=True).indices
        for name, order in orders.items():
            save_grid(d / f"grid-{name}.safetensors", ev, display, task, order=order[: settings.grid_max],
                      metric=settings.metric)
        return compact_summary(summary)

    spec = {"settings": settings.model_dump(mode="json"), "light": light, "score": score_name,
            "headline": HEADLINE_VERSION}
    if member is not None:  # absent otherwise: the hashes of existing evaluation pieces stay as they were
        spec["member"] = member
    return Piece(key=key, run=run, spec=spec,
                 deps=(model_key, run_key), kind="evaluate")


def run_init(run_dir: Path, *, m: int) -> torch.Tensor | None:
    """Where a data-initialised run started (model input space): its ``init.safetensors``, or the
    ``x0.safetensors`` that attack pieces of earlier versions wrote beside ``run/``; None for a random start."""
    x0 = read_init(run_dir, m=m)
    legacy = run_dir.parent / "x0.safetensors"
    init = read_json(run_dir / RUN_JSON).get("init")
    if x0 is None and legacy.is_file() and isinstance(init, Mapping) and init.get("experimenter_choice"):
        x0 = load_tensors(legacy).get("x0")
    return x0


def compact_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers later pieces need from a metrics summary (small enough for a marker)."""
    out: dict[str, Any] = {k: summary.get(k) for k in PARAM_DISTANCE_KEYS}
    head = summary.get("headline") or {}
    out["headline"] = {k: head.get(k) for k in ("rule", "threshold", "count", "heldout", "noise", "retention", "notes",
                                                 "n_train", "n_candidates", "n_heldout_candidates")}
    cal = head.get("calibrated") or {}
    out["headline"].update(null_threshold=cal.get("null_threshold"), excluded=cal.get("excluded"),
                           paper=head.get("paper"))
    out["init"] = summary.get("init")
    out["mean_haim_ssim"] = (summary.get("haim") or {}).get("mean_ssim")
    out |= {"mean_l2_to_nearest": summary.get("mean_l2_to_nearest"),
            "n_candidates": summary.get("n_candidates")}
    nearest = summary.get("nearest") or {}
    out["mean_ssim_to_nearest"] = {k: (v.get("ssim") or {}).get("mean") for k, v in nearest.items()}
    priv = summary.get("privacy") or {}
    out["privacy"] = {"n_real": priv.get("n_real"), "n_fake": priv.get("n_fake"), "floor": priv.get("floor"),
                      "min_class_size": priv.get("min_class_size"), "fprs": priv.get("fprs"),
                      "n_real_distinct_train": priv.get("n_real_distinct_train"),
                      "scores": priv.get("scores", {})}
    haim = summary.get("haim") or {}
    out["haim_counts"] = haim.get("counts")
    return out


def finite(v: Any) -> float:
    """``v`` as float, NaN when missing or not a number."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f if math.isfinite(f) else float("nan")


class KKTRunSpec(BaseModel):
    """One attack run: x₀ scale and the hyper-parameters that differ between runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    init_scale: float = Field(gt=0)
    lr_x: float = Field(gt=0)
    lambda_min: float = Field(ge=0)
    alpha: float = Field(gt=0)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


def _ref_name(ref: tuple[str, str | None]) -> str:
    return f"{ref[0]}/{ref[1]}" if ref[1] is not None else ref[0]


def pool_piece(key: str, refs: list[tuple[str, str | None]], *, keep: int, criterion: str) -> Piece:
    """Rank runs by an attacker-side criterion, pool the candidates of the best ``keep``.

    ``refs``: (attack piece key, run name in a batch piece or None) of every run; a run is named
    ``<piece key>/<run name>`` (``runs/cifar10/run0`` in either layout). The direction (lower /
    higher is better) comes from the runs' own selection record.
    """
    names = {_ref_name(r): r for r in refs}

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        ranked = []
        direction = "lower"
        for k, ref in names.items():
            s = run_summary(ctx, *ref)
            direction = (s.get("selection_direction") or {}).get(criterion, direction)
            lower = direction != "higher"
            v = finite((s.get("selection") or {}).get(criterion))
            ok = s.get("status") in EVALUABLE and v == v
            ranked.append((0 if ok else 1, (v if lower else -v) if ok else 0.0, k, v))
        ranked.sort()
        chosen = [k for _, _, k, _ in ranked[:keep]]
        parts = [load_tensors(run_dir(ctx, *names[k]) / CANDIDATES) for k in chosen]
        common = set.intersection(*(set(p) for p in parts))
        pooled = {name: torch.cat([p[name] for p in parts]) for name in sorted(common)}
        pooled["source_run"] = torch.cat([torch.full((p["x"].shape[0],), j, dtype=torch.int64)
                                          for j, p in enumerate(parts)])
        save_tensors(d / RUN_SUBDIR / CANDIDATES, pooled)
        first = read_json(run_dir(ctx, *names[chosen[0]]) / RUN_JSON)
        atomic_write_json(d / RUN_SUBDIR / RUN_JSON, {
            "method": f"{first.get('method')}-pooled", "model_dir": first.get("model_dir"), "status": Status.COMPLETE,
            "steps_done": None, "init": "pooled", "pooled_from": chosen, "extra": {},
            "selection": {"criterion": criterion, "direction": direction,
                          "values": {k: v for _, _, k, v in ranked}}})
        return {"chosen": chosen, "criterion": criterion, "values": {k: v for _, _, k, v in ranked},
                "m": int(pooled["x"].shape[0])}

    deps = tuple(dict.fromkeys(r[0] for r in refs))
    return Piece(key=key, run=run, spec={"keep": keep, "criterion": criterion}, deps=deps, kind="select")
