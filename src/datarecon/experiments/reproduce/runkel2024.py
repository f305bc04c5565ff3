"""Reproduction of Runkel, Gandikota, Geiping, Schönlieb, Moeller (2024), "Training Data
Reconstruction: Privacy due to Uncertainty?" (arXiv 2412.08544): every experiment of §4.

* Targets (§4.3): affine (eq. 8) and one-hidden (eq. 9) binary CIFAR-10 vehicles/animals
  classifiers, full batch, with weight decay (the lower-level problem needs a finite minimiser);
  a D-h-h-1 MLP with biases for DecoReco (§4.4).
* Table 1 / Figures 1-4: the bilevel attack (eq. 2, update 7) from random U(0,1), ground-truth
  and partition initialisations, θ⁰ ~ U(0,1); ‖θ* − θ‖² after the solve.
* Figures 5-9: DecoReco from N(0,1) (untuned), N(0,1)·s (tuned scale of the reference code),
  and partition initialisations; the rank view of Fig. 6/7.
* Figures 10-12: the 5x5 (λ₁, λ₂) mixture landscape (eq. 10) for the bilevel attack on the
  affine target and for DecoReco, and the two interpolation curves.
* The paper's question, measured: ROC AUC / TPR at low FPR of attacker-side scores for telling
  real training images among the reconstructions (METHODS §5).

One frozen config (:class:`RunkelConfig`); the defaults are the published scale, the presets
``runkel2024-<scale>.yaml`` override what differs.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.bilevel.config import BilevelConfig
from datarecon.attacks.kkt import DecoRecoConfig
from datarecon.config import MAX_SEED, MAX_STEPS
from datarecon.evaluation.membership import membership_roc
from datarecon.evaluation.privacy import signal_verdict
from datarecon.experiments.reproduce import cost
from datarecon.experiments.pipeline.common import (
    BatchRun,
    EvalSettings,
    RunGrouping,
    TargetTraining,
    attack_batch_piece,
    attack_piece,
    evaluate_piece,
    finite,
    train_piece,
    write_csv,
)
from datarecon.experiments.pipeline.report_parts import (csv_table, figure_piece, grid_figure, headline_rows,
                                                          nearest_rows, privacy_rows)
from datarecon.experiments.pipeline.pieces import Context, Piece
from datarecon.kernel.files import CANDIDATES_CSV, METRICS_FILE, PRIVACY_CSV
from datarecon.report.figures import interpolation_curves, landscape_heatmaps, neighbour_grid, save_figure
from datarecon.report.html import FigureItem, Section, Table
from datarecon.report.style import figure_caption
from datarecon.training.target import ArchConfig
from datarecon.utils.io import load_tensors, read_json

#: Runkel et al. 2024, Table 1: ‖θ* − θ‖² after the bilevel solve, θ⁰ random (METHODS §5).
PAPER_TABLE1: dict[str, dict[str, float]] = {
    "affine": {"random": 1.1214e-3, "ground-truth": 1.3888e-3, "partition": 2.9749e-3},
    "one-hidden": {"random": 6.1157e-5, "ground-truth": 1.7055e-3, "partition": 6.3629e-3},
}
#: x initialisations of §4.3 and the INITS entry each uses.
BILEVEL_INITS: dict[str, dict[str, Any]] = {
    "random": {"name": "uniform"},
    "ground-truth": {"name": "ground-truth"},
    "partition": {"name": "partition"},
}
MODELS = ("affine", "one-hidden")


class RunkelData(BaseModel):
    """Training data of every target: the first ``n_per_class`` images of each side.

    The paper does not state n; the default follows Haim et al. / Buzaglo et al. (250 per side).
    Partition images come from the CIFAR-10 training split, disjoint from the training images;
    held-out images (test split) serve only the privacy measurement.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_per_class: int = Field(default=250, gt=0)
    n_heldout_per_class: int = Field(default=250, ge=1)
    selection: str = "first"
    seed: int = 0

    def spec(self, *, partition_factor: int) -> dict[str, Any]:
        """The DataSpec mapping (partition: ``partition_factor`` × n per class)."""
        return {"dataset": "cifar10", "task": "vehicles-animals", "n_per_class": self.n_per_class,
                "selection": self.selection, "seed": self.seed, "normalisation": "unit-minus-mean",
                "n_partition_per_class": partition_factor * self.n_per_class,
                "n_heldout_per_class": self.n_heldout_per_class}


