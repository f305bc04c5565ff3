"""``datarecon audit --model DIR``: audit one trained model, as a privacy auditor would, in one folder.

The audit's grid trains its own targets; a user who trained a model (the README's, a DP-SGD one) asks
what it leaks. For a given model directory :func:`audit_model` runs, as resumable pieces
(:mod:`.pipeline.pieces`: a rerun skips what finished):

* membership: every signal, the reference attacks within their time budget
  (:attr:`~datarecon.experiments.audit.AuditConfig.model_membership`), into ``OUT/membership`` (a membership
  folder: the report's audit section);
* reconstruction: the audit's KKT runs (its ``runs``, ``attack``, ``keep``, ``selection``) on the model, the best
  runs pooled by the attacker-side criterion, evaluated against the held-out and noise nulls;
* ``OUT/report.html``: the membership audit section and the reconstruction headline.

It returns (and the command prints) the answer in a few lines: the reconstruction count beside its nulls, the
strongest membership signal beside the loss threshold, the empirical ε lower bound, and the model's own DP-SGD ε
where it was trained with one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from datarecon.config import build_config
from datarecon.errors import DataReconError
from datarecon.evaluation.records import read_metrics
from datarecon.evaluation.run_records import read_history, read_neighbour_grid, read_run_fields
from datarecon.experiments.audit import SCALE_CAVEATS, AuditConfig, attacks_and_pool
from datarecon.experiments.membership.evaluate import evaluate_membership
from datarecon.experiments.membership.folder import membership_section
from datarecon.experiments.membership.references import AUTO_COUNTS
from datarecon.experiments.membership.settings import ReferenceSettings, check_budget_applies
from datarecon.experiments.membership.settings import Runtime as MembershipRuntime
from datarecon.experiments.pipeline.pieces import Runtime
from datarecon.experiments.pipeline.common import evaluate_piece
from datarecon.experiments.pipeline.pieces import Context, Piece, claim_reproduction, entries, execute, piece_hashes
from datarecon.kernel.files import HISTORY, REPORT_HTML, REPRODUCTION_JSON, RUN_JSON
from datarecon.models.checkpoint import model_identity, read_model_meta
from datarecon.report.html import Section, evaluation_section, write_report
from datarecon.report.membership import membership_sections
from datarecon.report.text import headline_lines, reference_lines, strongest_lines
from datarecon.utils.io import atomic_write_json, config_hash, versions

__all__ = ["NAME", "audit_model", "model_plan", "planned_references", "with_model_references"]

#: the name a given model's audit folder records (:func:`~datarecon.experiments.pipeline.pieces.claim_reproduction`)
NAME = "audit-model"
#: the piece that names the given model (its summary's absolute ``model_dir``)
GIVEN = "model"


def with_model_references(cfg: AuditConfig, *, count: int | str | None = None,
                          budget_minutes: float | None = None) -> AuditConfig:
    """``cfg`` with the reference models of ``audit --model``'s membership set (``--references``,
    ``--budget-minutes``; None: the scale's). A number of models drops the scale's budget, which only ``auto``
    reads.

    Raises:
        DataReconError: a count or budget out of range, or a budget with a fixed count.
    """
    if count is None and budget_minutes is None:
        return cfg
    ref = cfg.model_membership.references
    base = ref.model_dump(mode="json", exclude={"budget_minutes"} if count not in (None, "auto") else set())
    given = {k: v for k, v in (("count", count), ("budget_minutes", budget_minutes)) if v is not None}
    new = build_config(ReferenceSettings, {**base, **given}, where="--references/--budget-minutes")
    check_budget_applies(new, budget_given=budget_minutes is not None)
    return cfg.model_copy(update={"model_membership": cfg.model_membership.model_copy(update={"references": new})})


def planned_references(ref: ReferenceSettings) -> str:
    """What the membership audit will run of the reference attacks, in words: never more than it may run."""
    if ref.auto:
        return (f"reference attacks if {AUTO_COUNTS[0]} or more reference models fit --budget-minutes "
                f"{ref.budget_minutes:g}, else a line with their cost")
    return f"{ref.count} reference models" if ref.count else "no reference models"


def _given_piece(model_dir: Path) -> Piece:
    """The given model directory, named by its absolute path (the attack and evaluation pieces read it there)."""
    path = model_dir.resolve()

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        meta = read_model_meta(path)
        return {"model_dir": str(path), "metrics": meta.get("metrics") or {}}

    return Piece(key=GIVEN, run=run, spec={"model": str(path), "identity": model_identity(path)}, kind="train")


def _membership_piece(cfg: AuditConfig) -> Piece:
    """Every membership signal of the given model, its membership folder this piece's own."""

    def run(ctx: Context, d: Path) -> dict[str, Any]:
        res = evaluate_membership(Path(ctx.summary(GIVEN)["model_dir"]), settings=cfg.model_membership, out=d,
                                  runtime=MembershipRuntime(data_dir=ctx.data_dir, device=ctx.device,
                                                            log=lambda _: None, progress=ctx.progress))
        return membership_section(res)

    return Piece(key="membership", run=run, spec=cfg.model_membership.model_dump(mode="json"), deps=(GIVEN,),
                 kind="evaluate")


def model_plan(cfg: AuditConfig, model_dir: Path) -> list[Piece]:
    """The pieces of one given model's audit: the model, membership, the KKT runs, their pool, its evaluation."""
    pieces = [_given_piece(model_dir), _membership_piece(cfg)]
    pieces += attacks_and_pool(cfg, model_key=GIVEN, runs="runs", pool="pool")
    pieces.append(evaluate_piece("eval", model_key=GIVEN, run_key="pool", settings=cfg.evaluation))
    return pieces


