"""``datarecon identifiability MODEL``: which attack objective does the model's training set minimise?

The defender's check (the training data are known; no attack runs): for each objective of
:mod:`datarecon.evaluation.identifiability` the relative residual of the training set with its optimal
multipliers, beside the same for fakes of the same labels — held-out images, means of two training images of
a class, partition images — per parameter tensor and in total. An objective *identifies* the training set
on this model when the truth fits it better than every fake; the gap (best fake − truth) says by how much.

Where the recorded recipe can be replayed (SGD at a constant learning rate), dynamics matching's objective
1 − cos(θ_T(x) − θ_init, θ* − θ_init) is measured the same way, each set replayed through the recorded
training (:func:`datarecon.attacks.dynamics.simulate`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.dynamics import Schedule, simulate
from datarecon.attacks.knowledge import (PRETRAINED, RECORDED_SEED, KnownInit, RecipeSettings, resolve_known_init,
                                        resolve_recipe)
from datarecon.config import Seed
from datarecon.data import DataSpec, load_task
from datarecon.data.selection import check_fingerprint
from datarecon.errors import DataReconError
from datarecon.evaluation.identifiability import fit_objective, gradient_features
from datarecon.kernel.engine import track
from datarecon.kernel.files import METRICS_FILE, RUN_JSON
from datarecon.models.checkpoint import load_model_dir, read_model_meta
from datarecon.registry import Registry
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.io import atomic_write_json, read_json

__all__ = ["OBJECTIVES", "QUICK", "Examined", "IdentifiabilitySettings", "attach_identifiability", "identifiability",
           "identifiability_lines", "kkt_gap_probe", "measure", "module_sets", "task_sets"]

#: objective name → (what it is, needs θ_init)
OBJECTIVES: Registry[tuple[str, bool]] = Registry("identifiability objective")
OBJECTIVES.register("kkt", ("θ* = Σ λ_i ∇m(x_i; θ*) (weights only; Haim et al.)", False))
OBJECTIVES.register("kkt-init", ("θ* − θ_init = Σ λ_i ∇m(x_i; θ*) (θ_init known)", True))
OBJECTIVES.register("loo", ("θ* − θ_init = Σ λ_i ∇m(x_i; θ_init) (Loo et al.)", True))
OBJECTIVES.register("path", ("θ* − θ_init = Σ_s Σ_i λ_is ∇m(x_i; θ_init + s(θ* − θ_init)), s on a grid", True))
OBJECTIVES.register("dynamics", ("1 − cos(θ_T(x) − θ_init, θ* − θ_init), the recorded training replayed", True))

#: the sets compared, the truth first
SETS = ("training set", "held-out images", "means of two training images", "partition images")


class IdentifiabilitySettings(BaseModel):
    """What the diagnostic measures.

    Attributes:
        objectives: the objectives to measure (names of OBJECTIVES)
        path_points: gradient points on the straight path θ_init → θ* of the ``path`` objective (≥ 2, ends included)
        max_replay_steps: replay the recorded training for ``dynamics`` only up to this many SGD steps per set
        seed: seed of the fakes' draw (which images are paired)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    objectives: tuple[Literal["kkt", "kkt-init", "loo", "path", "dynamics"], ...] = (
        "kkt", "kkt-init", "loo", "path", "dynamics")
    path_points: int = Field(default=4, ge=2, le=64)
    max_replay_steps: int = Field(default=2000, ge=0)
    seed: Seed = 0


def _matched(pool: Any, labels: torch.Tensor) -> torch.Tensor:
    """For each label, the next image of ``pool`` with that label (cycling when a class runs short)."""
    out, used = [], {}
    for lab in labels.tolist():
        idx = torch.nonzero(pool.y == lab)[:, 0]
        if idx.numel() == 0:
            raise DataReconError(f"no image of label {lab} to draw a fake from; train with more held-out and "
                                 "partition images per class")
        k = used.get(lab, 0)
        used[lab] = k + 1
        out.append(pool.x[idx[k % idx.numel()]])
    return torch.stack(out)


