"""Reproduction of Haim, Vardi, Yehudai, Shamir, Irani (2022), "Reconstructing Training Data
from Trained Neural Networks" (NeurIPS): the KKT attack on binary MNIST (odd/even) and CIFAR-10
(vehicles/animals) D-1000-1000-1 bias-free ReLU MLPs.

* Data: the first ``n_per_class`` images of each side in dataset order, pixels in [0, 1] minus
  the per-pixel training mean (METHODS §2).
* Targets: first-layer weights N(0, 1)·1e-4, logistic loss, full-batch GD. The reference trains
  10⁶ epochs at lr 0.01; we use the loss-normalised step size (``schedule: loss-normalised``,
  Lyu & Li 2020 §4) that reaches the KKT regime in far fewer epochs, and record the KKT-regime
  score (``datarecon.training.kkt_regime_score``) and the normalised margin of every target.
* Attack: several KKT runs (m = 2n, x₀ = N(0,1)·s) with the reference's best hyper-parameters;
  runs are ranked by an attacker-side criterion (``relative_residual``, never distances to the
  training set), the best ``keep`` runs' candidates are pooled.
* Evaluation (Haim protocol, METHODS §5): best candidate per training image by NCC on 2x
  downsampled images, mean added back, min-max rescale, SSIM; sorted SSIM curve with held-out
  and noise null baselines, SSIM vs output margin, count of SSIM > 0.4, reconstruction grid.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.kkt import KKTConfig
from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.attacks.selection import CRITERIA
from datarecon.config import RecordedConfig
from datarecon.evaluation.privacy import signal_verdict
from datarecon.experiments.membership.evaluate import evaluate_membership
from datarecon.experiments.membership.settings import MembershipSettings
from datarecon.experiments.membership.settings import Runtime as MembershipRuntime
from datarecon.experiments.reproduce import cost
from datarecon.experiments.pipeline.common import (
    BatchRun,
    EvalSettings,
    KKTRunSpec,
    RunGrouping,
    TargetTraining,
    attack_batch_piece,
    attack_piece,
    by_fpr,
    evaluate_piece,
    finite,
    model_dir,
    pool_piece,
    train_piece,
    write_csv,
)
from datarecon.experiments.pipeline.report_parts import csv_table, figure_piece, grid_figure
from datarecon.experiments.pipeline.pieces import Context, Piece
from datarecon.kernel.files import METRICS_FILE, PRIVACY_CSV, RECONSTRUCTIONS_PNG
from datarecon.report.figures import save_figure, sorted_ssim_curve, ssim_vs_margin
from datarecon.report.html import FigureItem, Section, Table
from datarecon.report.style import figure_caption
from datarecon.report.text import headline_lead
from datarecon.training.target import ArchConfig, MarginAscentConfig, StopConfig
from datarecon.utils.io import atomic_write_json, read_json


class HaimDataset(BaseModel):
    """One binary task of the paper with its attack runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str
    task: str
    runs: tuple[KKTRunSpec, ...]


_MNIST_RUNS = (KKTRunSpec(init_scale=0.035, lr_x=0.0305, lambda_min=0.447, alpha=149.9),
               KKTRunSpec(init_scale=1.74e-3, lr_x=0.282, lambda_min=0.415, alpha=19.2),
               KKTRunSpec(init_scale=1.74e-3, lr_x=0.282, lambda_min=0.415, alpha=19.2, seed=1))
_CIFAR_RUNS = (KKTRunSpec(init_scale=8.86e-4, lr_x=0.555, lambda_min=0.498, alpha=19.1),
               KKTRunSpec(init_scale=4.47e-3, lr_x=0.346, lambda_min=0.494, alpha=21.7),
               KKTRunSpec(init_scale=8.86e-4, lr_x=0.555, lambda_min=0.498, alpha=19.1, seed=1))