class DecoRecoSettings(BaseModel):
    """DecoReco runs (§4.4): attack config, the two Gaussian scales and the candidate count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attack: DecoRecoConfig = DecoRecoConfig(steps=50_000, lr_x=0.555, alpha=19.1, lambda_min=0.498)
    untuned_scale: float = Field(default=1.0, gt=0)
    tuned_scale: float = Field(default=8.86e-4, gt=0)
    candidates_factor: int = Field(default=2, ge=1)
    rank_top: int = Field(default=10, ge=1)


class LandscapeSettings(BaseModel):
    """The (λ₁, λ₂) mixture grid of §4.5 (eq. 10) and the steps per landscape run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grid: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    bilevel_steps: int | None = Field(default=None, ge=0, le=MAX_STEPS)
    decoreco_steps: int | None = Field(default=None, ge=0, le=MAX_STEPS)
    # the DecoReco landscape runs share one target: one piece steps them together (each run keeps its
    # own state, stop and run directory; attacks/batched.py). benchmarks/bench_batched_runs.py, PERFORMANCE §6.
    decoreco_grouping: RunGrouping = "auto"


class RunkelConfig(BaseModel):
    """Everything that determines the Runkel et al. (2024) reproduction (defaults: paper scale)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data: RunkelData = RunkelData()
    affine: TargetTraining = TargetTraining(arch=ArchConfig(name="affine"), weight_decay=1e-2,
                                            optimizer="lbfgs", lr=1.0, epochs=2000)
    one_hidden: TargetTraining = TargetTraining(arch=ArchConfig(name="one-hidden", hidden=(6144,)),
                                                weight_decay=1e-2, optimizer="lbfgs", lr=1.0, epochs=2000)
    decoreco_target: TargetTraining = TargetTraining(arch=ArchConfig(name="mlp", hidden=(1000, 1000), bias=True),
                                                     weight_decay=7.5e-4, optimizer="lbfgs", lr=1.0, epochs=5000)
    # The outer step is chosen from the problem (Polyak trial + Armijo backtracking on ‖θ* − θ(x)‖²,
    # BilevelConfig.lr_x = None): no step size to tune, ground-truth starts stay put.
    bilevel_affine: BilevelConfig = BilevelConfig(steps=1000)
    # ReLU target: the attack detects the kinks and uses its measured-best treatment (damped CG,
    # μ = 0.1, outer steps of at most 1 % of ‖x‖; docs/PERFORMANCE.md §5, benchmarks/bench_bilevel_relu.py).
    bilevel_one_hidden: BilevelConfig = BilevelConfig(steps=1000)
    decoreco: DecoRecoSettings = DecoRecoSettings()
    landscape: LandscapeSettings = LandscapeSettings()
    evaluation: EvalSettings = EvalSettings()
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


# ---------------------------------------------------------------------------------------------
# plan


def _bilevel_cfg(cfg: RunkelConfig, model: str) -> BilevelConfig:
    return cfg.bilevel_affine if model == "affine" else cfg.bilevel_one_hidden


def _kkt_estimate(cfg: RunkelConfig, attack: DecoRecoConfig, n: int, *, runs: int = 1, mode: str = "looped"):
    return cost.estimate_kkt(cfg.decoreco_target.arch, m=cfg.decoreco.candidates_factor * n, steps=attack.steps,
                             dtype=attack.dtype, runs=runs, mode=mode)


def _mix_key(l1: float, l2: float) -> str:
    return f"l1-{l1:g}_l2-{l2:g}"


def _train_estimate(t: TargetTraining, n: int):
    return cost.estimate_training(t.arch, n=n, epochs=t.epochs, optimizer=t.optimizer, dtype=t.dtype)


def _bilevel_estimate(cfg: RunkelConfig, model: str, acfg: BilevelConfig, n: int):
    arch = cfg.affine.arch if model == "affine" else cfg.one_hidden.arch
    return cost.estimate_bilevel(acfg, arch, m=n, kinks=model != "affine")  # one-hidden: ReLU


def plan(cfg: RunkelConfig) -> list[Piece]:
    """All pieces of the reproduction, in dependency order (attack and training pieces carry a
    wall-time estimate for ``--dry-run``, :mod:`.cost`)."""
    ev = cfg.evaluation
    n = 2 * cfg.data.n_per_class  # binary task: n_per_class per side
    bilevel_data = cfg.data.spec(partition_factor=1)
    deco_data = cfg.data.spec(partition_factor=cfg.decoreco.candidates_factor)
    pieces: list[Piece] = [
        train_piece("models/affine", cfg.affine, bilevel_data, estimate=_train_estimate(cfg.affine, n)),
        train_piece("models/one-hidden", cfg.one_hidden, bilevel_data, estimate=_train_estimate(cfg.one_hidden, n)),
        train_piece("models/decoreco-mlp", cfg.decoreco_target, deco_data,
                    estimate=_train_estimate(cfg.decoreco_target, n)),
    ]
    # Table 1, Figures 1-4: bilevel x {random, ground truth, partition}
    for model in MODELS:
        for name, init in BILEVEL_INITS.items():
            run = f"runs/bilevel/{model}/{name}"
            acfg = _bilevel_cfg(cfg, model)
            pieces.append(attack_piece(run, model_key=f"models/{model}", method="bilevel",
                                       attack=BatchRun(config=acfg, init=init, seed=cfg.seed),
                                       estimate=_bilevel_estimate(cfg, model, acfg, n)))
            pieces.append(evaluate_piece(f"eval/bilevel/{model}/{name}", model_key=f"models/{model}",
                                         run_key=run, settings=ev))
    # Figures 5-9: DecoReco untuned / tuned Gaussian and partition
    d = cfg.decoreco
    deco_inits = {"untuned": {"name": "gaussian", "scale": d.untuned_scale},
                  "tuned": {"name": "gaussian", "scale": d.tuned_scale},
                  "partition": {"name": "partition"}}
    for name, init in deco_inits.items():
        run = f"runs/decoreco/{name}"
        pieces.append(attack_piece(run, model_key="models/decoreco-mlp", method="decoreco",
                                   attack=BatchRun(config=d.attack, init=init, seed=cfg.seed),
                                   candidates_factor=d.candidates_factor, estimate=_kkt_estimate(cfg, d.attack, n)))
        pieces.append(evaluate_piece(f"eval/decoreco/{name}", model_key="models/decoreco-mlp", run_key=run,
                                     settings=ev))
    # Figures 10-12: landscape
    land = cfg.landscape
    land_bilevel = (cfg.bilevel_affine.model_copy(update={"steps": land.bilevel_steps})
                    if land.bilevel_steps is not None else cfg.bilevel_affine)
    land_deco = d.attack.model_copy(update={"steps": land.decoreco_steps}) if land.decoreco_steps is not None \
        else d.attack
    methods = {
        "bilevel": ("models/affine", land_bilevel, 1,
                    _bilevel_estimate(cfg, "affine", land_bilevel, n)),
        "decoreco": ("models/decoreco-mlp", land_deco, d.candidates_factor,
                     _kkt_estimate(cfg, land_deco, n)),
    }
    grouping = {"bilevel": "separate", "decoreco": land.decoreco_grouping}
    for method, (mkey, acfg, factor, est) in methods.items():
        points = [(l1, l2) for l1 in land.grid for l2 in land.grid]
        batch_key = f"runs/landscape/{method}"
        if grouping[method] != "separate":
            runs = {_mix_key(l1, l2): BatchRun(config=acfg, init={"name": "mix", "l1": l1, "l2": l2, "noise": "uniform"},
                                               seed=cfg.seed, record={"lambda1": l1, "lambda2": l2})
                    for l1, l2 in points}
            pieces.append(attack_batch_piece(batch_key, model_key=mkey, method=method, runs=runs,
                                             candidates_factor=factor, mode=grouping[method],
                                             estimate=_kkt_estimate(cfg, acfg, n, runs=len(runs),
                                                                    mode=grouping[method])))
        for l1, l2 in points:
            run = f"{batch_key}/{_mix_key(l1, l2)}"
            if grouping[method] == "separate":
                init = {"name": "mix", "l1": l1, "l2": l2, "noise": "uniform"}
                pieces.append(attack_piece(run, model_key=mkey, method=method,
                                           attack=BatchRun(config=acfg, init=init, seed=cfg.seed,
                                                           record={"lambda1": l1, "lambda2": l2}),
                                           candidates_factor=factor, estimate=est))
                ref: tuple[str, str | None] = (run, None)
            else:
                ref = (batch_key, _mix_key(l1, l2))
            pieces.append(evaluate_piece(f"eval/landscape/{method}/{_mix_key(l1, l2)}", model_key=mkey,
                                         run_key=ref[0], member=ref[1], settings=ev, light=True))
    pieces += _figure_pieces(cfg)
    pieces.append(_tables_piece(cfg))
    return pieces


# ---------------------------------------------------------------------------------------------
# figures


def _figure_pieces(cfg: RunkelConfig) -> list[Piece]:
    k = cfg.evaluation.grid_max
    out: list[Piece] = []

    def bilevel_fig(num: int, init: str, title: str) -> Piece:
        deps = [f"eval/bilevel/{m}/{init}" for m in MODELS]

        def draw(ctx: Context, d: Path) -> list[str]:
            files = []
            for letter, model in zip("ab", MODELS, strict=True):
                g = ctx.dir(f"eval/bilevel/{model}/{init}") / "grid-candidate.safetensors"
                if init == "partition":
                    for sub, sset in (("i", "train"), ("ii", "partition")):
                        f = f"fig{num:02d}{letter}{sub}_{model}_vs_{sset}.png"
                        grid_figure(g, sets=(sset,), max_items=k, png=d / f,
                                    title=f"Fig. {num}{letter}: bilevel, {model}, {title}: nearest {sset} image (SSIM)")
                        files.append(f)
                else:
                    f = f"fig{num:02d}{letter}_{model}.png"
                    grid_figure(g, sets=("train",), max_items=k, png=d / f,
                                title=f"Fig. {num}{letter}: bilevel, {model}, {title}: nearest training image (SSIM)")
                    files.append(f)
            return files

        return figure_piece(f"figures/fig{num:02d}", deps=deps, draw=draw, spec={"k": k})

    out.append(bilevel_fig(1, "random", "random x init"))
    out.append(bilevel_fig(2, "ground-truth", "ground-truth x init"))

    def partition_fig(num: int, model: str) -> Piece:
        key = f"eval/bilevel/{model}/partition"

        def draw(ctx: Context, d: Path) -> list[str]:
            files = []
            for letter, sset in (("a", "train"), ("b", "partition")):
                f = f"fig{num:02d}{letter}_{model}_vs_{sset}.png"
                grid_figure(ctx.dir(key) / "grid-candidate.safetensors", sets=(sset,), max_items=k, png=d / f,
                            title=f"Fig. {num}{letter}: bilevel, {model}, partition init: nearest {sset} image")
                files.append(f)
            return files

        return figure_piece(f"figures/fig{num:02d}", deps=[key], draw=draw, spec={"k": k})

    out.append(partition_fig(3, "affine"))
    out.append(partition_fig(4, "one-hidden"))

    def simple(num: int, key: str, grid: str, sets: tuple[str, ...], title: str, n: int) -> Piece:
        def draw(ctx: Context, d: Path) -> list[str]:
            f = f"fig{num:02d}.png"
            grid_figure(ctx.dir(key) / f"grid-{grid}.safetensors", sets=sets, max_items=n, png=d / f,
                        title=f"Fig. {num}: {title}")
            return [f]

        return figure_piece(f"figures/fig{num:02d}", deps=[key], draw=draw, spec={"n": n, "grid": grid})

    out.append(simple(5, "eval/decoreco/untuned", "candidate", ("train",),
                      "DecoReco, untuned N(0,1) init: first reconstructions vs nearest training image", k))
    out.append(_rank_piece(cfg))
    out.append(simple(8, "eval/decoreco/tuned", "candidate", ("train",),
                      "DecoReco, tuned scale: first reconstructions vs nearest training image", k))

    def deco_partition(ctx: Context, d: Path) -> list[str]:
        files = []
        for letter, sset in (("a", "train"), ("b", "partition")):
            f = f"fig09{letter}_vs_{sset}.png"
            grid_figure(ctx.dir("eval/decoreco/partition") / "grid-candidate.safetensors", sets=(sset,),
                        max_items=k, png=d / f, title=f"Fig. 9{letter}: DecoReco, partition init: nearest {sset} image")
            files.append(f)
        return files

    out.append(figure_piece("figures/fig09", deps=["eval/decoreco/partition"], draw=deco_partition, spec={"k": k}))
    out.append(_landscape_piece(cfg))
    return out


def _rank_piece(cfg: RunkelConfig) -> Piece:
    """Fig. 6/7: reconstructions as an adversary sees them, then the truth (rank in the training set).

    The candidates are ordered by the attacker-side score (output margin under θ*, highest first).
    ``train_rank`` is the rank of a candidate's best training-set similarity among all candidates
    (1 = the closest reconstruction of any training image); Fig. 7 marks which are in the top
    ``rank_top``. ``rank.csv`` lists them.
    """
    top, k = cfg.decoreco.rank_top, min(cfg.evaluation.grid_max, 10)
    key = "eval/decoreco/tuned"

    def draw(ctx: Context, d: Path) -> list[str]:
        g = load_tensors(ctx.dir(key) / "grid-score.safetensors")
        with open(ctx.dir(key) / CANDIDATES_CSV, encoding="utf-8") as fh:
            rows = {int(r["candidate"]): r for r in csv.DictReader(fh)}
        order = g["order"].tolist()[:k]
        ranks = [int(rows[i]["train_rank"]) for i in order]
        table = [{"shown": j + 1, "candidate": i, "score_margin": finite(rows[i].get("score_margin")),
                  "train_ssim": finite(rows[i].get("train_ssim")), "train_rank": r, f"in_top{top}": int(r <= top)}
                 for j, (i, r) in enumerate(zip(order, ranks, strict=True))]
        write_csv(d / "rank.csv", table)
        save_figure(neighbour_grid(g["candidates"][:k], {}, max_items=k,
                                   title=f"Fig. 6: DecoReco (tuned scale), the {k} candidates with the highest "
                                         f"attacker-side margin. Which are in the top {top} of the training set?"),
                    d / "fig06.png")
        marks = {"train": [float(s) for s in g["train_score"][:k]]}
        ranks_txt = ", ".join(f"#{j + 1}: rank {r}{'*' if r <= top else ''}" for j, r in enumerate(ranks))
        save_figure(neighbour_grid(g["candidates"][:k], {"train": g["train"][:k]}, scores=marks, max_items=k,
                                   title=f"Fig. 7: solution, nearest training image (SSIM); {ranks_txt} "
                                         f"(* = top {top})"), d / "fig07.png")
        return ["fig06.png", "fig07.png", "rank.csv"]

    return figure_piece("figures/fig06-07", deps=[key], draw=draw, spec={"top": top, "k": k})


def landscape_results(ctx: Context, cfg: RunkelConfig, method: str) -> dict[tuple[float, float], dict[str, Any]]:
    """``{(λ₁, λ₂): metrics.json}`` of one method's landscape."""
    g = cfg.landscape.grid
    return {(l1, l2): read_json(ctx.dir(f"eval/landscape/{method}/{_mix_key(l1, l2)}") / METRICS_FILE)
            for l1 in g for l2 in g}


