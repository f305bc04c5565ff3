"""The defence audit: how much do weight decay, training length and DP-SGD protect a target?

For a grid of defence settings (:class:`AuditConfig`, one-to-one with a YAML file; presets
``experiments/presets/audit-<scale>.yaml`` for ``smoke``, ``small`` and ``gpu``) and several
seeds, :func:`run_audit` trains each target, attacks it with the project's strongest
attacker-side configuration (several KKT runs, candidates of the best ``keep`` runs by an
attacker-side criterion pooled, as in the Haim et al. reproduction), evaluates the pool with the
held-out and noise nulls and the real-vs-fake measurement, and draws the answer: reconstruction
count and mean best SSIM against ε, weight decay and epochs, each with its null band and the
held-out accuracy, with the DP-SGD reconstruction bound (:mod:`datarecon.evaluation.dp_bound`)
beside the measured count.

Every (setting, seed) is one group of resumable pieces (:mod:`.pipeline.pieces`: a ``DONE.json``
marker per piece) run as one task on a sweep backend (:mod:`.backends`: a process pool by
default, Ray for large grids); the tables, figures and report run in the driver afterwards.
A rerun into the same folder skips every finished piece.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from datarecon.attacks.kkt import KKTConfig
from datarecon.attacks.selection import CRITERIA
from datarecon.config import MAX_STEPS, Seed, build_config, merge, read_config_mapping
from datarecon.errors import DataReconError
from datarecon.evaluation.dp_bound import prior_kappa, rero_bound
from datarecon.experiments.backends import Task, make_backend
from datarecon.experiments.execution import Execution
from datarecon.experiments.membership.evaluate import evaluate_membership
from datarecon.experiments.membership.folder import membership_section
from datarecon.experiments.membership.settings import MembershipSettings
from datarecon.experiments.membership.settings import Runtime as MembershipRuntime
from datarecon.experiments.pipeline.pieces import PRESETS_DIR, Runtime
from datarecon.experiments.pipeline.common import (
    BatchRun,
    EvalSettings,
    TargetTraining,
    attack_piece,
    evaluate_piece,
    finite,
    model_dir,
    write_csv,
)
from datarecon.experiments.pipeline.common import KKTRunSpec, pool_piece
from datarecon.experiments.pipeline.pieces import (
    Context,
    Piece,
    claim_reproduction,
    dry_run,
    entries,
    execute,
    piece_hashes,
)
from datarecon.kernel.files import AUDIT_JSON, METRICS_FILE, REPORT_HTML, REPRODUCTION_JSON, TIMINGS_JSON
from datarecon.report.defence import defence_figure, figure_caption, table_cell, target_line
from datarecon.report.figures import save_figure
from datarecon.report.html import FigureItem, Section, Table, write_report
from datarecon.training import dp as dpm
from datarecon.training.dp import DPConfig
from datarecon.training.target import ArchConfig, TargetMeasures, TrainConfig, train_target
from datarecon.utils.io import atomic_write_json, config_hash, read_json, versions

NAME = "audit"
#: scales with a preset file ``presets/audit-<scale>.yaml``
SCALES = ("smoke", "small", "gpu")
#: what a scale's counts cannot say, printed with them and written into the report
SCALE_CAVEATS = {"smoke": "--scale smoke checks the machinery end to end; its targets and attacks are too small for "
                          "its counts to measure a defence (0 reconstructed is no evidence of safety): --scale small "
                          "measures (docs/RESULTS.md, \"Defence audit\")"}
AXES = ("baseline", "weight_decay", "epochs", "dp")


class DPAxis(BaseModel):
    """The DP-SGD axis: one target per ``target_epsilons`` entry (σ solved by Opacus) and per
    ``noise_multipliers`` entry (σ given; 0 = clipping only, ε = ∞).

    Attributes:
        target_epsilons: ε values to reach at δ after all steps.
        noise_multipliers: σ values.
        max_grad_norm: per-sample clip norm C.
        batch_size: expected Poisson batch size B.
        delta: δ (None: 1/(10 n)).
        epochs: DP-SGD epochs (of round(n/B) steps); None: the base target's epochs.
        lr: DP-SGD learning rate; None: the base target's.
        accountant: Opacus accountant.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    target_epsilons: tuple[float, ...] = ()
    noise_multipliers: tuple[float, ...] = ()
    max_grad_norm: float = Field(default=1.0, gt=0)
    batch_size: int = Field(default=5, ge=1)
    delta: float | None = Field(default=None, gt=0, lt=1)
    epochs: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    lr: float | None = Field(default=None, gt=0)
    accountant: Literal["rdp", "prv", "gdp"] = "rdp"

    def configs(self) -> list[tuple[str, DPConfig]]:
        """(name, DPConfig) of every point of the axis."""
        common = {"max_grad_norm": self.max_grad_norm, "batch_size": self.batch_size, "delta": self.delta,
                  "accountant": self.accountant}
        out = [(f"eps{e:g}", DPConfig(target_epsilon=e, **common)) for e in self.target_epsilons]
        out += [(f"sigma{s:g}", DPConfig(noise_multiplier=s, **common)) for s in self.noise_multipliers]
        return out