def _pair_means(x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
    """Each training image averaged with another training image of its label (a seeded permutation within the class)."""
    gen = torch.Generator().manual_seed(seed)
    out = x.clone()
    for lab in torch.unique(y):
        idx = torch.nonzero(y == lab)[:, 0]
        if idx.numel() < 2:
            continue
        perm = idx[torch.randperm(idx.numel(), generator=gen)]
        partner = torch.roll(perm, 1)
        out[perm] = 0.5 * (x[perm] + x[partner])
    return out


def _formulation(num_outputs: int, loss: str) -> str:
    if num_outputs > 1:
        return "multiclass"
    return "regression" if loss in ("mse", "huber") else "binary"


def _theta_init(meta: dict[str, Any], bundle: Any, model_dir: str | Path) -> tuple[KnownInit | None, str]:
    """θ_init (with batch norm's statistics at the start) as the attacker with a known start has it, as float64,
    and why it is missing if it is.

    A fine-tuned model's start is its pretrained model (``known_init pretrained``, resolved against the model
    directory); any other model's is rebuilt from the recorded seed in the dtype training drew it in. Both are
    checked against the hash model.json records (:func:`datarecon.attacks.knowledge.resolve_known_init`).

    Returns:
        (θ_init or None, the reason it is None: empty when rebuilt).
    """
    spec = PRETRAINED if isinstance(meta.get("pretrained"), dict) else RECORDED_SEED
    if spec == RECORDED_SEED and meta.get("seed") is None:
        return None, "the model directory records no seed"
    try:
        return resolve_known_init(spec, bundle.params, model_meta=meta, base_dir=model_dir), ""
    except DataReconError as exc:
        return None, str(exc)


def _repeats(name: str, pool: Any, labels: torch.Tensor) -> str:
    """A note when ``pool`` has fewer images of some label than the training set, so that its fake repeats images
    (:func:`_matched` cycles); "" otherwise."""
    distinct = sum(min(int((pool.y == lab).sum()), int((labels == lab).sum())) for lab in torch.unique(labels))
    if distinct >= labels.shape[0]:
        return ""
    times = math.ceil(labels.shape[0] / max(distinct, 1))
    return (f"{name}: only {distinct} distinct images for the {labels.shape[0]} training images, so each is used up "
            f"to {times} times; repeated images span less and fit worse than distinct ones, which makes this fake's "
            f"gap to the truth look larger than it is: train the model with at least as many {name} per class as "
            "training images")


def _sets(bundle: Any, meta: dict[str, Any], seed: int,
          data_dir: Any) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """The training set and its fakes, in model input space, each with the training labels; and a note for each fake
    that repeats images (too few held-out or partition images of a class)."""
    task = load_task(DataSpec.model_validate(meta["data"]), data_dir=data_dir)
    check_fingerprint(task, meta.get("data_fingerprint"), where="the model", splits=("train",))
    return task_sets(task, seed)


def task_sets(task: Any, seed: int) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """The training set of ``task`` and its fakes (held-out images, means of two training images, partition
    images), in model input space as float64, each with the training labels; and a note for each fake that
    repeats images."""
    norm = task.normalisation
    y = task.train.y
    y = y.double() if y.dtype.is_floating_point else y
    sets = {"training set": task.train.x, "means of two training images": _pair_means(task.train.x, task.train.y, seed)}
    notes = []
    for name, pool in (("held-out images", task.heldout), ("partition images", task.partition)):
        if len(pool):
            sets[name] = _matched(pool, task.train.y)
            notes.append(_repeats(name, pool, task.train.y))
    return {k: (norm.to_model(sets[k]).double(), y) for k in SETS if k in sets}, [n for n in notes if n]


def _gradient_objective(name: str, bundle: Any, init: dict[str, torch.Tensor] | None, data: tuple[torch.Tensor, Any],
                        formulation: str, points: int) -> Any:
    """The fit of one gradient objective for one set (``bundle``: anything with ``model`` and ``params``: a model
    directory's bundle, an :class:`Examined` model, or a network in training)."""
    star = {k: v.detach().double() for k, v in bundle.params.items()}
    x, y = data
    if name == "kkt":
        grads_at, target = [star], star
    else:
        assert init is not None
        target = {k: star[k] - init[k] for k in star}
        if name == "kkt-init":
            grads_at = [star]
        elif name == "loo":
            grads_at = [init]
        else:
            grads_at = [{k: init[k] + s * target[k] for k in star} for s in torch.linspace(0, 1, points).tolist()]
    feats = [gradient_features(bundle.model, p, x, y, formulation=formulation) for p in grads_at]
    return fit_objective(feats, target, signed=formulation == "regression")


def _dynamics(bundle: Any, meta: dict[str, Any], known: KnownInit, sets: dict[str, Any],
              max_steps: int) -> dict[str, Any]:
    """1 − cos of each set's replayed change with the true one, or why it was not measured."""
    try:
        recipe = resolve_recipe(RecipeSettings(), meta)
    except DataReconError as exc:
        return {"note": f"not measured: {exc}"}
    if recipe.steps > max_steps:
        return {"note": f"not measured: the recorded training has {recipe.steps} SGD steps, more than "
                        f"--max-replay-steps {max_steps}"}
    dtype = torch_dtype((meta.get("training") or {}).get("dtype") or "float64")  # replayed as it was trained
    # batch norm in train mode: the statistics start at the start's and move; in eval mode: the model's own
    stats = {k: v.to(dtype) for k, v in known.stats.items()} if recipe.norm_mode == "train" else None
    schedule = Schedule.replay(replace(recipe.recipe, loss=bundle.loss, weight_decay=bundle.weight_decay),
                               recipe.lr, n=recipe.n, batch_size=recipe.batch_size, epochs=recipe.epochs,
                               order_seed=recipe.order_seed, stats=stats or None)
    init = known.params
    model = copy.deepcopy(bundle.model).to(dtype)
    start = {k: v.to(dtype) for k, v in init.items()}
    star = {k: v.detach().double() for k, v in bundle.params.items()}
    change = torch.cat([(star[k] - init[k].double()).reshape(-1) for k in star])
    out = {}
    for name, (x, y) in sets.items():
        final = simulate(model, start, x.to(dtype), y.to(dtype) if y.dtype.is_floating_point else y, schedule,
                         differentiable=False)
        sim = torch.cat([(final[k].double() - init[k].double()).reshape(-1) for k in star])
        cos = float(torch.nn.functional.cosine_similarity(sim, change, dim=0))
        out[name] = {"relative_residual": max(1.0 - cos, 0.0) if math.isfinite(cos) else float("nan"), "per_layer": {}}
    return {"sets": out}


@dataclass(frozen=True)
class Examined:
    """The model the check reads and what it is measured on.

    Attributes:
        model, params: the network and θ* (float64); num_outputs, loss, weight_decay: its training.
        sets: set name → (x, y) in model input space, the training set first (:data:`SETS`).
        init: θ_init (float64), or None with ``init_missing`` saying why.
        dynamics: ``dynamics(init, sets, max_steps) -> entry`` of the replay objective, or None: not measured
            (``dynamics_missing`` says why).
        notes: notes on the sets (a fake that repeats images).
    """

    model: torch.nn.Module
    params: dict[str, torch.Tensor]
    num_outputs: int
    loss: Any
    weight_decay: float
    sets: dict[str, tuple[torch.Tensor, torch.Tensor]]
    init: dict[str, torch.Tensor] | None
    init_missing: str
    dynamics: Callable[..., dict[str, Any]] | None
    dynamics_missing: str = ""
    notes: tuple[str, ...] = ()


def identifiability(model_dir: str | Path, settings: IdentifiabilitySettings = IdentifiabilitySettings(), *,
                    data_dir: str | Path | None = None, progress: bool | str = False) -> dict[str, Any]:
    """Each objective's relative residual for the training set and its fakes, with optimal multipliers.

    ``progress``: one step per objective (a bar on a terminal, plain lines in a log; :func:`~datarecon.kernel.
    engine.track`), for large models where each objective takes a while.

    Returns:
        JSON-ready: ``objectives`` (name → ``doc``, ``sets`` (set → ``relative_residual``, ``per_layer``),
        ``identifies`` (the truth fits better than every fake), ``gap`` (best fake − truth), or ``note``
        when not measured), ``formulation``, ``n``, ``sets`` (their names), ``notes`` (a fake that repeats
        images: too few held-out or partition images of a class), ``wall_time_s``.

    Raises:
        DataReconError: a bad model directory, missing data.
    """
    t0 = time.perf_counter()
    meta = read_model_meta(model_dir)
    bundle = load_model_dir(model_dir, dtype=torch.float64)
    sets, notes = _sets(bundle, meta, settings.seed, data_dir)
    known, init_missing = _theta_init(meta, bundle, model_dir)
    init = None if known is None else dict(known.params)
    examined = Examined(model=bundle.model, params=dict(bundle.params), num_outputs=bundle.arch.num_outputs,
                        loss=bundle.loss, weight_decay=bundle.weight_decay, sets=sets, init=init,
                        init_missing=init_missing, notes=tuple(notes),
                        dynamics=lambda _init, s, steps: _dynamics(bundle, meta, known, s, steps))
    return {**measure(examined, settings, progress=progress), "model": str(model_dir),
            "wall_time_s": time.perf_counter() - t0}


def module_sets(train: tuple[torch.Tensor, torch.Tensor], heldout: tuple[torch.Tensor, torch.Tensor] | None, *,
                seed: int) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """The training set of a user's model and its fakes (held-out examples matched by label, means of two training
    examples), from its own inputs and labels; and a note for a fake that repeats examples."""
    x, y = train
    y = y.double() if y.dtype.is_floating_point else y
    sets = {"training set": (x.double(), y), "means of two training images": (_pair_means(x, y, seed).double(), y)}
    notes = []
    if heldout is not None:
        pool = _Pool(x=heldout[0].double(), y=heldout[1].to(y.dtype))
        sets["held-out images"] = (_matched(pool, y), y)
        notes.append(_repeats("held-out images", pool, y))
    return {k: sets[k] for k in SETS if k in sets}, [n for n in notes if n]


@dataclass(frozen=True)
class _Pool:
    x: torch.Tensor
    y: torch.Tensor


def measure(examined: Examined, settings: IdentifiabilitySettings = IdentifiabilitySettings(), *,
            progress: bool | str = False) -> dict[str, Any]:
    """Each objective of ``settings`` on the model and sets of ``examined`` (a model directory's, or a user's own
    model's: :func:`module_sets`).

    Returns:
        JSON-ready, as :func:`identifiability` (without ``model`` and ``wall_time_s``).
    """
    sets, init = examined.sets, examined.init
    formulation = _formulation(examined.num_outputs, examined.loss)
    result: dict[str, Any] = {}
    for name in track(settings.objectives, desc="identifiability", unit="objective", mode=progress):
        doc, needs_init = OBJECTIVES.get(name)
        if needs_init and init is None:
            result[name] = {"doc": doc, "note": f"not measured: θ_init cannot be rebuilt ({examined.init_missing})"}
            continue
        if name == "dynamics":
            entry = (examined.dynamics(init, sets, settings.max_replay_steps) if examined.dynamics is not None
                     else {"note": f"not measured: {examined.dynamics_missing}"})
        else:
            fits = {s: _gradient_objective(name, examined, init, data, formulation, settings.path_points)
                    for s, data in sets.items()}
            entry = {"sets": {s: {"relative_residual": f.relative_residual, "per_layer": f.per_layer}
                              for s, f in fits.items()}}
        result[name] = {"doc": doc, **entry, **_verdict(entry.get("sets"))}
    return {"formulation": formulation, "n": int(sets["training set"][0].shape[0]),
            "sets": list(sets), "objectives": result, "notes": list(examined.notes),
            "settings": settings.model_dump(mode="json"),
            "weight_decay_note": ("θ_init enters with coefficient 1; training with weight decay shrank it, so the "
                                  "θ_init objectives overstate every set's residual" if examined.weight_decay else "")}


@dataclass(frozen=True)
class _Weights:
    """A network and its parameters as :func:`_gradient_objective` reads them (a model directory's bundle, or a
    network in training)."""

    model: torch.nn.Module
    params: dict[str, torch.Tensor]


def kkt_gap_probe(task: Any, *, loss: str, seed: int = 0) -> Any:
    """A margin-ascent curve probe (:data:`datarecon.training.fit.CurveProbe`): the weights-only KKT objective's
    relative residual for ``task``'s training set and its best fake at the network's current weights.

    Returns:
        ``probe(model) -> {"kkt_truth", "kkt_best_fake", "kkt_gap"}`` (gap = best fake − truth; NaN without fakes).
    """
    sets, _ = task_sets(task, seed)

    def probe(model: torch.nn.Module) -> dict[str, float]:
        net = copy.deepcopy(model).double()
        weights = _Weights(net, {k: v.detach() for k, v in net.named_parameters()})
        formulation = _formulation(int(net(sets["training set"][0][:1]).shape[-1]), loss)
        fits = {s: _gradient_objective("kkt", weights, None, data, formulation, 2).relative_residual
                for s, data in sets.items()}
        verdict = _verdict({k: {"relative_residual": v} for k, v in fits.items()})
        fakes = [v for k, v in fits.items() if k != "training set"]
        return {"kkt_truth": fits["training set"], "kkt_best_fake": min(fakes) if fakes else math.nan,
                "kkt_gap": float(verdict.get("gap", math.nan))}

    return probe


def _verdict(sets: dict[str, Any] | None) -> dict[str, Any]:
    if not sets or "training set" not in sets:
        return {}
    truth = sets["training set"]["relative_residual"]
    fakes = [v["relative_residual"] for k, v in sets.items() if k != "training set"]
    best = min(fakes) if fakes else float("nan")
    return {"identifies": bool(fakes) and truth < best, "gap": best - truth}


def identifiability_lines(result: dict[str, Any]) -> list[str]:
    """One line per objective: the truth's residual, each fake's, and the verdict."""
    lines = []
    for name, v in result["objectives"].items():
        if "sets" not in v:
            lines.append(f"{name:<9} {v.get('note', '')}")
            continue
        parts = ", ".join(f"{s} {r['relative_residual']:.3f}" for s, r in v["sets"].items())
        verdict = ("identifies the training set" if v.get("identifies") else "does NOT identify the training set")
        lines.append(f"{name:<9} {parts}: {verdict} (gap {v.get('gap', float('nan')):+.3f})")
    return lines


#: the objectives ``datarecon evaluate`` measures for a run's report (no replay of the training)
QUICK = ("kkt", "kkt-init", "loo", "path")


def attach_identifiability(run_dir: str | Path, *, data_dir: str | Path | None = None) -> dict[str, Any] | None:
    """Measure the gradient objectives (:data:`QUICK`) on the model a run attacked and add them to its ``metrics.json``.

    Returns:
        The result written, or None for a run without a model directory.
    """
    run_dir = Path(run_dir)
    model_dir = read_json(run_dir / RUN_JSON).get("model_dir")
    if not model_dir:
        return None
    metrics = read_json(run_dir / METRICS_FILE)
    measured = identifiability(model_dir, IdentifiabilitySettings(objectives=QUICK), data_dir=data_dir)
    measured.pop("wall_time_s", None)  # evaluating a run twice writes the same bytes (timings go to the console)
    metrics["identifiability"] = measured
    atomic_write_json(run_dir / METRICS_FILE, metrics)
    return metrics["identifiability"]