def summary_lines(ctx: Context, meta: dict[str, Any], *, scale: str = "custom") -> list[str]:
    """The audit's answer in a few lines: reconstruction beside its nulls with the count's caveats (the headline's
    notes, e.g. a held-out null of fewer candidates than the attack's, and the scale's), membership beside the loss
    threshold and the empirical ε bound, and the model's own DP-SGD ε where it has one."""
    head = read_metrics(ctx.dir("eval")).get("headline") or {}
    lines = ["reconstruction (the audit's KKT runs, pooled): " + line for line in headline_lines(head)[:1]]
    lines += ["reconstruction: note: " + note for note in head.get("notes") or [] if note]
    lines += [f"reconstruction: note: {SCALE_CAVEATS[scale]}"] if scale in SCALE_CAVEATS else []
    section = ctx.summary("membership")
    lines += ["membership: " + line for line in reference_lines(section.get("references"))]
    lines += ["membership: " + line for line in strongest_lines(section)]
    dp = (meta.get("metrics") or {}).get("dp_epsilon")
    if dp is not None:
        lines.append(f"DP-SGD: the model was trained with epsilon {float(dp):.3g} at delta "
                     f"{(meta.get('metrics') or {}).get('dp_delta')} (its accountant's upper bound; the empirical "
                     "bound above is a lower one)")
    return lines


def _reconstruction_section(ctx: Context, cfg: AuditConfig, *, scale: str) -> Section:
    """The report's reconstruction section, as ``datarecon report`` shows a run: the pooled candidates' headline
    with its nulls and notes, the sorted-SSIM curve against the nulls, the best-matched candidates beside their
    training images and the tables; the attack card and configuration of the best pooled run (by the attack's
    criterion), whose convergence it judges; the membership card of the membership section; the scale's caveat
    first."""
    metrics = dict(read_metrics(ctx.dir("eval")))
    metrics["run"] = {**(metrics.get("run") or {}), "model_dir": ctx.summary(GIVEN)["model_dir"]}  # the target card
    metrics["membership"] = ctx.summary("membership")
    pooled = read_run_fields(ctx.dir("pool") / "run" / RUN_JSON).get("pooled_from") or []
    best = ctx.dir(str(pooled[0])) / "run" if pooled else ctx.dir("pool") / "run"
    section = evaluation_section(metrics, run=read_run_fields(best / RUN_JSON), history=read_history(best / HISTORY),
                                 grid=read_neighbour_grid(ctx.dir("eval"), name="grid-train-similarity.safetensors"),
                                 name=f"Reconstruction: {len(cfg.runs)} KKT runs, the best {cfg.keep} pooled by "
                                      f"{cfg.selection}", where=ctx.dir("eval"))
    text = [f"The headline, figures and tables: the pooled candidates of {', '.join(map(str, pooled))}; the attack "
            f"card and configuration: the best of them by {cfg.selection}, {best}."]
    caveat = [SCALE_CAVEATS[scale][0].upper() + SCALE_CAVEATS[scale][1:] + "."] if scale in SCALE_CAVEATS else []
    return replace(section, text=[*caveat, *text])


def audit_model(model_dir: str | Path, cfg: AuditConfig, *, out: str | Path, runtime: Runtime = Runtime(),
                overwrite: bool = False, log: Callable[[str], None] = print,
                scale: str = "custom") -> tuple[Path, list[str]]:
    """Audit the model in ``model_dir`` into ``out``: membership (reference attacks within their budget),
    reconstruction by the audit's KKT runs, and ``out/report.html``.

    Args:
        model_dir: a model directory (``datarecon train``).
        cfg: the audit config (its attack runs, pool, evaluation and ``model_membership``).
        out: the audit folder; a rerun into it skips finished pieces.
        runtime: data folder, device, resume, progress.
        overwrite: replace a folder of another audit.
        log: progress sink.
        scale: the preset ``cfg`` was loaded from (its caveat, :data:`~datarecon.experiments.audit.SCALE_CAVEATS`,
            goes with the answer and into the report).

    Returns:
        (the report's path, the summary lines).

    Raises:
        DataReconError: a bad model directory, a folder of another audit, a failed piece.
    """
    model_dir = Path(model_dir)
    meta = read_model_meta(model_dir)
    pieces = model_plan(cfg, model_dir)
    piece_hashes(pieces)
    chash = config_hash({"config": cfg.model_dump(mode="json"), "model": model_identity(model_dir)})
    out = Path(out)
    t0 = time.perf_counter()
    with claim_reproduction(out, name=NAME, config_hash_=chash, overwrite=overwrite, resume=runtime.resume) as claim:
        claim.prepare()
        atomic_write_json(out / REPRODUCTION_JSON, {"name": NAME, "config_hash": chash, "model": str(model_dir.resolve()),
                                                    "config": cfg.model_dump(mode="json"), "versions": versions(),
                                                    "entries": entries(pieces)})
        ctx = Context(out=out, data_dir=runtime.data_dir, device=runtime.device, resume=runtime.resume,
                      progress=runtime.progress)
        log(f"audit of {model_dir}: membership ({planned_references(cfg.model_membership.references)}), "
            f"{len(cfg.runs)} KKT runs -> {out}")
        execute(pieces, ctx, log=log)
        lines = summary_lines(ctx, meta, scale=scale)
        if not (ctx.dir("membership") / "membership.json").is_file():
            raise DataReconError(f"{out}/membership holds no result; rerun with --overwrite")
        sections = [membership_sections(ctx.dir("membership")), _reconstruction_section(ctx, cfg, scale=scale)]
        report = write_report(sections, out=out / REPORT_HTML, title=f"Audit of {model_dir}")
    log(f"wrote {report} ({time.perf_counter() - t0:.0f} s)")
    return report, lines