class AuditConfig(BaseModel):
    """Everything that determines a defence audit (defaults: the ``small`` CPU scale).

    Attributes:
        dataset, task: the binary task (``DATASETS`` key, task name).
        n_per_class: training images per class (n = 2 · n_per_class).
        n_heldout_per_class: held-out images per class (the null, the real/fake measurement).
        target: the undefended target's training (the baseline of every axis).
        weight_decays: weight decays of the weight-decay axis (0 is the baseline; listed values ≠ 0 are added).
        epochs: training lengths of the epochs axis (the base ``target.epochs`` is the baseline).
        dp: the DP-SGD axis.
        seeds: target seeds (initialisation and DP batches/noise); the data are the same for all.
        attack: KKT settings shared by all runs.
        runs: the attack runs per target (x₀ scale, step sizes, λ floor, seed).
        candidates_factor: m = factor · n candidates per run.
        keep: runs pooled, chosen by ``selection`` (attacker-side).
        selection: attacker-side criterion (``datarecon.attacks.selection.CRITERIA``).
        evaluation: evaluation settings.
        bound_samples: Monte Carlo draws of the DP-SGD bound.
        membership: the membership measurement of every target (:func:`~datarecon.experiments.membership.
            evaluate.evaluate_membership`; ``references.count`` > 0 adds LiRA and RMIA, trained per target).
        model_membership: the membership measurement of ``audit --model DIR`` (one given model: the reference attacks
            by default, as many as their time budget allows).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dataset: str = "mnist"
    task: str = "odd-even"
    n_per_class: int = Field(default=10, ge=1)
    n_heldout_per_class: int = Field(default=20, ge=1)
    target: TargetTraining = TargetTraining(
        arch=ArchConfig(name="mlp", hidden=(100,), bias=False, init_scale=1e-3), loss="logistic", optimizer="gd",
        lr=0.5, epochs=2000, dtype="float64")
    weight_decays: tuple[float, ...] = (1e-4, 1e-3)
    epochs: tuple[int, ...] = (200, 8000)
    dp: DPAxis = DPAxis(target_epsilons=(1.0, 10.0, 100.0), batch_size=5, epochs=500)
    seeds: tuple[Seed, ...] = (0, 1)
    attack: KKTConfig = KKTConfig(steps=2000, lr_x=0.01, lr_lambda=0.01, lambda_min=0.2, dtype="float64")
    runs: tuple[KKTRunSpec, ...] = (
        KKTRunSpec(init_scale=0.05, lr_x=0.01, lambda_min=0.2, alpha=1.0, seed=0),
        KKTRunSpec(init_scale=0.05, lr_x=0.01, lambda_min=0.2, alpha=1.0, seed=1),
        KKTRunSpec(init_scale=1.74e-3, lr_x=0.282, lambda_min=0.415, alpha=19.2, seed=0))
    candidates_factor: int = Field(default=2, ge=1)
    keep: int = Field(default=2, ge=1)
    selection: str = "relative_residual"
    evaluation: EvalSettings = EvalSettings(n_floor_noise=500, grid_max=20)
    bound_samples: int = Field(default=20_000, ge=100)
    membership: MembershipSettings = MembershipSettings().without_references()
    model_membership: MembershipSettings = MembershipSettings()

    @model_validator(mode="after")
    def _valid(self) -> AuditConfig:
        if self.keep > len(self.runs):
            raise DataReconError(f"keep {self.keep} exceeds the {len(self.runs)} attack runs; lower keep or add runs")
        if not self.seeds:
            raise DataReconError("seeds is empty; list at least one target seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise DataReconError(f"seeds {list(self.seeds)} has duplicates")
        return self

    def data_spec(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "task": self.task, "n_per_class": self.n_per_class, "selection": "first",
                "normalisation": "unit-minus-mean", "n_partition_per_class": 0,
                "n_heldout_per_class": self.n_heldout_per_class}


class Setting(BaseModel):
    """One defence setting: the axis it belongs to, its value on that axis, and its training."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    axis: Literal["baseline", "weight_decay", "epochs", "dp"]
    value: float | None
    training: TargetTraining
    dp: DPConfig | None = None