class StrongestAttacker(BaseModel):
    """The strongest attacker's row beside the paper's method: subspace membership of the
    training images from the weights alone and with θ_init known (rebuilt from the recorded seed).

    Attributes:
        membership: measure ``datarecon membership --evaluate`` on every target (seconds).
        known_init: also with the initialisation known.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    membership: bool = True
    known_init: bool = True


class HaimConfig(RecordedConfig):
    """Everything that determines the Haim et al. (2022) reproduction (defaults: paper scale).

    Attributes:
        datasets: the tasks, each with its attack runs (defaults: the reference's best shipped runs).
        n_per_class: training images per side (250: n = 500).
        n_heldout_per_class: held-out test images per side (null baseline, privacy measurement).
        target: training of the targets (D-w-w-1, bias-free, first layer N(0,1)·1e-4).
        attack: the KKT attack settings shared by all runs (steps, λ learning rate, float64, ...).
        candidates_factor: m = factor × n (Haim: 2).
        keep: number of runs whose candidates are pooled, chosen by ``selection``.
        selection: attacker-side run criterion (``datarecon.attacks.selection``).
        strongest: the strongest attacker's row (:class:`StrongestAttacker`).
        stand_in: a second target per task, a stand-in for the reference's 10⁶ constant-lr epochs: the same
            training continued by margin ascent (this stage, e.g. to convergence), attacked, pooled and evaluated
            the same way, its rows beside the loss-normalised target's (docs/RESULTS.md: the regime that identified
            the training data best); None: the loss-normalised target alone.

    The published scale trains 30 000 epochs (the loss-normalised step freezes the weights long before
    that, docs/RESULTS.md) and attacks in float32 (float64's counts and residual curves on the measured
    targets, benchmarks/bench_dtype.py), which keeps its ``--dry-run --device cuda`` estimate short
    (docs/PERFORMANCE.md §6).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    added_fields: ClassVar[tuple[str, ...]] = ("stand_in",)  # unset: the config as before

    datasets: tuple[HaimDataset, ...] = (HaimDataset(dataset="mnist", task="odd-even", runs=_MNIST_RUNS),
                                         HaimDataset(dataset="cifar10", task="vehicles-animals", runs=_CIFAR_RUNS))
    n_per_class: int = Field(default=250, gt=0)
    n_heldout_per_class: int = Field(default=250, ge=1)
    target: TargetTraining = TargetTraining(
        arch=ArchConfig(name="mlp", hidden=(1000, 1000), bias=False, init_scale=1e-4), loss="logistic",
        optimizer="gd", lr=0.01, schedule="loss-normalised", max_lr_factor=1e9, epochs=30_000,
        stop=StopConfig(margin_patience=10_000), dtype="float64", kkt_score=True)
    attack: KKTConfig = KKTConfig(steps=50_000, lr_lambda=1e-4, dtype="float32")
    candidates_factor: int = Field(default=2, ge=1)
    keep: int = Field(default=2, ge=1)
    selection: str = "relative_residual"
    evaluation: EvalSettings = EvalSettings(grid_max=40)
    # the runs of one task share its target: one piece steps them together (runs with the same
    # objective in one vmapped gradient; attacks/batched.py, benchmarks/bench_batched_runs.py)
    run_grouping: RunGrouping = "auto"
    strongest: StrongestAttacker = StrongestAttacker()
    stand_in: MarginAscentConfig | None = None


    def data_spec(self, ds: HaimDataset) -> dict[str, Any]:
        return {"dataset": ds.dataset, "task": ds.task, "n_per_class": self.n_per_class, "selection": "first",
                "normalisation": "unit-minus-mean", "n_partition_per_class": 0,
                "n_heldout_per_class": self.n_heldout_per_class}


def _name(ds: HaimDataset) -> str:
    return ds.dataset


#: how the table and the report name the stand-in's target (the loss-normalised one is named by its schedule)
STAND_IN_LABEL = "margin ascent (a stand-in for the reference's 10^6 epochs)"


def variants(cfg: HaimConfig) -> list[tuple[HaimDataset, str, TargetTraining]]:
    """Every target the reproduction attacks: (task, piece name, training) — per task the configured target and,
    with ``cfg.stand_in``, the same training continued by that margin ascent (named ``<dataset>-ascent``)."""
    out = []
    for ds in cfg.datasets:
        out.append((ds, _name(ds), cfg.target))
        if cfg.stand_in is not None:
            out.append((ds, f"{_name(ds)}-ascent", cfg.target.model_copy(update={"margin_ascent": cfg.stand_in})))
    return out


