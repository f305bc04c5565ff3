"""``datarecon sweep`` (run / resume a hyper-parameter sweep, pool its best runs) and
``datarecon store`` (rebuild / list / export the results index)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from datarecon.attacks.selection import DEFAULT_CRITERION
from datarecon.attacks.selection import CRITERIA
from datarecon.cli._common import DEFAULT_THREADS, set_threads, threads_help
from datarecon.cli.options import OutFile, backend_options, out_file_options
from datarecon.config import load_config_file
from datarecon.errors import DataReconError
from datarecon.experiments.execution import Execution
from datarecon.experiments.store import COLUMNS, JSON_COLUMNS, Store, check_store, is_export, sort_expression
from datarecon.experiments.sweep import SweepConfig, pool_candidates, run_sweep
from datarecon.utils.lock import hold

sweep_app = typer.Typer(
    rich_markup_mode=None, name="sweep", no_args_is_help=False, invoke_without_command=True, add_completion=False,
    help="Run a hyper-parameter sweep of an attack (resumable), then pool its best runs.",
)
store_app = typer.Typer(rich_markup_mode=None, name="store", no_args_is_help=True, add_completion=False,
                        help="The results store of sweeps: rebuild, list and export its index.")


@sweep_app.callback()
@backend_options(workers="Runs in flight (local default 1 = in-process; ray: cluster CPUs).", default_workers=None)
def sweep_cmd(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="sweep file (YAML/TOML), see docs/SWEEPS.md"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="store directory (rerun the same command to resume)"),
    budget: Optional[int] = typer.Option(None, "--budget", min=1, help="override the sweep's run budget"),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", min=1,
                                         help="steps between run checkpoints (work lost by a crash)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar over runs"),
    threads: int = typer.Option(DEFAULT_THREADS, "--threads", min=0, help=threads_help(
        per=" per run", zero="the sweep's resources.num_cpus in worker processes, PyTorch's default in-process")),
    *,
    backend: Execution,
) -> None:
    """Run (or resume) the sweep in --config into the store --out."""
    if ctx.invoked_subcommand is not None:
        return
    set_threads(threads)
    if config is None or out is None:
        raise DataReconError("datarecon sweep needs --config SWEEP.yaml and --out DIR (or a subcommand: pool)")
    cfg = load_config_file(config, SweepConfig, overrides={"budget": budget})
    execution = replace(backend, threads=threads or None)
    result = run_sweep(cfg, out, execution=execution, progress=progress, checkpoint_every=checkpoint_every)
    best = f"{result.best_score:.6g} ({result.best_key})" if result.best_score is not None else "-"
    typer.echo(f"sweep {result.sweep_id}: {result.total} runs: {result.completed} done now, {result.skipped} "
               f"already finished, {result.failed} failed, {result.retries} retries; best {result.criterion} {best}; "
               f"{result.wall_time_s:.1f} s on {result.backend.get('backend')} x{result.backend.get('workers')}")
    for key, err in result.failures.items():
        typer.echo(f"  failed {key}: {err}", err=True)
    typer.echo(f"store: {out} (datarecon store list {out} --sort selection.{result.criterion}.value)")
    if result.failed:
        raise typer.Exit(code=1)


@sweep_app.command("pool")
def pool_cmd(
    sweep_dir: Path = typer.Argument(..., help="the sweep's store directory"),
    top: int = typer.Option(5, "--top", "-k", min=1, help="number of best runs to pool"),
    criterion: str = typer.Option(DEFAULT_CRITERION, "--criterion",
                                  help="attacker-side selection criterion (attacks.selection.CRITERIA)"),
    mode: Optional[str] = typer.Option(None, "--mode", help="min | max (default: the criterion's direction)"),
    sweep_id: Optional[str] = typer.Option(None, "--sweep", help="pool only this sweep id of the store"),
    out: Optional[Path] = typer.Option(None, "--out", help="pooled run directory (default DIR/pools/<hash>)"),
    merge: Optional[float] = typer.Option(None, "--merge", help="drop candidates whose cosine to a kept one of a "
                                          "better run exceeds this (near-duplicates; e.g. 0.95)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out (only what datarecon "
                                   "wrote there)"),
) -> None:
    """Pool the candidates of the K best runs (by an attacker-side criterion) into one run directory."""
    if mode not in (None, "min", "max"):
        raise DataReconError(f"--mode must be min or max, got {mode!r}")
    if merge is not None and not -1.0 < merge <= 1.0:
        raise DataReconError(f"--merge is a cosine threshold in (-1, 1], got {merge}; e.g. 0.95")
    path = pool_candidates(sweep_dir, top=top, criterion=criterion, mode=mode, sweep_id=sweep_id, out=out,
                           merge=merge, overwrite=overwrite)
    typer.echo(f"pooled run: {path} (evaluate it with `datarecon evaluate {path}`)")


@store_app.command("rebuild")
def store_rebuild(root: Path = typer.Argument(..., help="store directory")) -> None:
    """Re-create index.sqlite from the run directories."""
    check_store(root)
    with hold(root, what="results store"):
        n = Store(root).rebuild()
    typer.echo(f"indexed {n} runs in {root / 'index.sqlite'}")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"))
    return "" if v is None else str(v)


@store_app.command("list")
def store_list(
    root: Path = typer.Argument(..., help="store directory"),
    sort: Optional[str] = typer.Option(None, "--sort", help="a column, <json column>.<field> (e.g. "
                                       "final.loss) or a selection criterion name (relative_residual)"),
    desc: bool = typer.Option(False, "--desc", help="sort descending"),
    limit: Optional[int] = typer.Option(None, "--limit", "-k", min=1, help="show at most K rows"),
    status: Optional[str] = typer.Option(None, "--status", help="only runs with this status"),
    sweep_id: Optional[str] = typer.Option(None, "--sweep", help="only runs of this sweep id"),
) -> None:
    """List the indexed runs (key, status, steps, time, swept parameters, sort value)."""
    if sort and "." not in sort and sort not in COLUMNS:
        if sort not in CRITERIA:
            raise DataReconError(f"unknown --sort {sort!r}; use a column ({', '.join(COLUMNS)}), a selection "
                                 f"criterion ({', '.join(CRITERIA.names())}) or <{'|'.join(JSON_COLUMNS)}>.<field>")
        sort = f"selection.{sort}.value"  # a bare criterion name, e.g. relative_residual
    if sort:
        sort_expression(sort)  # validate early
    rows = Store(root).rows(sort=sort, descending=desc, limit=limit, status=status, sweep_id=sweep_id)
    header = ["key", "kind", "status", "steps", "time_s", "attempts"] + ([sort] if sort else []) + ["params"]
    lines = [header]
    for r in rows:
        value = ""
        if sort:
            value = _fmt(_lookup(r, sort))
        lines.append([r["key"], r["kind"], r["status"], _fmt(r["steps_done"]), _fmt(r["wall_time_s"]),
                      _fmt(r["attempts"])] + ([value] if sort else []) + [_fmt(r.get("params") or {})])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        typer.echo("  ".join(str(c).ljust(w) for c, w in zip(line[:-1], widths)) + "  " + str(line[-1]))


def _lookup(row: dict, dotted: str) -> object:
    cur: object = row
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


@store_app.command("export")
@out_file_options(out="FILE.csv (or FILE.parquet with pyarrow)", required=True)
def store_export(
    root: Path = typer.Argument(..., help="store directory"),
    sort: Optional[str] = typer.Option(None, "--sort", help="row order (as for list)"),
    *,
    output: OutFile,
) -> None:
    """Export the index with flattened config / selection columns."""
    out = output.check(ours=is_export, what="store export")
    path = Store(root).export(out, sort=sort)
    typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add ``sweep`` (with ``pool``) and ``store`` to ``app``."""
    app.add_typer(sweep_app, name="sweep")
    app.add_typer(store_app, name="store")