def settings(cfg: AuditConfig) -> list[Setting]:
    """The grid: the baseline, then each axis's points (the baseline is every axis's reference)."""
    base = cfg.target
    out = [Setting(name="baseline", axis="baseline", value=None, training=base)]
    for wd in cfg.weight_decays:
        if wd != base.weight_decay:
            out.append(Setting(name=f"wd{wd:g}", axis="weight_decay", value=wd,
                               training=base.model_copy(update={"weight_decay": wd})))
    for ep in cfg.epochs:
        if ep != base.epochs:
            out.append(Setting(name=f"epochs{ep}", axis="epochs", value=float(ep),
                               training=base.model_copy(update={"epochs": ep})))
    dp_train = base.model_copy(update={"epochs": cfg.dp.epochs or base.epochs, "lr": cfg.dp.lr or base.lr,
                                       "schedule": "constant", "stop": type(base.stop)()})
    for name, dpc in cfg.dp.configs():
        out.append(Setting(name=f"dp-{name}", axis="dp", value=dpc.target_epsilon, training=dp_train, dp=dpc))
    return out


def _group(setting: str, seed: int) -> str:
    return f"{setting}/s{seed}"


def dp_train_piece(key: str, training: TargetTraining, data: Mapping[str, Any], *, dp: DPConfig | None) -> Piece:
    """Train a target (DP-SGD when ``dp`` is given) into ``OUT/<key>/model``."""

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        base = training.train_config(data, device=ctx.device).model_dump(mode="json")
        cfg = TrainConfig.model_validate({**base, "dp": None if dp is None else dp.model_dump(mode="json")})
        res = train_target(cfg, data_dir=ctx.data_dir, out=d / "model", resume=ctx.resume, overwrite=not ctx.resume,
                           progress=ctx.progress, measures=TargetMeasures(kkt_score=training.kkt_score), nested=True)
        return {"metrics": res.metrics, "model_dir": "model", "config_hash": cfg.hash()}

    spec = {"training": training.model_dump(mode="json"), "data": dict(data),
            "dp": None if dp is None else dp.model_dump(mode="json")}
    return Piece(key=key, run=run, spec=spec, kind="train")


def membership_piece(key: str, model_key: str, settings: MembershipSettings) -> Piece:
    """Every membership signal of the target in ``OUT/<model_key>`` (reference models in this piece's folder)."""

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        out = d if settings.references.count else None
        res = evaluate_membership(model_dir(ctx, model_key), settings=settings, out=out,
                                  runtime=MembershipRuntime(data_dir=ctx.data_dir, device=ctx.device,
                                                            log=lambda _: None))
        return membership_section(res)

    return Piece(key=key, run=run, spec=settings.model_dump(mode="json"), deps=(model_key,), kind="evaluate")