def plan(cfg: HaimConfig) -> list[Piece]:
    """All pieces, in dependency order."""
    CRITERIA.get(cfg.selection)  # unknown name: DataReconError listing the registered criteria
    pieces: list[Piece] = []
    for ds, name, t in variants(cfg):
        mkey = f"models/{name}"
        shape = cost.INPUT_SHAPES.get(ds.dataset, cost.CIFAR_SHAPE)
        n = 2 * cfg.n_per_class
        pieces.append(train_piece(mkey, t, cfg.data_spec(ds), estimate=cost.estimate_training(
            t.arch, n=n, epochs=t.epochs + t.margin_ascent.steps, optimizer=t.optimizer, dtype=t.dtype,
            input_shape=shape)))
        refs: list[tuple[str, str | None]] = []
        batch: dict[str, BatchRun] = {}
        for j, r in enumerate(ds.runs):
            acfg = cfg.attack.model_copy(update={"lr_x": r.lr_x, "lambda_min": r.lambda_min, "alpha": r.alpha})
            init = {"name": "gaussian", "scale": r.init_scale}
            if cfg.run_grouping == "separate":
                key = f"runs/{name}/run{j}"
                pieces.append(attack_piece(key, model_key=mkey, method="kkt",
                                           attack=BatchRun(config=acfg, init=init, seed=r.seed),
                                           candidates_factor=cfg.candidates_factor,
                                           estimate=cost.estimate_kkt(t.arch, m=cfg.candidates_factor * n,
                                                                      steps=acfg.steps, dtype=acfg.dtype,
                                                                      input_shape=shape)))
                refs.append((key, None))
            else:
                batch[f"run{j}"] = BatchRun(config=acfg, init=init, seed=r.seed)
                refs.append((f"runs/{name}", f"run{j}"))
        if batch:
            # runs batch together only where their objective is the same (attacks/batched.py): the
            # estimate counts the largest such group batched and the others one by one
            groups: dict[tuple[float, float], int] = {}
            for r in ds.runs:
                groups[(r.lambda_min, r.alpha)] = groups.get((r.lambda_min, r.alpha), 0) + 1
            parts = [cost.estimate_kkt(t.arch, m=cfg.candidates_factor * n, steps=cfg.attack.steps,
                                       dtype=cfg.attack.dtype, input_shape=shape, runs=k, mode=cfg.run_grouping)
                     for k in groups.values()]
            pieces.append(attack_batch_piece(f"runs/{name}", model_key=mkey, method="kkt", runs=batch,
                                             candidates_factor=cfg.candidates_factor, mode=cfg.run_grouping,
                                             estimate=_sum_estimates(parts, together=cfg.run_grouping != "looped")))
        pieces.append(pool_piece(f"pool/{name}", refs, keep=cfg.keep, criterion=cfg.selection))
        pieces.append(evaluate_piece(f"eval/{name}", model_key=mkey, run_key=f"pool/{name}",
                                     settings=cfg.evaluation))
        pieces.append(_figures_piece(name, cfg))
        if cfg.strongest.membership and name == _name(ds):  # membership of the configured target only
            pieces.append(_membership_piece(name, mkey, known_init=cfg.strongest.known_init))
    pieces.append(_tables_piece(cfg))
    return pieces


def _membership_piece(name: str, model_key: str, *, known_init: bool) -> Piece:
    """Membership of the target's training images against non-members from the unused part of its training split
    (:func:`datarecon.experiments.membership.evaluate.evaluate_membership`: every signal without reference models; the
    subspace test's row is kept), weights only and with θ_init known."""

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, spec in (("weights only", None), ("θ_init known", "seed")):
            if spec is not None and not known_init:
                continue
            res = evaluate_membership(model_dir(ctx, model_key), settings=MembershipSettings().without_references(),
                                      knowledge=KnowledgeSettings(known_init=spec),
                                      runtime=MembershipRuntime(data_dir=ctx.data_dir, log=lambda _: None))
            sub = res["signals"]["subspace"]
            out[label] = {"roc": sub.get("report"), "line": sub.get("line") or sub["note"], "subspace": res["subspace"],
                          "strongest": res["strongest"], "candidates": res["candidates"],
                          "signals": {k: v.get("report") for k, v in res["signals"].items()}}
        atomic_write_json(d / "membership.json", out)
        return out

    return Piece(key=f"membership/{name}", run=run, spec={"known_init": known_init}, deps=(model_key,),
                 kind="evaluate")


