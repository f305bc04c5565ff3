"""The end-to-end demo: train → attack → evaluate → picture + report, on bundled data.

Runs on scikit-learn's 8x8 digits (ships with a dependency: no download):
a bias-free (homogeneous) ReLU MLP is trained on odd vs even digits until it
separates the training set, the KKT attack of Haim et al. (2022) reconstructs
m = 2n candidates from its weights alone, and the evaluation compares them
with the training images, held-out images and noise. Writes to ``out``::

    model/          the target's model directory
    run/            the attack's run directory (+ metrics.json, candidates.csv)
    reconstructions.png   candidates beside their nearest training images
    report.html     the self-contained report

Example:
    >>> from datarecon.experiments.demo import DemoConfig, run_demo
    >>> result = run_demo(DemoConfig(attack_steps=200), out="demo-out")  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.config import MAX_SEED, MAX_STEPS
from datarecon.data import DataSpec
from datarecon.evaluation import run_metrics
from datarecon.experiments.identifiability import attach_identifiability
from datarecon.experiments.membership.evaluate import attach_membership
from datarecon.experiments.reconstruct import RunOptions, reconstruct
from datarecon.kernel.files import NEIGHBOURS_FILE, RECONSTRUCTIONS_PNG, REPORT_HTML
from datarecon.kernel.outdir import claim_out_dir
from datarecon.registry import registered
from datarecon.report import render_report
from datarecon.report.figures import neighbour_grid, save_figure
from datarecon.report.text import headline_lines as report_headline_lines
from datarecon.training.optim import SCHEDULES
from datarecon.training.target import ArchConfig, StopConfig, TrainConfig, train_target
from datarecon.utils.io import load_tensors


class DemoConfig(BaseModel):
    """Settings of the demo (defaults finish in about a minute on 2 CPU cores)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # 10 per side: at 20 per side one held-out digit is a near copy of a training digit (SSIM 0.94), so
    # the null-calibrated threshold is 0.94 and the claim shrinks to 3 of 40 (null 2); at 10 per side
    # 13 of 20 at SSIM > 0.755 (null 1, noise 0). docs/PERFORMANCE.md gives the commands.
    n_per_class: int = Field(default=10, ge=1, description="training images per side (n = 2x this)")
    heldout_per_class: int | None = Field(
        default=None, ge=1, description="held-out digits per side, the null baseline's candidates (default "
        "2 x n_per_class: as many as the attack's m = 2n candidates, so the null is as strong as the attack)")
    hidden: int = Field(default=200, ge=1, description="hidden width of the 64-h-1 bias-free MLP")
    train_epochs: int = Field(default=3000, ge=1, le=MAX_STEPS)
    train_lr: float = Field(default=0.5, gt=0)
    # constant, not loss-normalised: at lr 0.5 the loss-normalised schedule ends with a smaller
    # normalised margin (0.048 vs 0.11) and the attack reaches residual 0.36 vs 0.007 (34 vs 36
    # of 40 at SSIM > 0.4, measured at n_per_class=20); docs/PERFORMANCE.md §1 gives the commands.
    train_schedule: Annotated[str, registered(SCHEDULES)] = Field(
        default="constant", description="training schedule (training.optim.SCHEDULES)")
    attack_steps: int = Field(default=2000, ge=1, le=MAX_STEPS)
    lr_x: float = Field(default=0.01, gt=0)
    lr_lambda: float = Field(default=0.01, gt=0)
    lambda_min: float = Field(default=0.2, ge=0)
    alpha: float = Field(default=20.0, gt=0)
    init_scale: float = Field(default=0.05, gt=0)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    threads: int = Field(default=1, ge=0, description="torch intra-op threads (0: PyTorch's default, all cores; "
                         "tiny model: 1 is fastest)")


@dataclass(frozen=True)
class DemoResult:
    """Paths and headline numbers of a demo run."""

    out: Path
    model_dir: Path
    run_dir: Path
    picture: Path
    report: Path
    train_accuracy: float
    relative_residual: float | None
    headline: dict[str, Any]
    n_train: int

    def headline_lines(self) -> list[str]:
        """The claim, in words, beside the null baselines (what ``datarecon demo`` prints)."""
        return headline_lines(self.headline, what="digits")