def attacks_and_pool(cfg: AuditConfig, *, model_key: str, runs: str, pool: str) -> list[Piece]:
    """The KKT runs of ``cfg.runs`` on the model of piece ``model_key`` (pieces ``<runs>/run<j>``) and
    their attacker-side pool (piece ``pool``: the best ``cfg.keep`` by ``cfg.selection``)."""
    pieces: list[Piece] = []
    run_keys: list[tuple[str, str | None]] = []
    for j, r in enumerate(cfg.runs):
        acfg = cfg.attack.model_copy(update={"lr_x": r.lr_x, "lambda_min": r.lambda_min, "alpha": r.alpha})
        key = f"{runs}/run{j}"
        pieces.append(attack_piece(key, model_key=model_key, method="kkt",
                                   attack=BatchRun(config=acfg, init={"name": "gaussian", "scale": r.init_scale},
                                                   seed=r.seed),
                                   candidates_factor=cfg.candidates_factor))
        run_keys.append((key, None))
    pieces.append(pool_piece(pool, run_keys, keep=cfg.keep, criterion=cfg.selection))
    return pieces

def group_plan(cfg: AuditConfig, setting: Setting, seed: int) -> list[Piece]:
    """The pieces of one (setting, seed): train → membership → attack runs → attacker-side pool → evaluation."""
    g = _group(setting.name, seed)
    mkey = f"models/{g}"
    training = setting.training.model_copy(update={"seed": seed})
    pieces = [dp_train_piece(mkey, training, cfg.data_spec(), dp=setting.dp),
              membership_piece(f"membership/{g}", mkey, cfg.membership)]
    pieces += attacks_and_pool(cfg, model_key=mkey, runs=f"runs/{g}", pool=f"pool/{g}")
    pieces.append(evaluate_piece(f"eval/{g}", model_key=mkey, run_key=f"pool/{g}", settings=cfg.evaluation))
    return pieces


def plan(cfg: AuditConfig) -> list[Piece]:
    """All pieces: every (setting, seed) group, then the table and the figures."""
    CRITERIA.get(cfg.selection)  # unknown name: DataReconError listing the registered criteria
    pieces: list[Piece] = []
    evals = []
    for s in settings(cfg):
        for seed in cfg.seeds:
            pieces += group_plan(cfg, s, seed)
            evals.append(f"eval/{_group(s.name, seed)}")
    models = [k.replace("eval/", "models/", 1) for k in evals]
    pieces.append(Piece(key="tables", run=lambda ctx, d: _tables(ctx, d, cfg), deps=tuple(models + evals),
                        spec={"bound_samples": cfg.bound_samples}, kind="table"))
    pieces.append(Piece(key="figures", run=lambda ctx, d: _figures(ctx, d, cfg), deps=("tables",), kind="figure"))
    return pieces


# ---------------------------------------------------------------------------------------------
# results