def _landscape_piece(cfg: RunkelConfig) -> Piece:
    g = cfg.landscape.grid
    deps = [f"eval/landscape/{m}/{_mix_key(a, b)}" for m in ("bilevel", "decoreco") for a in g for b in g]

    def draw(ctx: Context, d: Path) -> list[str]:
        files = []
        for letter, method in (("a", "bilevel"), ("b", "decoreco")):
            res = landscape_results(ctx, cfg, method)
            f = f"fig10{letter}_{method}.png"
            save_figure(landscape_heatmaps(res, title=f"Fig. 10{letter}: {method}, mean L2 to the nearest image"),
                        d / f)
            files.append(f)
            f = f"fig11-12{letter}_{method}.png"
            save_figure(interpolation_curves(res, title=f"Fig. 11/12 ({method}): left GT↔partition (λ₂=1), "
                                                        f"right GT↔noise (λ₁=1)"), d / f)
            files.append(f)
        return files

    return figure_piece("figures/fig10-12", deps=deps, draw=draw, spec={"grid": list(g)})


# ---------------------------------------------------------------------------------------------
# tables


def _tables_piece(cfg: RunkelConfig) -> Piece:
    settings = _privacy_keys()
    g = cfg.landscape.grid
    land = [f"eval/landscape/{m}/{_mix_key(a, b)}" for m in ("bilevel", "decoreco") for a in g for b in g]

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        t1 = table1_rows(ctx)
        write_csv(d / "table1.csv", t1)
        write_csv(d / "nearest.csv", nearest_rows(ctx, settings))
        write_csv(d / PRIVACY_CSV, privacy_rows(ctx, settings))
        write_csv(d / "real_vs_fake.csv", real_vs_fake_rows(ctx))
        write_csv(d / "headline.csv", headline_rows(ctx, settings))
        lrows = []
        for method in ("bilevel", "decoreco"):
            for (l1, l2), met in landscape_results(ctx, cfg, method).items():
                row = {"method": method, "lambda1": l1, "lambda2": l2}
                row.update({f"mean_l2_{k}": finite(v) for k, v in (met.get("mean_l2_to_nearest") or {}).items()})
                lrows.append(row)
        write_csv(d / "landscape.csv", lrows)
        return {"table1": t1, "files": ["table1.csv", "nearest.csv", PRIVACY_CSV, "real_vs_fake.csv",
                                        "headline.csv", "landscape.csv"]}

    return Piece(key="tables", run=run, spec={"grid": list(g)}, deps=tuple(settings + land), kind="table")