def _strongest_table(path: Path) -> Any:
    """The report's compact view of ``strongest.csv`` (AUC and its CI in one cell; the CSV keeps every column)."""
    with open(path, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    fprs = [k for k in (rows[0] if rows else {}) if k.startswith("tpr_at_fpr_")]

    def three_digits(v: str | None) -> str:
        try:
            return f"{float(v):.3f}"
        except (TypeError, ValueError):
            return v or "–"

    body = [[r["dataset"], r["attacker"], r["members"], r["non_members"],
             f"{three_digits(r['auc'])} [{three_digits(r['auc_ci_low'])}, {three_digits(r['auc_ci_high'])}]",
             *[three_digits(r[k]) for k in fprs], r["subspace_k"], r.get("strongest_signal") or "–",
             three_digits(r.get("loss_auc"))] for r in rows]
    return Table(caption="Subspace membership, training images vs non-members drawn from the unused part of the "
                         "training split (the reported part of the calibration split): ROC AUC [95% CI] and TPR at low "
                         "FPR ('not estimable' below 100 / 1000 non-members); the strongest signal of datarecon "
                         "membership and the loss threshold's AUC beside it",
                 header=["dataset", "attacker", "members", "non-members", "AUC [95% CI]",
                         *[f"TPR @ {k.removeprefix('tpr_at_fpr_')} FPR" for k in fprs], "k", "strongest",
                         "loss AUC"], rows=body)


def strongest_rows(ctx: Context, cfg: HaimConfig) -> list[dict[str, Any]]:
    """The strongest attacker beside the paper's method: subspace membership per dataset and threat model."""
    rows = []
    if not cfg.strongest.membership:
        return rows
    for ds in cfg.datasets:
        for label, res in ctx.summary(f"membership/{_name(ds)}").items():
            roc = res["roc"]
            ci = roc.get("auc_ci") or [None, None]
            tpr = roc.get("tpr_at_fpr") or {}
            strongest = res.get("strongest") or {}
            loss = (res.get("signals") or {}).get("loss") or {}
            rows.append({"dataset": _name(ds), "attacker": label,
                         "test": "subspace membership (training vs unused training-split images)",
                         "members": roc.get("n_members"), "non_members": roc.get("n_nonmembers"),
                         "strongest_signal": strongest.get("name"), "loss_auc": finite(loss.get("auc")),
                         "auc": finite(roc.get("auc")), "auc_ci_low": finite(ci[0]), "auc_ci_high": finite(ci[1]),
                         **{f"tpr_at_fpr_{f}": (finite(t) if t is not None else "not estimable")
                            for f, t in by_fpr(tpr)},
                         "subspace_k": res["subspace"].get("k")})
    return rows


def _sum_estimates(parts: list[Any], *, together: bool = False) -> Any:
    """``estimate(device)``: the sum of ``parts`` (None if any is unknown); its ``memory_bytes`` is the
    largest part's (one after the other) or, ``together``, their sum (the runs' states live at once)."""

    def estimate(device: str) -> float | None:
        values = [p(device) for p in parts]
        return None if any(v is None for v in values) else float(sum(values))

    mem = [getattr(p, "memory_bytes", None) for p in parts]
    if mem and all(v is not None for v in mem):
        estimate.memory_bytes = sum(mem) if together else max(mem)  # type: ignore[attr-defined]
    return estimate


def _figures_piece(name: str, cfg: HaimConfig) -> Piece:
    ekey = f"eval/{name}"

    def draw(ctx: Context, d: Path) -> list[str]:
        m = read_json(ctx.dir(ekey) / METRICS_FILE)
        window = f"{m.get('window')} {m.get('window_size')}x{m.get('window_size')}"
        curves = dict(((m.get("baselines") or {}).get("haim_ssim") or {}).get("curves") or {})
        curves = {("reconstructions" if k == "real" else k): v for k, v in curves.items() if v}
        if not curves:
            curves = {"reconstructions": m["haim"]["sorted_ssim"]}
        save_figure(sorted_ssim_curve(curves, window=window, title=f"{name}: sorted SSIM (Haim protocol)",
                                      calibrated=(m.get("headline") or {}).get("threshold")),
                    d / "sorted_ssim.png")
        per = m["haim"]["per_train"]
        save_figure(ssim_vs_margin(per["ssim"], per["margin"], title=f"{name}: SSIM vs output margin"),
                    d / "ssim_vs_margin.png")
        grid_figure(ctx.dir(ekey) / "grid-train-similarity.safetensors", sets=("train",),
                    max_items=cfg.evaluation.grid_max, png=d / RECONSTRUCTIONS_PNG,
                    title=f"{name}: best-matched reconstructions and their nearest training image (SSIM)")
        return ["sorted_ssim.png", "ssim_vs_margin.png", RECONSTRUCTIONS_PNG]

    return figure_piece(f"figures/{name}", deps=[ekey], draw=draw, spec={"k": cfg.evaluation.grid_max})


def table_rows(ctx: Context, cfg: HaimConfig) -> list[dict[str, Any]]:
    """One row per dataset: target diagnostics, selection, Haim counts with null baselines."""
    rows = []
    for ds, name, _ in variants(cfg):
        tm = ctx.summary(f"models/{name}").get("metrics", {})
        m = read_json(ctx.dir(f"eval/{name}") / METRICS_FILE)
        haim = m.get("haim") or {}
        base = (m.get("baselines") or {}).get("haim_ssim") or {}
        pool = ctx.summary(f"pool/{name}")

        def count(part: Mapping[str, Any] | None, t: str = "0.4") -> Any:
            return ((part or {}).get("counts") or {}).get(t)

        head = m.get("headline") or {}
        cal = head.get("calibrated") or {}
        regime = {} if cfg.stand_in is None else {"target": STAND_IN_LABEL if name != _name(ds) else
                                                  f"{cfg.target.schedule} GD, {tm.get('epochs_done')} epochs"}
        rows.append({
            "dataset": name, **regime, "task": ds.task, "n_train": tm.get("n_train"),
            "train_epochs": tm.get("epochs_done"), "train_accuracy": finite(tm.get("train_accuracy")),
            "train_loss": finite(tm.get("train_loss")), "normalised_margin": finite(tm.get("normalised_margin")),
            "kkt_regime_score": finite(tm.get("kkt_regime_score")),
            **({} if cfg.stand_in is None else {"ascent_steps": tm.get("margin_ascent_steps", 0)}),
            "runs": len(ds.runs), "pooled_runs": len(pool.get("chosen", [])), "m_pooled": pool.get("m"),
            "ssim_window": f"{m.get('window')} {m.get('window_size')}",
            # the headline of every report: the count at max(0.4, t) beside its nulls ...
            "count": head.get("count"), "count_heldout": head.get("heldout"), "count_noise": head.get("noise"),
            "threshold": finite(head.get("threshold")), "null_threshold": finite(cal.get("null_threshold")),
            # ... and the papers' fixed 0.4 beside its nulls
            "count_ssim_gt_0.4": (haim.get("counts") or {}).get("0.4"),
            "count_heldout_gt_0.4": count(base.get("heldout")), "count_noise_gt_0.4": count(base.get("noise")),
            "mean_ssim": finite(haim.get("mean_ssim")),
        })
    return rows


def _tables_piece(cfg: HaimConfig) -> Piece:
    names = [name for _, name, _ in variants(cfg)]
    deps = [f"models/{n}" for n in names] + [f"pool/{n}" for n in names] + [f"eval/{n}" for n in names] + \
           ([f"membership/{_name(ds)}" for ds in cfg.datasets] if cfg.strongest.membership else [])

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        rows = table_rows(ctx, cfg)
        write_csv(d / "haim.csv", rows)
        priv = []
        for name in names:
            p = ctx.summary(f"eval/{name}").get("privacy") or {}
            for score, v in sorted((p.get("scores") or {}).items()):  # stable row order
                ci = v.get("auc_ci_95") or [None, None]
                priv.append({"dataset": name, "score": score, "n_real": p.get("n_real"), "n_fake": p.get("n_fake"),
                             "auc": finite(v.get("auc")), "auc_ci_low": finite(ci[0]), "auc_ci_high": finite(ci[1]),
                             **{f"tpr_at_fpr_{f}": finite(t) for f, t in by_fpr(v.get("tpr_at_fpr") or {})}})
        write_csv(d / PRIVACY_CSV, priv)
        write_csv(d / "strongest.csv", strongest_rows(ctx, cfg))
        return {"rows": rows, "files": ["haim.csv", PRIVACY_CSV, "strongest.csv"]}

    return Piece(key="tables", run=run, spec={}, deps=tuple(deps), kind="table")


def _stand_in_text(cfg: HaimConfig) -> list[str]:
    """The report's sentence on the stand-in target (none without one)."""
    a = cfg.stand_in
    if a is None:
        return []
    stop = f", stopped once the normalised margin rose by less than {a.rtol:g} over {a.window} steps" if a.rtol else ""
    return [f"Each task has a second target, <dataset>-ascent: the same training continued by margin ascent "
            f"({a.steps} steps at most{stop}), a stand-in for the reference's 10^6 constant-lr epochs, which this "
            "scale cannot train; the loss-normalised target's rows stay beside it."]


def report_sections(ctx: Context, cfg: HaimConfig, *, scale: str, timings: Mapping[str, float]) -> list[Any]:
    """The report's sections."""
    priv_notes, head_notes = [], []
    for _, name, _ in variants(cfg):
        summary = ctx.summary(f"eval/{name}")
        v = signal_verdict(summary.get("privacy") or {})
        priv_notes.append(f"{name}: {v.lead}" + (f" ({v.measured})" if v.measured else "")
                          + (f" — {v.needs}" if v.needs else ""))
        if summary.get("headline"):
            h = summary["headline"]
            head_notes.append(f"{name}: {headline_lead(h)}" + "".join(f"; {n}" for n in h.get("notes") or []))
    secs = [Section(title="Setup", text=[
        f"Scale: {scale}. n = {2 * cfg.n_per_class} per task (first {cfg.n_per_class} per side), "
        f"m = {cfg.candidates_factor}n candidates per run; the best {cfg.keep} runs by the attacker-side "
        f"criterion {cfg.selection!r} are pooled. Targets trained with the loss-normalised step size; "
        "their KKT-regime score (0 = θ* is exactly a non-negative combination of the training gradients) "
        "is in the table.", *_stand_in_text(cfg)], code=cfg.model_dump_json(indent=2)),
        Section(title="Summary", text=head_notes + [
            "Headline rule (every report): a training image counts when the SSIM of its matched candidate exceeds "
            "max(0.4, t), t the threshold that held-out images used as candidates pass for at most 5% of the "
            "training images; the papers' fixed SSIM > 0.4 count stands beside it with its own nulls."],
            tables=[csv_table(ctx.dir("tables") / "haim.csv",
                          "Haim protocol: training images reconstructed at max(0.4, t) and at the papers' 0.4, each "
                          "beside its held-out and noise nulls"),
                    csv_table(ctx.dir("tables") / PRIVACY_CSV,
                          "Privacy: attacker-side signals, candidates closer to a training image than to any held-out "
                          "image against the others (AUC with 95% CI; TPR empty where not estimable)")],
            notes=priv_notes)]
    strongest = ctx.dir("tables") / "strongest.csv"
    if strongest.is_file() and strongest.read_text().strip():
        secs.append(Section(title="The strongest attacker", text=[
            "Beside the paper's method: is an image a training image? Scored by its distance to the training "
            "subspace of the first layer (W from the weights alone, W − θ_init with the initialisation known), the "
            "training images against the held-out images."],
            tables=[_strongest_table(strongest)]))
    for ds, name, _ in variants(cfg):
        d = ctx.dir(f"figures/{name}")
        secs.append(Section(title=f"{name} ({ds.task})", figures=[
            FigureItem(caption=f"{name}: {figure_caption(f)}", png=(d / f).read_bytes())
            for f in ctx.summary(f"figures/{name}")["files"]]))
    secs.append(Section(title="Timings", tables=[Table(caption="wall time per piece kind (s, this invocation)",
                                                       header=["kind", "seconds"],
                                                       rows=[[k, v] for k, v in timings.items()])]))
    return secs