def row_for(ctx: Context, cfg: AuditConfig, s: Setting, seed: int) -> dict[str, Any]:
    """One table row: the defence, its accuracy cost, the headline counts with the nulls, SSIM,
    the real/fake AUC, and for DP targets ε and the bound's count."""
    g = _group(s.name, seed)
    tm = ctx.summary(f"models/{g}").get("metrics", {})
    m = read_json(ctx.dir(f"eval/{g}") / METRICS_FILE)
    head = m.get("headline") or {}
    cal = head.get("calibrated") or {}
    n = head.get("n_train") or tm.get("n_train")
    curves = (((m.get("baselines") or {}).get("haim_ssim") or {}).get("curves") or {})
    held = [v for v in (curves.get("heldout") or []) if v is not None]
    priv = (m.get("privacy") or {}).get("scores") or {}
    auc = {k: finite(v.get("auc")) for k, v in sorted(priv.items())}
    row: dict[str, Any] = {
        "setting": s.name, "axis": s.axis, "seed": seed,
        "weight_decay": s.training.weight_decay, "epochs": tm.get("epochs_done"),
        "dp_epsilon": finite(tm.get("dp_epsilon")) if s.dp is not None else None,
        "dp_noise_multiplier": tm.get("dp_noise_multiplier"), "dp_sample_rate": tm.get("dp_sample_rate"),
        "dp_steps": tm.get("dp_steps"), "dp_delta": tm.get("dp_delta"),
        "n_train": n, "train_accuracy": finite(tm.get("train_accuracy")),
        "heldout_accuracy": finite(tm.get("heldout_accuracy")),
        "threshold": finite(cal.get("threshold")), "count": cal.get("count"),
        "count_heldout": cal.get("heldout"), "count_noise": cal.get("noise"),
        "count_ssim_gt_0.4": (head.get("paper") or {}).get("count"),
        "mean_best_ssim": finite((m.get("haim") or {}).get("mean_ssim")),
        "mean_best_ssim_heldout": sum(held) / len(held) if held else float("nan"),
        "auc_margin": auc.get("margin", float("nan")),
        # every attacker-side signal the run recorded, each with its AUC (generic over signals)
        **{f"auc_{k}": v for k, v in auc.items() if k != "margin"},
        "n_real": (m.get("privacy") or {}).get("n_real"), "n_fake": (m.get("privacy") or {}).get("n_fake"),
        "kappa": None, "bound_count": None, **_membership_columns(ctx.summary(f"membership/{g}")),
    }
    if s.dp is not None and n and cal.get("heldout") is not None and tm.get("dp_steps"):
        kappa = prior_kappa(int(cal["heldout"]), int(n))
        sigma = float(tm["dp_noise_multiplier"])
        bound = rero_bound(kappa, noise_multiplier=sigma, sample_rate=float(tm["dp_sample_rate"]),
                           steps=int(tm["dp_steps"]), samples=cfg.bound_samples, seed=seed)
        row.update({"kappa": kappa, "bound_count": bound * int(n)})
    return row


def _membership_columns(section: dict[str, Any]) -> dict[str, Any]:
    """The membership columns of a row: the strongest signal's name, AUC and TPRs, and the loss threshold's."""
    best = (section.get("strongest") or {}).get("name")
    sig = section.get("signals") or {}

    def cols(prefix: str, v: dict[str, Any]) -> dict[str, Any]:
        tpr = v.get("tpr_at_fpr") or {}
        return {f"{prefix}_auc": finite(v.get("auc")), f"{prefix}_tpr_1pct": finite(tpr.get("0.01")),
                f"{prefix}_tpr_0.1pct": finite(tpr.get("0.001"))}

    return {"membership_signal": best, **cols("membership", sig.get(best) or {}),
            **cols("membership_loss", sig.get("loss") or {})}


def _tables(ctx: Context, d: Path, cfg: AuditConfig) -> dict[str, Any]:
    rows = [row_for(ctx, cfg, s, seed) for s in settings(cfg) for seed in cfg.seeds]
    write_csv(d / "audit.csv", rows)
    atomic_write_json(d / AUDIT_JSON, {"rows": rows})
    return {"files": ["audit.csv", AUDIT_JSON], "n_rows": len(rows)}


def _figures(ctx: Context, d: Path, cfg: AuditConfig) -> dict[str, Any]:
    rows = read_json(ctx.dir("tables") / AUDIT_JSON)["rows"]
    files = []
    for axis, label, log in (("dp", "ε (at δ, Opacus accountant)", True),
                             ("weight_decay", "weight decay", True), ("epochs", "training epochs", True)):
        pts = [r for r in rows if r["axis"] in (axis, "baseline")]
        if not any(r["axis"] == axis for r in pts):
            continue
        save_figure(defence_figure(pts, axis=axis, xlabel=label, log_x=log), d / f"{axis}.png")
        files.append(f"{axis}.png")
    return {"files": files}


# ---------------------------------------------------------------------------------------------
# configuration and execution


def preset_path(scale: str) -> Path:
    return PRESETS_DIR / f"{NAME}-{scale}.yaml"


def load_audit_config(*, scale: str = "small", overrides: Mapping[str, Any] | None = None) -> AuditConfig:
    """Defaults, then the scale preset, then ``overrides`` (nested mappings merge field by field).

    Raises:
        DataReconError: unknown scale or invalid fields (one line).
    """
    if scale not in SCALES:
        raise DataReconError(f"unknown audit scale {scale!r}; valid scales: {', '.join(SCALES)}")
    preset = read_config_mapping(preset_path(scale))
    base = AuditConfig().model_dump(mode="json")
    return build_config(AuditConfig, merge(merge(base, preset), dict(overrides or {})), where=f"audit {scale} config")