def table1_rows(ctx: Context) -> list[dict[str, Any]]:
    """Table 1: ours vs the paper, one row per x initialisation, both models.

    Columns per model: ``_ours`` ‖θ* − θ‖² after the solve; ``_ours_per_param`` the same ÷ P (the
    paper calls its values an "average distance"; this reading matches their magnitudes);
    ``_x0_per_param`` ‖θ* − θ(x⁰)‖² ÷ P after the first inner solve, before any x update (the
    no-attack reference); ``_paper`` Runkel et al. Table 1.
    """
    rows = []
    for init in BILEVEL_INITS:
        row: dict[str, Any] = {"x_init": init}
        for model in MODELS:
            s = ctx.summary(f"eval/bilevel/{model}/{init}")
            row[f"{model}_ours"] = finite(s.get("param_distance"))
            row[f"{model}_ours_per_param"] = finite(s.get("param_distance_per_parameter"))
            row[f"{model}_x0_per_param"] = finite(s.get("param_distance_x0_per_parameter"))
            row[f"{model}_paper"] = PAPER_TABLE1[model][init]
        rows.append(row)
    return rows


def real_vs_fake_rows(ctx: Context) -> list[dict[str, Any]]:
    """Runkel's question, pooled per model: the bilevel reconstructions started at the training images
    and those started at the partition images, per attacker-side score the ROC AUC (bootstrap 95 %
    interval) and TPR at 1 % / 0.1 % FPR, or "not estimable" with too few fakes
    (:func:`datarecon.evaluation.membership.membership_roc`). Two labellings:

    * ``start``: real = started at a training image, fake = started at a partition image (which no
      training ever saw): the question as the paper asks it;
    * ``nearest image``: the evaluation's rule per candidate (its nearest training image beats every
      held-out image and the noise floor), which also calls real a fake that drifted next to a
      training image it resembles.
    """
    rows = []
    for model in MODELS:
        by_start: dict[str, list[dict[str, str]]] = {}
        for init in ("ground-truth", "partition"):
            path = ctx.dir(f"eval/bilevel/{model}/{init}") / CANDIDATES_CSV
            if path.is_file():
                with open(path, encoding="utf-8") as fh:
                    by_start[init] = list(csv.DictReader(fh))
        cands = [r for init in ("ground-truth", "partition") for r in by_start.get(init, [])]
        if len(by_start) < 2 or not cands:
            continue
        labellings = {"start": [True] * len(by_start["ground-truth"]) + [False] * len(by_start["partition"])}
        if "real" in cands[0]:
            labellings["nearest image"] = [r["real"] == "1" for r in cands]
        for labels, real in labellings.items():
            for name in sorted(k for k in cands[0] if k.startswith("score_")):
                values = [float(r[name]) for r in cands]
                roc = membership_roc([v for v, t in zip(values, real, strict=True) if t],
                                     [v for v, t in zip(values, real, strict=True) if not t], name=name[6:])
                rows.append({"model": model, "labels": labels, "score": roc.name, "n_real": roc.n_members,
                             "n_fake": roc.n_nonmembers, "auc": finite(roc.auc),
                             "auc_ci_low": roc.auc_ci[0] if roc.auc_ci else None,
                             "auc_ci_high": roc.auc_ci[1] if roc.auc_ci else None,
                             **{f"tpr_at_fpr_{f:g}": (finite(t) if t is not None else "not estimable")
                                for f, t in roc.tpr_at.items()}})
    return rows


