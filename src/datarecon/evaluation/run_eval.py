"""Evaluate a run directory: its candidates against the ground truth of the model it attacked.

:func:`run_metrics` reads a run directory (``docs/dev/CONTRACTS.md``) under
:class:`RunEvaluationSettings`: ``candidates.safetensors`` and ``run.json`` (checked,
:mod:`datarecon.evaluation.records`), the model directory and the task data it names (or, for a run of
a user's own model, the training and held-out inputs given), maps the candidates to display space
(training mean added back), calls :func:`datarecon.evaluation.images.evaluation_of` and returns the
summary, the content of ``metrics.json``; unless ``write=False`` it also writes

* ``RUN/metrics.json``: summary (Haim counts at thresholds for greedy /
  Hungarian / independent matching, sorted SSIM curves with held-out and
  noise baselines, mean similarity and L2 to the nearest image of each
  reference set, privacy AUC / TPR per attacker score, collapse, the
  parameter distance when ``run.json`` has ``extra.param_distance``);
* ``RUN/candidates.csv``: one row per candidate (nearest index and value per
  reference set and metric, rank, scores, real/fake label);
* ``RUN/neighbours.safetensors``: the best-matched candidates with their
  nearest training / partition images, for the report's grids.

:func:`check_run` makes the checks :func:`run_metrics` makes before it reads any tensor;
:func:`run_convergence` gives the attack's convergence verdict the report shows.

References:
    Haim et al. (2022) section 5; Runkel et al. (2024) sections 4-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, field_validator
from torch import Tensor

from datarecon.attacks.base import ATTACKS, DEFAULT_DIVERGENCE_HINT, convergence_of
from datarecon.attacks.convergence import Convergence, assess_convergence
from datarecon.attacks.labels import label_accuracy
from datarecon.attacks.run_directory import INIT_FILE
from datarecon.config import build_config, build_record
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.data.selection import check_fingerprint
from datarecon.errors import CheckpointError, DataReconError
from datarecon.evaluation.images import GRID_MAX, Evaluation, RunRecord, evaluation_of, neighbour_grid
from datarecon.evaluation.run_records import read_history, read_run_fields
from datarecon.evaluation.reports import EvaluationConfig
from datarecon.kernel.files import (
    CANDIDATES,
    CANDIDATES_CSV,
    HISTORY,
    METRICS_FILE,
    MODEL_JSON,
    NEIGHBOURS_FILE,
    RUN_JSON,
    TASK_FILE,
)
from datarecon.kernel.losses import margins
from datarecon.kernel.status import EVALUABLE as STATUS_EVALUABLE
from datarecon.kernel.status import Status
from datarecon.models.checkpoint import load_model_dir
from datarecon.utils.io import atomic_write_json, load_tensors, read_json, save_tensors, write_csv
from datarecon.utils.lock import check_free, hold

__all__ = [
    "CANDIDATES_CSV",
    "METRICS_FILE",
    "NEIGHBOURS_FILE",
    "RunEvaluationSettings",
    "check_run",
    "run_convergence",
    "run_metrics",
    "write_evaluation",
]

#: run statuses evaluated without ``allow_incomplete``: finished, by its step budget or its own early stop
EVALUABLE = STATUS_EVALUABLE  # complete, stopped-early (datarecon.kernel.status)


def init_name_of(meta: Mapping[str, Any]) -> str | None:
    """The initialisation name a ``run.json`` records (None for pooled or older runs without one)."""
    init = meta.get("init")
    return str(init.get("name")) if isinstance(init, Mapping) and init.get("name") else None


def read_init(run_dir: str | Path, *, m: int) -> Tensor | None:
    """The initial candidates x₀ ``(m, C, H, W)`` (model input space) a data-initialised run recorded in
    ``init.safetensors``, or None (a run from a random start, or from an earlier version).

    Raises:
        CheckpointError: the file holds no ``x0`` of ``m`` candidates.
    """
    path = Path(run_dir) / INIT_FILE
    if not path.is_file():
        return None
    t = load_tensors(path)
    if "x0" not in t or t["x0"].shape[0] != m:
        raise CheckpointError(f"{path} does not hold the {m} initial candidates of this run (tensor 'x0'); "
                              "re-create the run")
    return t["x0"].detach()


def _resolve_model_dir(run_dir: Path, model_dir: str | None) -> Path:
    if not model_dir:
        raise CheckpointError(f"{run_dir / 'run.json'} has no model_dir; re-create the run with `datarecon reconstruct`")
    p = Path(model_dir)
    for cand in ([p] if p.is_absolute() else [run_dir / p, p, run_dir.parent / p]):
        if cand.is_dir():
            return cand
    raise CheckpointError(
        f"model directory {model_dir} named in {run_dir / 'run.json'} not found; restore it or fix model_dir"
    )


def _margins(bundle, x_model: Tensor, y: Tensor) -> Tensor | None:
    try:
        with torch.no_grad():
            out = bundle.model(x_model.to(next(bundle.model.parameters()).dtype))
    except Exception:  # margins are optional decoration; never fail the evaluation on them
        return None
    multiclass = not (out.ndim == 1 or out.shape[-1] == 1)
    return margins(out, y.reshape(-1), multiclass=multiclass).double()


def run_convergence(run_dir: str | Path) -> list[tuple[str, Convergence]]:
    """Whether the attack of ``run_dir`` converged (:func:`~datarecon.attacks.convergence.assess_convergence`,
    the verdict the report's attack card shows): one ``(name, verdict)``, or one per source run of a
    pool (``reconstruct --runs K``, ``sweep pool``); source runs no longer on disk are left out.

    Raises:
        CheckpointError: a run.json that is not one datarecon wrote.
    """
    run_dir = Path(run_dir)
    meta = read_run_fields(run_dir / RUN_JSON)
    if meta.get("method") != "pool":
        return [(run_dir.name, _verdict(run_dir, meta))]
    out = []
    for source in (meta.get("extra") or {}).get("sources") or []:
        rel = str(source.get("run_dir") or "") if isinstance(source, Mapping) else ""
        found = next((d for d in (run_dir / rel, run_dir.parent.parent / rel) if rel and (d / RUN_JSON).is_file()),
                     None)
        if found is not None:
            out.append((str(source.get("key") or rel), _verdict(found, read_run_fields(found / RUN_JSON))))
    return out


def _verdict(run_dir: Path, meta: Mapping[str, Any]) -> Convergence:
    """:func:`assess_convergence` of one run from its history and record (as the report judges it)."""
    return assess_convergence(read_history(run_dir / HISTORY), convergence_of(meta.get("method")),
                              status=str(meta.get("status") or Status.COMPLETE), record=meta)


def how_to_finish(run_dir: Path, meta: Mapping[str, Any]) -> str:
    """How to finish the run in ``run_dir``: the command its ``run.json`` recorded, else by who wrote it."""
    command = meta.get("resume_command")
    if command:
        return f"finish it with `{command}`"
    if (run_dir / TASK_FILE).is_file():
        return "finish it by rerunning its sweep (`datarecon sweep` with the same --config and --out)"
    return "finish it (`datarecon reconstruct` with its original options and --resume)"


def _divergence_hint(method: Any) -> str:
    """What the attack ``method`` of a diverged run tells the user to change (its ``divergence_hint``; a
    method this installation does not know: the default step's)."""
    return ATTACKS.get(method).divergence_hint if isinstance(method, str) and method in ATTACKS \
        else DEFAULT_DIVERGENCE_HINT


def _incomplete(run_dir: Path, missing: str) -> str:
    """Why ``run_dir`` cannot be evaluated yet (``missing`` is absent) and exactly how to continue."""
    batch = sorted((p for p in run_dir.glob("run[0-9]*") if p.is_dir()), key=lambda p: int(p.name[3:] or 0)) \
        if missing == RUN_JSON else []
    metas = []
    for p in batch:
        try:
            metas.append((p, read_json(p / RUN_JSON)))
        except DataReconError:
            metas.append((p, {}))
    if metas:
        unfinished = [p.name for p, m in metas if m.get("status") in (None, Status.RUNNING)]
        command = next((m.get("resume_command") for _, m in metas if m.get("resume_command")), None)
        how = f"`{command}`" if command else "the same `datarecon reconstruct ... --runs` command with --resume"
        state = (f"{len(unfinished)} of its {len(metas)} runs are unfinished ({', '.join(unfinished)})" if unfinished
                 else f"its {len(metas)} runs finished but were not pooled yet")
        return f"it holds the runs of `reconstruct --runs`, and {state}; continue with {how}"
    meta: dict[str, Any] = {}
    if (run_dir / RUN_JSON).is_file():
        try:
            meta = read_json(run_dir / RUN_JSON)
        except DataReconError:
            meta = {}
    return f"{missing} is missing; {how_to_finish(run_dir, meta)}, or evaluate another run directory"


_DEFAULTS = EvaluationConfig.model_fields

#: the reference sets a run is evaluated against (``against``; ``datarecon evaluate --against``)
REFERENCE_SETS: tuple[str, ...] = ("train", "partition", "noise", "heldout")


def check_reference_sets(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` when each is a reference set (:data:`REFERENCE_SETS`) named once; one set given twice
    would be evaluated and reported twice.

    Raises:
        ValueError: an unknown name, a repeated one, or none.
    """
    bad = [a for a in names if a not in REFERENCE_SETS]
    if bad or not names:
        raise ValueError(f"unknown reference set(s) {bad or list(names)}; valid names: {', '.join(sorted(REFERENCE_SETS))}")
    twice = sorted({a for a in names if names.count(a) > 1})
    if twice:
        raise ValueError(f"reference set(s) {', '.join(twice)} given more than once; name each set once")
    return tuple(names)


class RunEvaluationSettings(BaseModel):
    """How :func:`run_metrics` evaluates a run directory (one-to-one with the options of
    ``datarecon evaluate``); :meth:`evaluation` gives the :class:`EvaluationConfig` it runs under.

    Attributes:
        against: Reference sets (comma-separated on the command line): any of ``train``,
            ``partition``, ``heldout`` (from the model's data spec) and ``noise`` (uniform images in
            ``[0, 1]``, as many as training images, seeded by ``seed``).
        metric: Nearest-neighbour metric: ssim, l2, ncc, lncc.
        prefilter: Cheap metric of the nearest-neighbour shortlist (lncc, l2, ncc), or None: exhaustive.
        top_k: Prefilter shortlist size before exact SSIM (searches of more than ``exact_up_to`` pairs
            only; labelled approximate).
        exact_up_to: Compare every candidate with every reference (exact) up to this many pairs per search.
        window: SSIM window: gaussian (sigma 1.5, like scikit-image) or box3.
        thresholds: SSIM thresholds of the Haim counts.
        assignment: Haim protocol matching: greedy, hungarian, independent.
        seed: Seed of the noise reference set and baselines.
        allow_incomplete: Evaluate runs that did not finish (status other than ``complete`` or
            ``stopped-early``: ``running``, ``diverged``).
        grid_max: Candidates stored for the report's neighbour grids.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    against: tuple[str, ...] = REFERENCE_SETS
    # the evaluation's own settings default to EvaluationConfig's (one set of defaults)
    metric: str = _DEFAULTS["metric"].default
    prefilter: str | None = _DEFAULTS["prefilter"].default
    top_k: int = _DEFAULTS["top_k"].default
    exact_up_to: int = _DEFAULTS["exact_up_to"].default
    window: str = _DEFAULTS["window"].default
    thresholds: tuple[float, ...] = _DEFAULTS["thresholds"].default
    assignment: str = _DEFAULTS["assignment"].default
    seed: int = _DEFAULTS["noise_seed"].default
    allow_incomplete: bool = False
    grid_max: int = GRID_MAX

    @field_validator("against")
    @classmethod
    def _known_sets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return check_reference_sets(v)
        except ValueError as exc:  # the one line of the Python API and the command line alike
            raise DataReconError(str(exc)) from None

    def evaluation(self) -> EvaluationConfig:
        """The evaluation settings (``seed`` seeds both the noise reference set and the noise baselines).

        Raises:
            DataReconError: a setting :class:`EvaluationConfig` refuses.
        """
        return build_config(EvaluationConfig, {
            "metric": self.metric, "prefilter": self.prefilter, "top_k": self.top_k, "exact_up_to": self.exact_up_to,
            "window": self.window, "thresholds": tuple(float(t) for t in self.thresholds),
            "assignment": self.assignment, "noise_seed": self.seed, "baseline_seed": self.seed,
        }, where="evaluation settings")


@dataclass(frozen=True)
class _Run:
    """A run directory's files as :func:`run_metrics` reads them.

    Attributes:
        dir: the run directory.
        meta: its ``run.json``.
        status: its status (``complete`` when not recorded).
        tensors: its ``candidates.safetensors``: ``x`` ``(M, C, H, W)`` in model input space, and
            ``labels``, ``multipliers`` ``(M,)`` when recorded.
        scores: ``{name: (M,)}`` the attacker-side scores (tensors ``score_<name>``).
    """

    dir: Path
    meta: Mapping[str, Any]
    status: str
    tensors: Mapping[str, Tensor]
    scores: Mapping[str, Tensor]


def run_metrics(run_dir: str | Path, settings: RunEvaluationSettings | Mapping[str, Any] | None = None, *,
                data_dir: str | Path | None = None, write: bool = True, progress: bool = True,
                train: Tensor | None = None, heldout: Tensor | None = None) -> dict[str, Any]:
    """The metrics of a run directory's candidates against the ground truth (``metrics.json``'s content),
    written with the candidate table and the report's grid unless ``write=False``.

    Args:
        run_dir: Run directory (``candidates.safetensors``, ``run.json``).
        settings: :class:`RunEvaluationSettings` or its fields: reference sets (``against``), search
            and protocol settings, ``seed`` of the noise reference set and baselines,
            ``allow_incomplete`` (evaluate runs that did not finish) and ``grid_max``; None: defaults.
        data_dir: Data folder for :func:`datarecon.data.load_task`.
        write: Write ``metrics.json``, ``candidates.csv`` and ``neighbours.safetensors``.
        progress: Show progress bars.
        train, heldout: For a run of a user's own model (``run.json`` has ``own_model``, no model
            directory): its training and held-out inputs ``(N, C, H, W)`` in the model's input space;
            candidates and these are mapped to images by the recorded ``value_range``
            ((x − lo) / (hi − lo)). ``train`` is required for such a run; ``partition`` is not available.

    Returns:
        The summary dict (the content of ``metrics.json``).

    Raises:
        CheckpointError: missing run files or model directory.
        DataReconError: unknown reference set name, shape mismatch, run not complete, bad settings, or
            the run directory in use by another process (an attack or evaluation writing it).
    """
    s = settings if isinstance(settings, RunEvaluationSettings) else build_config(
        RunEvaluationSettings, dict(settings or {}), where="evaluation settings")
    check_run(run_dir, s)
    with hold(run_dir, what="run directory") if write else nullcontext():  # one writer of its metrics at a time
        run = _read_run(Path(run_dir), s)
        if run.meta.get("own_model") and not run.meta.get("model_dir"):
            return _own_run_metrics(run, s, train=train, heldout=heldout, write=write, progress=progress)
        if train is not None or heldout is not None:
            raise DataReconError(f"{run.dir} attacked a model directory; its training and held-out images come from "
                                 "there: drop train/heldout (--train/--heldout)")
        return _model_run_metrics(run, s, data_dir=data_dir, write=write, progress=progress)


def check_run(run_dir: str | Path, settings: RunEvaluationSettings) -> dict[str, Any]:
    """The checks :func:`run_metrics` makes before it reads any tensor, so a command given several
    runs refuses a bad one before it writes anything: the run folder exists, is a run directory
    that no other process is writing, holds its files and may be evaluated.

    Returns:
        The run's ``run.json`` (its fields checked, :func:`~datarecon.evaluation.run_records.read_run_fields`).

    Raises:
        CheckpointError: missing run files (saying how to finish the run), a model directory, a bad run.json.
        DataReconError: the run is in use by another process, or not complete (without ``allow_incomplete``).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} not found; run an attack with `datarecon reconstruct`")
    if (run_dir / MODEL_JSON).is_file() and not (run_dir / RUN_JSON).is_file():
        raise CheckpointError(f"{run_dir} is a model directory, not a run directory; attack it with `datarecon "
                              f"reconstruct --model {run_dir} --out RUN` and evaluate RUN")
    check_free(run_dir, what="run directory")  # an attack or an evaluation still writing it: say so first
    for name in (RUN_JSON, CANDIDATES):
        if not (run_dir / name).is_file():
            raise CheckpointError(f"{run_dir} is incomplete: {_incomplete(run_dir, name)}")
    meta = read_run_fields(run_dir / RUN_JSON)
    status = meta.get("status", Status.COMPLETE)
    if status == Status.DIVERGED and not settings.allow_incomplete:  # a resume would diverge again
        raise DataReconError(f"run {run_dir} diverged (it kept its last finite state); evaluate that state with "
                             "--allow-incomplete (allow_incomplete=True in Python), or rerun the attack: "
                             f"{_divergence_hint(meta.get('method'))}")
    if status not in EVALUABLE and not settings.allow_incomplete:
        raise DataReconError(f"run {run_dir} has status {status!r}; {how_to_finish(run_dir, meta)}, or pass "
                             "--allow-incomplete (allow_incomplete=True in Python)")
    return meta


def _read_run(run_dir: Path, s: RunEvaluationSettings) -> _Run:
    """Check the run directory (:func:`check_run`) and read its record and candidates.

    Raises:
        CheckpointError: missing run files (saying how to finish the run), a model directory, bad tensors.
        DataReconError: run in use or not complete (without ``allow_incomplete``).
    """
    meta = check_run(run_dir, s)
    status = meta.get("status", Status.COMPLETE)
    tensors = load_tensors(run_dir / CANDIDATES)
    if "x" not in tensors:
        raise CheckpointError(f"{run_dir / 'candidates.safetensors'} has no 'x' tensor; re-create the run")
    m = tensors["x"].shape[0]
    for k in ("labels", "multipliers"):
        if k in tensors and tensors[k].reshape(-1).shape[0] != m:
            raise CheckpointError(f"{run_dir / 'candidates.safetensors'}: {k} has {tensors[k].numel()} values for {m} candidates")
    scores = {k[len("score_"):]: v.reshape(-1) for k, v in tensors.items() if k.startswith("score_")}
    return _Run(dir=run_dir, meta=meta, status=status, tensors=tensors, scores=scores)


def _load_target(run: _Run, data_dir: str | Path | None):
    """The model directory a run attacked, its bundle, the task its data spec names and its normalisation.

    Raises:
        CheckpointError: the model directory is missing, or its training indices are stale.
    """
    model_dir = _resolve_model_dir(run.dir, run.meta.get("model_dir"))
    bundle = load_model_dir(model_dir)
    where = f"data spec of {Path(model_dir) / MODEL_JSON}"
    spec = build_record(DataSpec, bundle.data, where=where).checked(where)
    task = load_task(spec, data_dir=data_dir)
    check_fingerprint(task, bundle.meta.get("data_fingerprint"), where=str(model_dir))
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    if "train" in bundle.indices and not torch.equal(bundle.indices["train"].long(), task.train.indices.long()):
        raise CheckpointError(f"training indices of {model_dir} differ from the data spec's selection; stale model or data")
    return model_dir, bundle, task, norm


def _model_run_metrics(run: _Run, s: RunEvaluationSettings, *, data_dir: str | Path | None, write: bool,
                       progress: bool) -> dict[str, Any]:
    """:func:`run_metrics` for a run of a model directory: references from the model's data spec."""
    model_dir, bundle, task, norm = _load_target(run, data_dir)
    x = run.tensors["x"].detach()
    if tuple(x.shape[1:]) != tuple(task.input_shape):
        raise DataReconError(f"candidates have shape {tuple(x.shape[1:])}, the model expects {tuple(task.input_shape)}")
    display = norm.to_display(x.float())

    sets = {a: getattr(task, a).x for a in ("train", "partition", "heldout") if a in s.against}
    margins = _margins(bundle, norm.to_model(task.train.x), task.train.y) if "train" in sets else None
    x0 = read_init(run.dir, m=x.shape[0])
    init = None if x0 is None else norm.to_display(x0.float())
    record = RunRecord(labels=run.tensors.get("labels"), scores=run.scores, multipliers=run.tensors.get("multipliers"),
                       margins=margins, init=init, init_name=init_name_of(run.meta))
    ev = evaluation_of(display, train=sets.get("train"), heldout=sets.get("heldout"), partition=sets.get("partition"),
                       noise=len(task.train) if "noise" in s.against else None, record=record, config=s.evaluation(),
                       progress=progress)
    summary = dict(ev.summary)
    extra = run.meta.get("extra") or {}
    summary["param_distance"] = extra.get("param_distance")
    restored = ((run.meta.get("knowledge") or {}).get("labels"))
    if restored is not None:
        summary["labels"] = restored_label_accuracy(restored, task.train.y, bundle.arch.num_outputs)
    summary["run"] = {"run_dir": str(run.dir), "model_dir": str(model_dir), "method": run.meta.get("method"),
                      "status": run.status, "steps_done": run.meta.get("steps_done"), "seed": run.meta.get("seed"),
                      "config": run.meta.get("config"), "data": bundle.data, "arch": bundle.arch.model_dump(mode="json")}
    if write:
        init_ssim = torch.tensor([r["init_ssim"] for r in ev.rows]) if x0 is not None else None
        grid = ev.grid if s.grid_max == GRID_MAX else neighbour_grid(
            ev.neighbours, display.clamp(0, 1), sets, metric=s.metric, train_key="train", grid_max=s.grid_max,
            init=None if init is None else init.clamp(0, 1), init_ssim=init_ssim)
        write_evaluation(run.dir, replace(ev, summary=summary, grid=grid))
    return summary


def restored_label_accuracy(restored: Mapping[str, Any], truth: Tensor, num_classes: int) -> dict[str, Any]:
    """The restored labels' record (run.json ``knowledge.labels``) beside the training set's: the share of the
    true label multiset they hold (:func:`datarecon.attacks.labels.label_accuracy`) and both counts."""
    counts = torch.tensor([int(c) for c in restored["counts"]], dtype=torch.int64)
    labels = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    true_counts = torch.bincount(truth.long().reshape(-1), minlength=num_classes)
    return {"source": restored.get("source", "restored"), "counts": counts.tolist(),
            "true_counts": true_counts.tolist(), "accuracy": label_accuracy(labels, truth, num_classes)}


def _own_run_metrics(run: _Run, s: RunEvaluationSettings, *, train: Tensor | None, heldout: Tensor | None,
                     write: bool, progress: bool) -> dict[str, Any]:
    """:func:`run_metrics` for a run of a user's own model: references given as tensors."""
    own = run.meta["own_model"]
    if train is None:
        raise DataReconError(f"{run.dir} attacked your own model ({own.get('factory', 'from Python')}); pass its "
                             "training inputs: --train FILE.safetensors (tensor 'x', model input space)")
    against = [a for a in s.against if a != "partition"]  # no partition without a data spec
    lo, hi = (float(v) for v in own.get("value_range", (0.0, 1.0)))
    x = run.tensors["x"].detach().double()
    for name, t in (("train", train), ("heldout", heldout)):
        if t is not None and tuple(t.shape[1:]) != tuple(x.shape[1:]):
            raise DataReconError(f"{name} images have shape {tuple(t.shape[1:])}, the candidates {tuple(x.shape[1:])}")

    def display(t: Tensor) -> Tensor:
        return ((t.double() - lo) / (hi - lo)).float()

    record = RunRecord(labels=run.tensors.get("labels"), scores=run.scores, multipliers=run.tensors.get("multipliers"))
    ev = evaluation_of(display(x), train=display(train) if "train" in against else None,
                       heldout=display(heldout) if heldout is not None and "heldout" in against else None,
                       noise=int(train.shape[0]) if "noise" in against else None, record=record,
                       config=s.evaluation(), progress=progress)
    summary = dict(ev.summary)
    summary["param_distance"] = (run.meta.get("extra") or {}).get("param_distance")
    summary["run"] = {"run_dir": str(run.dir), "model_dir": None, "own_model": dict(own),
                      "method": run.meta.get("method"), "status": run.status, "steps_done": run.meta.get("steps_done"),
                      "seed": run.meta.get("seed"), "config": run.meta.get("config")}
    if write:
        grid = ev.grid if s.grid_max == GRID_MAX else neighbour_grid(
            ev.neighbours, display(x).clamp(0, 1), {"train": display(train)}, metric=s.metric,
            train_key="train", grid_max=s.grid_max)
        write_evaluation(run.dir, replace(ev, summary=summary, grid=grid))
    return summary


def write_evaluation(folder: str | Path, ev: Evaluation) -> Path:
    """Write ``ev`` as ``metrics.json``, ``candidates.csv`` and ``neighbours.safetensors`` in ``folder``.

    The files ``datarecon report`` reads; each is replaced atomically. ``folder`` is created.

    Returns:
        ``folder``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / METRICS_FILE, ev.summary)
    write_csv(folder / CANDIDATES_CSV, ev.rows)
    save_tensors(folder / NEIGHBOURS_FILE, ev.grid, metadata={"metric": str(ev.summary.get("metric", "ssim"))})
    return folder