def run_demo(config: DemoConfig = DemoConfig(), *, out: str | Path, data_dir: str | Path | None = None,
             progress: bool = True, overwrite: bool = False) -> DemoResult:
    """Train, attack, evaluate and report (see module docstring).

    ``out`` must be empty or absent; with ``overwrite`` a demo folder is replaced (only what
    datarecon wrote there: :func:`datarecon.kernel.outdir.claim_out_dir`).
    """
    with claim_out_dir(out, kind="demo", overwrite=overwrite) as claim:
        claim.prepare()
        return _run_demo(config, out=Path(out), data_dir=data_dir, progress=progress)


def _run_demo(config: DemoConfig, *, out: Path, data_dir: str | Path | None, progress: bool) -> DemoResult:
    """The body of :func:`run_demo` once ``out`` is claimed and prepared."""
    # The demo's matrices are tiny: thread start-up costs more than it saves (measured 14 s with one
    # thread vs 95 s with two on the shared 2-core machine; docs/PERFORMANCE.md).
    if config.threads:
        torch.set_num_threads(config.threads)
    heldout = config.heldout_per_class if config.heldout_per_class is not None else 2 * config.n_per_class
    data = DataSpec(dataset="digits", task="odd-even", n_per_class=config.n_per_class, seed=config.seed,
                    n_heldout_per_class=heldout)
    train_cfg = TrainConfig(
        data=data, arch=ArchConfig(name="mlp", hidden=(config.hidden,), bias=False, init_scale=1e-3),
        loss="logistic", optimizer="gd", lr=config.train_lr, epochs=config.train_epochs, dtype="float64",
        schedule=config.train_schedule,
        seed=config.seed, stop=StopConfig(), log_every=100,
    )
    trained = train_target(train_cfg, data_dir=data_dir, out=out / "model", overwrite=True, progress=progress,
                           nested=True)
    attack_cfg = {"lr_x": config.lr_x, "lr_lambda": config.lr_lambda, "lambda_min": config.lambda_min,
                  "alpha": config.alpha}
    settings = {"attack": {"method": "kkt", **attack_cfg, "steps": config.attack_steps},
                "init": {"name": "gaussian", "scale": config.init_scale}, "seed": config.seed}
    rec = reconstruct(out / "model", settings, out / "run",
                      RunOptions(data_dir=data_dir, progress=progress, raise_on_divergence=True, nested=True))
    summary = run_metrics(out / "run", data_dir=data_dir, progress=progress)
    attach_membership(out / "run", data_dir=data_dir)
    attach_identifiability(out / "run", data_dir=data_dir)
    nb = load_tensors(out / "run" / NEIGHBOURS_FILE)
    fig = neighbour_grid(nb["candidates"], {"train": nb["train"]}, scores={"train": nb["train_score"].tolist()},
                         max_items=24, title="KKT reconstructions (left) beside their nearest training image",
                         indices={"train": nb["train_index"].tolist()}, total=int(nb["n_candidates"].reshape(-1)[0]),
                         sorted_by="SSIM to their nearest training image")
    picture = out / RECONSTRUCTIONS_PNG
    save_figure(fig, picture)
    report = render_report([out / "run"], out=out / REPORT_HTML, title="datarecon demo: KKT attack on digits")
    metrics: dict[str, Any] = getattr(trained, "metrics", {}) or {}
    return DemoResult(
        out=out, model_dir=out / "model", run_dir=out / "run", picture=Path(picture), report=Path(report),
        train_accuracy=float(metrics.get("train_accuracy", float("nan"))),
        relative_residual=rec.summary.get("selection", {}).get("relative_residual", {}).get("value"),
        headline=summary.get("headline") or {}, n_train=2 * config.n_per_class,
    )


def headline_lines(headline: dict[str, Any], *, what: str = "images") -> list[str]:
    """The headline in sentences (:func:`datarecon.report.text.headline_lines`: the count at max(0.4, t)
    beside its nulls, the threshold, the rule, then the papers' fixed-threshold count).

    Args:
        headline: ``summary["headline"]`` of :func:`datarecon.evaluation.run_metrics`.
        what: What the held-out images are called ("digits").
    """
    return report_headline_lines(headline, what=what)