# ---------------------------------------------------------------------------------------------
# report


def report_sections(ctx: Context, cfg: RunkelConfig, *, scale: str, timings: Mapping[str, float]) -> list[Any]:
    """The report's sections (tables + every figure PNG)."""

    def figs(key: str) -> list[FigureItem]:
        d = ctx.dir(key)
        return [FigureItem(caption=figure_caption(f), png=(d / f).read_bytes())
                for f in ctx.summary(key).get("files", []) if f.endswith(".png")]

    t = ctx.dir("tables")
    secs = [
        Section(title="Setup", text=[
            f"Scale: {scale}. Targets trained on the first {cfg.data.n_per_class} CIFAR-10 images per side "
            f"(vehicles vs animals), full batch with weight decay. Training/attack wall times per piece are in "
            f"each piece's DONE.json.",
            "Nearest neighbours are by SSIM (structurally most similar, window "
            f"{cfg.evaluation.window}); distances are L2 in display space [0,1].",
        ], code=cfg.model_dump_json(indent=2)),
        Section(title="Headline: training images reconstructed, per setting",
                text=["One rule for every report: a training image counts when the SSIM of its matched candidate "
                      "(Haim protocol) exceeds max(0.4, t), t the threshold that held-out images used as candidates "
                      "pass for at most 5% of the training images; the held-out and noise counts at that threshold "
                      "stand beside it. Partition and mixture starts count only matches whose SSIM to the training "
                      "image exceeds the candidate's SSIM to its own start by 0.1 (excluded: above the threshold "
                      "but not moved); ground-truth starts report how many candidates stay at their image "
                      "(retained) instead of a count."],
                tables=[csv_table(t / "headline.csv", "count beside its nulls, the rule that applied, SSIM to the start "
                              "vs to the training match")] if (t / "headline.csv").is_file() else []),
        Section(title="Table 1: parameter distance after the bilevel solve",
                tables=[csv_table(t / "table1.csv", "‖θ* − θ‖² (ours: sum and ÷ P; x0: ÷ P before any x update) next to Runkel et al. Table 1 (paper)")]),
        Section(title="Nearest-image distances per setting",
                tables=[csv_table(t / "nearest.csv", "mean L2 / SSIM of each reconstruction to its nearest image")]),
        Section(title="Figures 1-4: bilevel reconstructions",
                figures=figs("figures/fig01") + figs("figures/fig02") + figs("figures/fig03") + figs("figures/fig04")),
        Section(title="Figures 5-9: DecoReco reconstructions",
                figures=figs("figures/fig05") + figs("figures/fig06-07") + figs("figures/fig08") + figs("figures/fig09"),
                tables=[csv_table(ctx.dir("figures/fig06-07") / "rank.csv", "Fig. 6/7 candidates: training-set rank")]),
        Section(title="Figures 10-12: energy landscape", figures=figs("figures/fig10-12"),
                tables=[csv_table(t / "landscape.csv", "mean L2 to the nearest image per (λ₁, λ₂)")]),
        Section(title="Privacy: can an adversary tell which candidates match training images?",
                text=["Positives: candidates whose nearest training image is closer (SSIM) than every held-out image "
                      "and beats the best SSIM any of the noise-floor images reach; negatives: the others. Signals "
                      "are attacker-side only. An AUC is measured with at least 10 of each class, its 95% CI by a "
                      "stratified bootstrap; a signal separates the classes only when that CI lies above 0.5. TPR at "
                      "1% (0.1%) FPR needs at least 100 (1000) negatives and is empty otherwise."],
                notes=privacy_verdicts(ctx, keys=_privacy_keys()),
                tables=[csv_table(t / PRIVACY_CSV, "ROC AUC with 95% CI and TPR at low FPR per setting and signal"),
                        csv_table(t / "real_vs_fake.csv", "Real vs fake, pooled per model (Runkel's question): bilevel "
                              "reconstructions from ground-truth starts (real) and partition starts (fake), and the "
                              "same candidates labelled by the nearest-image rule above; the subspace signal is the "
                              "distance to the first layer's training subspace (attacker side)")]),
        Section(title="Timings", tables=[Table(caption="wall time per piece kind (s, this invocation)",
                                               header=["kind", "seconds"],
                                               rows=[[k, v] for k, v in timings.items()])]),
    ]
    return secs


def _privacy_keys() -> list[str]:
    return [f"eval/bilevel/{m}/{i}" for m in MODELS for i in BILEVEL_INITS] + \
        [f"eval/decoreco/{n}" for n in ("untuned", "tuned", "partition")]


def privacy_verdicts(ctx: Context, *, keys: list[str]) -> list[str]:
    """One line per setting: what its privacy measurement says (:func:`datarecon.evaluation.privacy.signal_verdict`)."""
    lines = []
    for key in keys:
        v = signal_verdict(ctx.summary(key).get("privacy") or {})
        lines.append(f"{key.removeprefix('eval/')}: {v.lead}" + (f" — {v.needs}" if v.needs else ""))
    return lines

