"""``datarecon reconstruct``: run a reconstruction attack on a trained model directory.

The method's config is built generically from the ATTACKS registry: each entry provides
``config_cls`` (a frozen pydantic model) and ``from_config``. Fields come, in increasing priority,
from the class defaults, ``--config FILE`` (YAML/TOML, one-to-one with the config class), the
explicit options (``--steps``, ``--lr-x``, ...; refused when the method has no such field) and
``--set field=value`` (any field, value parsed as YAML). A new method (e.g. ``bilevel``) plugs in by
registering itself; no change here.

The attack only receives the attacker's view (θ*, architecture, loss, weight decay, input shape
and range, labels). The one place this command loads data is a data-dependent initialisation
(``ground-truth``, ``partition``, ``mix``): an experimenter's choice, loaded through the model's
data spec and labelled as such in the output and in run.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from datarecon.errors import DataReconError

DATA_INITS = ("ground-truth", "partition", "mix")


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["a=1", "b=x"]`` → ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise DataReconError(f"--set expects field=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def reconstruct(
    model: Path = typer.Option(..., "--model", help="model directory (from `datarecon train`)"),
    out: Path = typer.Option(..., "--out", help="run directory to write"),
    method: str = typer.Option("kkt", "--method", help="attack method (kkt, decoreco, gradnorm, bilevel, ...)"),
    init: str = typer.Option("gaussian", "--init", help="initialisation (uniform, gaussian, ground-truth, partition, mix)"),
    init_scale: float | None = typer.Option(None, "--init-scale", help="gaussian scale s (also mix noise=gaussian)"),
    mix_l1: float | None = typer.Option(None, "--mix-l1", help="mix: weight of ground truth vs partition"),
    mix_l2: float | None = typer.Option(None, "--mix-l2", help="mix: weight of images vs noise"),
    mix_noise: str | None = typer.Option(None, "--mix-noise", help="mix: uniform | gaussian"),
    init_count: str | None = typer.Option(None, "--init-count", help="data inits: exact | cycle (m vs #images)"),
    candidates: int | None = typer.Option(None, "--candidates", "-m", help="number of candidates m (default 2n; n for data inits)"),
    steps: int | None = typer.Option(None, "--steps", help="optimisation steps"),
    config_file: Path | None = typer.Option(None, "--config", help="YAML/TOML file of the method's config"),
    seed: int = typer.Option(0, "--seed", help="seed of the initialisation and the attack"),
    dtype: str | None = typer.Option(None, "--dtype", help="float32 | float64 (default: the method's)"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    resume: bool = typer.Option(False, "--resume", help="continue from OUT/checkpoint"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing OUT"),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="data folder (data-dependent inits only)"),
    lr_x: float | None = typer.Option(None, "--lr-x", help="step size of the candidates x (KKT family; bilevel: "
                                      "omit for the step chosen from the problem)"),
    lr_lambda: float | None = typer.Option(None, "--lr-lambda", help="step size of the multipliers λ (KKT family)"),
    lambda_min: float | None = typer.Option(None, "--lambda-min", help="lower bound of λ (penalised below; KKT family)"),
    alpha: float | None = typer.Option(None, "--alpha", help="surrogate sharpness"),
    optimizer: str | None = typer.Option(None, "--optimizer", help="optimiser of x (sgd | adam; bilevel: only "
                                         "with --lr-x)"),
    formulation: str | None = typer.Option(None, "--formulation", help="binary | multiclass | regression | auto"),
    hessian: str | None = typer.Option(None, "--hessian", help="bilevel: inverse-Hessian strategy"),
    compile_: bool = typer.Option(False, "--compile", help="kkt/decoreco: torch.compile the step (one-off "
                                  "compile ~10 s; measured 1.6-1.9x per step on tiny nets, ~1.05x at full "
                                  "size; docs/PERFORMANCE.md)"),
    set_: list[str] | None = typer.Option(None, "--set", help="field=value override of any config field (repeatable)"),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", help="steps between checkpoints (work lost by a crash)"),
    log_every: int = typer.Option(10, "--log-every", help="steps between rows of history.jsonl"),
    early_stop_patience: int = typer.Option(0, "--early-stop-patience", help="stop after N steps without relative-residual improvement (0: off)"),
    early_stop_tol: float = typer.Option(1e-3, "--early-stop-tol", help="relative improvement of the residual that counts for --early-stop-patience"),
    progress: bool = typer.Option(True, "--progress/--no-progress",
                                  help="show progress (a bar on a terminal, plain lines in a log)"),
    runs: int = typer.Option(1, "--runs", help="K independent runs (seeds SEED..SEED+K-1) into OUT/run0..run<K-1>, "
                             "stepped together (kkt/decoreco: one batched gradient per step)"),
    batch_mode: str = typer.Option("batched", "--batch-mode", help="with --runs: batched | looped"),
) -> None:
    """Reconstruct training-data candidates from a trained model's weights."""
    from datarecon.attacks import INITS
    from datarecon.cli._common import parse_device
    from datarecon.utils.outdir import check_out_dir
    from datarecon.config import merge, read_config_mapping
    from datarecon.experiments.reconstruct import DATA_INITS_NOTE, method_config, reconstruct as run

    file_fields = read_config_mapping(config_file) if config_file is not None else {}
    options = {"steps": steps, "lr_x": lr_x, "lr_lambda": lr_lambda, "lambda_min": lambda_min, "alpha": alpha,
               "optimizer": optimizer, "formulation": formulation, "hessian": hessian, "dtype": dtype,
               "compile": True if compile_ else None}
    config = method_config(method, file_fields, **options)  # defaults < file < explicit options
    config = method_config(method, merge(config.model_dump(), parse_set(set_)))  # < --set
    INITS.get(init)
    init_params: dict[str, Any] = {}
    if init_scale is not None:
        if init not in ("gaussian", "mix"):
            raise DataReconError(f"--init-scale applies to gaussian and mix inits, not {init!r}")
        init_params["scale"] = init_scale
    for key, value, inits in (("l1", mix_l1, ("mix",)), ("l2", mix_l2, ("mix",)), ("noise", mix_noise, ("mix",)),
                              ("count", init_count, DATA_INITS)):
        if value is not None:
            if init not in inits:
                raise DataReconError(f"--{'mix-' + key if key != 'count' else 'init-count'} applies to "
                                     f"{', '.join(inits)} inits, not {init!r}")
            init_params[key] = value
    if candidates is not None and candidates < 1:
        raise DataReconError(f"candidate count must be at least 1, got {candidates}; pass --candidates M with M >= 1")
    if getattr(config, "steps", 1) < 1:
        raise DataReconError(f"steps must be at least 1, got {config.steps}; pass --steps N with N >= 1")
    if checkpoint_every < 1 or log_every < 1:
        raise DataReconError("--checkpoint-every and --log-every must be >= 1")
    dev = parse_device(device)
    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    if runs != 1:
        _reconstruct_runs(model, out=out, runs=runs, batch_mode=batch_mode, method=method, config=config, init=init,
                          init_params=init_params, candidates=candidates, seed=seed, device=dev, data_dir=data_dir,
                          resume=resume, overwrite=overwrite, progress=progress, checkpoint_every=checkpoint_every,
                          log_every=log_every, early_stop_patience=early_stop_patience, early_stop_tol=early_stop_tol)
        return
    check_out_dir(out, kind="run", overwrite=overwrite, resume=resume)  # before the note below
    if init in DATA_INITS:
        typer.echo(DATA_INITS_NOTE.format(init=init), err=True)
    rec = run(model, out=out, method=method, config=config, init=init, init_params=init_params,
              candidates=candidates, seed=seed, device=dev, data_dir=data_dir, resume=resume, overwrite=overwrite,
              progress=progress,
              checkpoint_every=checkpoint_every, log_every=log_every, early_stop_patience=early_stop_patience,
              early_stop_tol=early_stop_tol, raise_on_divergence=True)
    final = rec.summary.get("final", {})
    rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
    shown = f"loss {final.get('loss', float('nan')):.4g}" + (f", relative residual {rel:.4g}" if rel is not None else "")
    typer.echo(f"{method}: {rec.status} after {rec.steps_done} steps ({shown}); wrote {out}")


def _reconstruct_runs(model: Path, *, out: Path, runs: int, batch_mode: str, method: str, init: str,
                      **kwargs: Any) -> None:
    """``--runs K``: K run directories OUT/run<j> (experiments.reconstruct.reconstruct_runs), one line each."""
    from datarecon.experiments.reconstruct import DATA_INITS_NOTE, reconstruct_runs, run_name

    if init in DATA_INITS:
        typer.echo(DATA_INITS_NOTE.format(init=init), err=True)
    recs = reconstruct_runs(model, out=out, runs=runs, mode=batch_mode, method=method, init=init, **kwargs)
    for j, rec in enumerate(recs):
        rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
        shown = f", relative residual {rel:.4g}" if rel is not None else ""
        typer.echo(f"{method} run {j}: {rec.status} after {rec.steps_done} steps{shown}; wrote {out / run_name(j)}")


def register(app: typer.Typer) -> None:
    """Add ``reconstruct`` to ``app``."""
    app.command("reconstruct")(reconstruct)