def check_dp_axis(cfg: AuditConfig, *, skip: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Refuse, before anything runs, a δ ≥ 1/n or a target ε that the DP axis cannot reach.

    Args:
        cfg: the audit.
        skip: groups (``setting/s<seed>``) already finished: their DP points were resolved when they
            were trained (Opacus's noise search costs seconds per point).

    Raises:
        DataReconError: the first unusable DP point (one line, from :mod:`datarecon.training.dp`).
    """
    for s in settings(cfg):
        if s.dp is not None and any(_group(s.name, seed) not in skip for seed in cfg.seeds):
            dpm.resolve(s.dp, n=2 * cfg.n_per_class, epochs=s.training.epochs)


def finished_groups(cfg: AuditConfig, out: Path) -> set[str]:
    """The (setting, seed) groups whose every piece has its completion marker in ``out``."""
    if not Path(out).is_dir():
        return set()
    done = set()
    for s in settings(cfg):
        for seed in cfg.seeds:
            if all(p.done for p in dry_run(group_plan(cfg, s, seed), Context(out=Path(out)))):
                done.add(_group(s.name, seed))
    return done


def audit_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Backend task: run the pieces of one (setting, seed) group (top-level: spawn/Ray import it).

    Payload: ``config`` (AuditConfig JSON), ``setting``, ``seed``, ``out``, ``data_dir``, ``device``,
    ``resume``, ``threads``.
    """
    if payload.get("threads"):
        torch.set_num_threads(int(payload["threads"]))
    cfg = AuditConfig.model_validate(payload["config"])
    s = next(x for x in settings(cfg) if x.name == payload["setting"])
    ctx = Context(out=Path(payload["out"]), data_dir=payload.get("data_dir"), device=payload.get("device", "cpu"),
                  resume=bool(payload.get("resume")), progress=bool(payload.get("progress")))
    t0 = time.perf_counter()
    records = execute(group_plan(cfg, s, int(payload["seed"])), ctx, log=lambda _: None)
    return {"ran": sum(r.status == "ran" for r in records), "wall_time_s": time.perf_counter() - t0}


def run_audit(cfg: AuditConfig, *, out: str | Path, scale: str = "custom", runtime: Runtime = Runtime(),
              execution: Execution = Execution(workers=1, threads=1), overwrite: bool = False,
              log: Callable[[str], None] = print) -> Path:
    """Run the audit of ``cfg`` into ``out`` and write ``out/report.html``.

    Args:
        cfg: the audit config (:func:`load_audit_config`).
        out: output folder; a rerun into it skips finished pieces (``DONE.json`` markers).
        scale: label for the report.
        runtime: where each target computes (:class:`~datarecon.experiments.pipeline.pieces.Runtime`): the
            data folder (default ``$DATARECON_DATA`` / cache); the device, ``cpu`` | ``cuda[:N]``;
            ``resume``: let an unfinished attack continue from its checkpoint; ``progress``: progress
            bars inside each target's training and attacks (in-process targets only).
        execution: how the (setting, seed) groups fan out
            (:class:`~datarecon.experiments.execution.Execution`): a
            ``datarecon.experiments.backends.BACKENDS`` key (``local`` process pool, ``ray``), tasks in
            flight (1: in the driver process), the Ray address or extra backend options, torch threads
            per task (default 1; None or 0: PyTorch's default).
        overwrite: replace a folder holding another audit configuration.
        log: progress sink (a line when each target starts and ends, with the count done).

    Returns:
        Path of ``report.html``.

    Raises:
        DataReconError: bad config, a folder of another configuration, a failed (setting, seed) group.
    """
    out = Path(out)
    pieces = plan(cfg)
    piece_hashes(pieces)  # plan errors before anything is written
    check_trainings(cfg, device=runtime.device)
    check_dp_axis(cfg, skip=finished_groups(cfg, out))  # a no-op rerun does not search σ again
    chash = config_hash(cfg.model_dump(mode="json"))
    with claim_reproduction(out, name=NAME, config_hash_=chash, overwrite=overwrite,
                            resume=runtime.resume) as claim:
        claim.prepare()
        return _run_audit(cfg, pieces, out=out, chash=chash, scale=scale, runtime=runtime, execution=execution,
                          log=log)


def check_trainings(cfg: AuditConfig, *, device: str = "cpu") -> None:
    """Build every target's training config (each setting and seed) before anything runs.

    Raises:
        DataReconError: the first invalid one, naming the setting and the field (one line).
    """
    for s in settings(cfg):
        for seed in cfg.seeds:
            base = s.training.model_copy(update={"seed": seed}).train_config(cfg.data_spec(), device=device)
            fields = {**base.model_dump(mode="json"), "dp": None if s.dp is None else s.dp.model_dump(mode="json")}
            build_config(TrainConfig, fields, where=f"audit target {_group(s.name, seed)} training config")


def _run_audit(cfg: AuditConfig, pieces: list[Piece], *, out: Path, chash: str, scale: str, runtime: Runtime,
               execution: Execution, log: Callable[[str], None]) -> Path:
    """The body of :func:`run_audit` once ``out`` is claimed and prepared."""
    atomic_write_json(out / REPRODUCTION_JSON, {"name": NAME, "scale": scale, "config_hash": chash,
                                       "config": cfg.model_dump(mode="json"), "versions": versions(),
                                       "entries": entries(pieces)})
    groups = [(s.name, seed) for s in settings(cfg) for seed in cfg.seeds]
    done = finished_groups(cfg, out)
    backend, workers, data_dir = execution.backend, execution.workers, runtime.data_dir
    log(f"audit ({scale}): {len(groups)} targets x {len(cfg.runs)} attack runs on backend {backend} "
        f"({workers} worker{'s' if workers != 1 else ''}) -> {out}"
        + (f"; {len(done)} finished earlier" if done else ""))
    t0 = time.perf_counter()
    in_process = backend == "local" and workers == 1
    base = {"config": cfg.model_dump(mode="json"), "out": str(out), "data_dir": None if data_dir is None else str(data_dir),
            "device": runtime.device, "resume": runtime.resume, "threads": execution.threads,
            "progress": runtime.progress and in_process}
    failures: list[str] = []
    todo = [Task(key=_group(n, s), payload={**base, "setting": n, "seed": s}) for n, s in groups
            if _group(n, s) not in done]
    count, width = len(done), len(str(len(groups)))
    if todo:
        with make_backend(backend, audit_worker, workers=workers, **execution.backend_options()) as be:
            while todo or be.in_flight:
                while todo and be.in_flight < be.capacity:
                    task = todo.pop(0)
                    log(f"  [{count + be.in_flight + 1:>{width}}/{len(groups)}] {task.key}: training the target and "
                        f"{len(cfg.runs)} attack runs ...")
                    be.submit(task)
                for o in be.wait():
                    count += 1
                    if o.ok:
                        log(f"  [{count:>{width}}/{len(groups)}] {o.task.key}: done, {o.result.get('ran')} pieces ran "
                            f"({o.result.get('wall_time_s', 0):.1f} s; {time.perf_counter() - t0:.0f} s so far)")
                    else:
                        failures.append(f"{o.task.key}: {o.error}")
                        log(f"  [{count:>{width}}/{len(groups)}] {o.task.key}: FAILED {o.error}")
    if failures:
        raise DataReconError(f"{len(failures)} of {len(groups)} audit targets failed (first: {failures[0]}); "
                             "fix the cause and rerun into the same --out to resume")
    ctx = Context(out=out, data_dir=data_dir, device=runtime.device, resume=runtime.resume)
    execute(pieces, ctx, log=lambda line: None if "skipped" in line else log(line))
    total = time.perf_counter() - t0
    report = write_report(report_sections(ctx, cfg, scale=scale, wall_s=total), out=out / REPORT_HTML,
                          title="Defence audit: reconstruction against weight decay, training length and DP-SGD")
    atomic_write_json(out / TIMINGS_JSON, {"wall_time_s": total})
    log(f"wrote {report} ({total:.1f} s)")
    return report


def report_sections(ctx: Context, cfg: AuditConfig, *, scale: str, wall_s: float | None = None) -> list[Any]:
    """The audit's report sections: setup, the three defence figures, the table."""
    rows = read_json(ctx.dir("tables") / AUDIT_JSON)["rows"]
    signals = sorted({k for r in rows for k in r if k.startswith("auc_") and not k.startswith("auc_membership")}
                     - {"auc_margin"})
    header = ["setting", "seed", "dp_epsilon", "weight_decay", "epochs", "heldout_accuracy", "threshold", "count",
              "count_heldout", "count_noise", "bound_count", "mean_best_ssim", "mean_best_ssim_heldout", "auc_margin",
              *signals, "n_real", "n_fake", "membership_signal", "membership_auc", "membership_tpr_1pct",
              "membership_tpr_0.1pct", "membership_loss_auc", "membership_loss_tpr_1pct"]
    n = 2 * cfg.n_per_class
    setup = (f"Scale: {scale}. {cfg.dataset} {cfg.task}, n = {n} training images, {2 * cfg.n_heldout_per_class} "
             f"held-out; target {cfg.target.arch.name} hidden {list(cfg.target.arch.hidden or [])}, bias "
             f"{cfg.target.arch.bias}, {cfg.target.optimizer} lr {cfg.target.lr}, {cfg.target.epochs} epochs. "
             f"Seeds {list(cfg.seeds)}. Attack: {len(cfg.runs)} KKT runs of {cfg.attack.steps} steps, m = "
             f"{cfg.candidates_factor}n candidates each; the best {cfg.keep} by the attacker-side criterion "
             f"{cfg.selection!r} are pooled. Count (the headline rule of every report): training images whose "
             "Haim-protocol SSIM exceeds max(0.4, t), t the threshold that held-out images used as candidates pass "
             "for at most 5% of the training images; the held-out and noise counts at the same threshold are the "
             "null.")
    bound_note = ("Bound: Hayes, Mahloujifar & Balle (2023) in its hypothesis-testing form, n·κ₊ with κ₊ = 1 − f(κ) "
                  "for DP-SGD's subsampled-Gaussian pair (noise multiplier, sample rate and steps of the target); "
                  "κ is the Clopper–Pearson 95% upper bound of the held-out null rate at the same threshold "
                  "(an estimate of the prior's success probability, not a known quantity).")
    figs = [FigureItem(caption=figure_caption(f), png=(ctx.dir("figures") / f).read_bytes())
            for f in ctx.summary("figures")["files"]]
    table = Table(caption="one row per target (setting x seed)", header=header,
                  rows=[[table_cell(r.get(h)) for h in header] for r in rows])
    caveat = [SCALE_CAVEATS[scale][0].upper() + SCALE_CAVEATS[scale][1:] + "."] if scale in SCALE_CAVEATS else []
    secs = [Section(title="Setup", text=[*caveat, setup, bound_note], code=cfg.model_dump_json(indent=2)),
            Section(title="Defences", figures=figs, tables=[table])]
    if wall_s is not None:
        secs.append(Section(title="Timings", text=[f"{wall_s:.1f} s wall time for this invocation."]))
    return secs


def summary_lines(out: str | Path, *, scale: str = "custom") -> list[str]:
    """One line per target of a finished audit in ``out`` (:func:`~datarecon.report.defence.target_line`), then
    the scale's caveat where it has one (:data:`SCALE_CAVEATS`)."""
    rows = read_json(Path(out) / "tables" / AUDIT_JSON)["rows"]
    return [target_line(r) for r in rows] + ([f"note: {SCALE_CAVEATS[scale]}"] if scale in SCALE_CAVEATS else [])


__all__ = ["AXES", "AuditConfig", "DPAxis", "SCALES", "SCALE_CAVEATS", "Setting", "audit_worker", "group_plan", "load_audit_config",
           "membership_piece", "plan", "report_sections", "row_for", "run_audit", "settings", "summary_lines"]
