"""``datarecon reconstruct``: run a reconstruction attack on a trained model directory.

The command builds one :class:`~datarecon.experiments.reconstruct.ReconstructionRun` and executes
it. Fields come, in increasing priority, from the run's defaults, ``--config FILE`` (a run file,
YAML/TOML, one-to-one with ``ReconstructionRun``: docs/RUNS.md), the explicit options (each flag
overrides one field: ``--method`` → ``attack.method``, ``--steps`` → ``attack.steps``, ``--init`` →
``init.name``, ``--checkpoint-every`` → ``checkpoint.every``, ...; an attack option is refused when
the method has no such field) and ``--set field=value`` (value parsed as YAML; a plain ``field`` is
an attack field, a dotted ``init.scale`` any field of the run). The method's config is built from
the ATTACKS registry, so a new method plugs in by registering itself; no change here.

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

from datarecon.config import merge
from datarecon.cli.options import Common, common_options
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


@common_options()
def reconstruct(
    model: str | None = typer.Option(None, "--model", help="model directory (from `datarecon train`; run.model), or "
                              "package.module:factory returning your nn.Module (with --weights)"),
    weights: Path | None = typer.Option(None, "--weights", help="your model's weights (safetensors state dict; "
                                        "with --model package.module:factory)"),
    input_shape: str | None = typer.Option(None, "--input-shape", help="your model: shape of one input, e.g. 3,32,32"),
    value_range: str = typer.Option("0,1", "--value-range", help="your model: lower,upper of valid inputs"),
    loss: str | None = typer.Option(None, "--loss", help="your model: training loss (default logistic for one "
                                    "output, cross-entropy for several)"),
    weight_decay: float = typer.Option(0.0, "--weight-decay", help="your model: training weight decay"),
    out: Path = typer.Option(..., "--out", help="run directory to write"),
    method: str | None = typer.Option(None, "--method", help="attack method (kkt, decoreco, gradnorm, bilevel, loo; default kkt)"),
    init: str | None = typer.Option(None, "--init", help="initialisation (uniform, gaussian, ground-truth, partition, mix; default gaussian)"),
    init_scale: float | None = typer.Option(None, "--init-scale", help="gaussian scale s (also mix noise=gaussian)"),
    mix_l1: float | None = typer.Option(None, "--mix-l1", help="mix: weight of ground truth vs partition"),
    mix_l2: float | None = typer.Option(None, "--mix-l2", help="mix: weight of images vs noise"),
    mix_noise: str | None = typer.Option(None, "--mix-noise", help="mix: uniform | gaussian"),
    init_count: str | None = typer.Option(None, "--init-count", help="data inits: exact | cycle (m vs #images)"),
    candidates: int | None = typer.Option(None, "--candidates", "-m", help="number of candidates m (default 2n; n for data inits)"),
    steps: int | None = typer.Option(None, "--steps", help="optimisation steps"),
    config_file: Path | None = typer.Option(None, "--config", help="run file (YAML/TOML, one-to-one with ReconstructionRun; docs/RUNS.md); the options override it"),
    seed: int | None = typer.Option(None, "--seed", help="seed of the initialisation and the attack (default 0)"),
    dtype: str | None = typer.Option(None, "--dtype", help="float32 | float64 (default: the method's)"),
    device: str | None = typer.Option(None, "--device", help="cpu | cuda (default cpu)"),
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
    checkpoint_every: int | None = typer.Option(None, "--checkpoint-every", help="steps between checkpoints (work lost by a crash; default 100)"),
    log_every: int | None = typer.Option(None, "--log-every", help="steps between rows of history.jsonl (default 10)"),
    early_stop_patience: int | None = typer.Option(None, "--early-stop-patience", help="stop after N steps without relative-residual improvement (default 0: off)"),
    early_stop_tol: float | None = typer.Option(None, "--early-stop-tol", help="relative improvement of the residual that counts for --early-stop-patience (default 1e-3)"),
    runs: int = typer.Option(1, "--runs", help="K independent runs (seeds SEED..SEED+K-1) into OUT/run0..run<K-1>, "
                             "stepped together (kkt/decoreco: one batched gradient per step) and pooled into OUT "
                             "(evaluate OUT)"),
    batch_mode: str = typer.Option("batched", "--batch-mode", help="with --runs: batched | looped"),
    known_init: str | None = typer.Option(None, "--known-init", help="the attacker knows θ_init: seed (the model's "
                                          "recorded seed), seed:N or a safetensors file (knowledge.known_init); the KKT "
                                          "family then matches θ* − a·θ_init with candidates kept in the "
                                          "training subspace (--set subspace=false: not)"),
    known_n: int | None = typer.Option(None, "--known-n", help="the attacker knows the training-set size n "
                                       "(knowledge.n)"),
    known_recipe: str | None = typer.Option(None, "--known-recipe", help="the attacker knows the training recipe: "
                                            "model (the one the model directory records), or model:-lr,-order "
                                            "with the learning rate and/or the batch order unknown "
                                            "(knowledge.recipe); --method dynamics needs it"),
    *,
    common: Common,
) -> None:
    """Reconstruct training-data candidates from a trained model's weights."""
    from datarecon.cli._common import parse_device, resume_command

    from datarecon.config import read_config_mapping
    from datarecon.experiments.reconstruct import DATA_INITS_NOTE, OWN_MODEL, build_run, execute, method_config
    from datarecon.kernel.outdir import check_out_dir

    fields = read_config_mapping(config_file) if config_file is not None else {}
    where = f"run file {config_file}" if config_file is not None else "run"
    sets = parse_set(set_)
    run_sets = {k: v for k, v in sets.items() if "." in k}
    attack_file = dict(fields.get("attack") or {})
    method = method or attack_file.pop("method", None) or "kkt"
    attack_file.pop("method", None)
    attack_sets = {k: v for k, v in sets.items() if "." not in k}
    attack_sets.update({k.split(".", 1)[1]: v for k, v in run_sets.items() if k.startswith("attack.")})
    options = {"steps": steps, "lr_x": lr_x, "lr_lambda": lr_lambda, "lambda_min": lambda_min, "alpha": alpha,
               "optimizer": optimizer, "formulation": formulation, "hessian": hessian, "dtype": dtype,
               "compile": True if compile_ else None}
    config = method_config(method, attack_file, **options)  # defaults < file < explicit options
    config = method_config(method, merge(config.model_dump(), attack_sets))  # < --set
    init_file = dict(fields.get("init") or {})
    init_name = init or init_file.get("name") or "gaussian"
    if init_name != init_file.get("name", "gaussian"):
        init_file = {}  # --init names another initialisation: the file's parameters were for the old one
    init_options: dict[str, Any] = {}
    if init_scale is not None:
        if init_name not in ("gaussian", "mix"):
            raise DataReconError(f"--init-scale applies to gaussian and mix inits, not {init_name!r}")
        init_options["scale"] = init_scale
    for key, value, inits in (("l1", mix_l1, ("mix",)), ("l2", mix_l2, ("mix",)), ("noise", mix_noise, ("mix",)),
                              ("count", init_count, DATA_INITS)):
        if value is not None:
            if init_name not in inits:
                raise DataReconError(f"--{'mix-' + key if key != 'count' else 'init-count'} applies to "
                                     f"{', '.join(inits)} inits, not {init_name!r}")
            init_options[key] = value
    if candidates is not None and candidates < 1:
        raise DataReconError(f"candidate count must be at least 1, got {candidates}; pass --candidates M with M >= 1")
    if config.steps < 1:  # type: ignore[attr-defined]
        raise DataReconError(f"steps must be at least 1, got {config.steps}; pass --steps N with N >= 1")  # type: ignore[attr-defined]
    if (checkpoint_every is not None and checkpoint_every < 1) or (log_every is not None and log_every < 1):
        raise DataReconError("--checkpoint-every and --log-every must be >= 1")
    own = {"--input-shape": input_shape, "--loss": loss}
    target: Any = None
    record: dict[str, Any] = {}
    if model is not None and (weights is not None or (":" in model and not Path(model).is_dir())):
        target = own_model_target(model, weights=weights, input_shape=input_shape, value_range=value_range,
                                  loss=loss, weight_decay=weight_decay)
        if init_name in DATA_INITS:
            raise DataReconError(f"--init {init_name} needs the model's training data; a model given as "
                                 "package.module:factory has none: use --init gaussian or uniform")
        record["own_model"] = {"factory": model, "weights": str(Path(weights).resolve()) if weights else None}
        model = OWN_MODEL
    else:
        given = [k for k, v in own.items() if v is not None] + (["--weight-decay"] if weight_decay else [])
        if given:
            raise DataReconError(f"{', '.join(given)} apply to --model package.module:factory only; "
                                 "a model directory records them itself")
    if model is None and "model" not in fields:
        raise DataReconError("missing --model; pass the model directory (--model DIR) or a run file with model: DIR")
    overrides = {
        "model": str(model) if model is not None else None,
        "attack": {"method": method, **config.model_dump()},
        "init": {**init_file, "name": init_name, **init_options},
        "candidates": candidates, "seed": seed, "device": device,
        "early_stop": {"patience": early_stop_patience, "rel_tol": early_stop_tol},
        "checkpoint": {"every": checkpoint_every, "log_every": log_every},
        "knowledge": {"known_init": known_init, "n": known_n, "recipe": _recipe_option(known_recipe)},
    }
    data = merge({k: v for k, v in fields.items() if k not in ("attack", "init")}, drop_none(overrides))
    for key, value in run_sets.items():
        if not key.startswith("attack."):
            set_dotted(data, key, value)
    run = build_run(data, where=where)
    parse_device(run.device)
    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    if runs != 1:
        if target is not None:
            raise DataReconError("--runs K applies to a model directory; run a model given as "
                                 "package.module:factory once per --seed")
        _reconstruct_runs(Path(run.model), out=out, runs=runs, batch_mode=batch_mode, method=run.method,
                          config=run.method_config(), init=run.init.name, init_params=run.init_params(),
                          candidates=run.candidates, seed=run.seed, device=parse_device(run.device),
                          data_dir=data_dir, resume=resume, overwrite=overwrite, progress=common.progress,
                          checkpoint_every=run.checkpoint.every, log_every=run.checkpoint.log_every,
                          early_stop_patience=run.early_stop.patience, early_stop_tol=run.early_stop.rel_tol,
                          knowledge=run.knowledge, record={"resume_command": resume_command()})
        return
    check_out_dir(out, kind="run", overwrite=overwrite, resume=resume)  # before the note below
    if init_name in DATA_INITS:
        typer.echo(DATA_INITS_NOTE.format(init=init_name), err=True)
    record["resume_command"] = resume_command()
    rec = execute(run, out, data_dir=data_dir, resume=resume, overwrite=overwrite, progress=common.progress,
                  raise_on_divergence=True, record=record, target=target)
    final = rec.summary.get("final", {})
    rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
    shown = f"loss {final.get('loss', float('nan')):.4g}" + (f", relative residual {rel:.4g}" if rel is not None else "")
    typer.echo(f"{run.method}: {rec.status} after {rec.steps_done} steps ({shown}); wrote {out}")


def _recipe_option(text: str | None) -> dict[str, Any] | None:
    """``--known-recipe model[:-lr,-order]`` → ``knowledge.recipe`` fields."""
    if text is None:
        return None
    source, _, rest = text.strip().partition(":")
    unknown = [part.strip().removeprefix("-") for part in rest.split(",") if part.strip()]
    bad = [u for u in unknown if u not in ("lr", "order")]
    if source != "model" or bad:
        raise DataReconError(f"--known-recipe {text!r}: use model, or model:-lr, model:-order, model:-lr,-order "
                             "(the fields the attacker does not know)")
    return {"source": source, "unknown": unknown}


def drop_none(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without ``None`` values, recursively (an option left out overrides nothing)."""
    return {k: drop_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None}


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b]... = value`` for the dotted ``key`` ``a.b...`` (creating nested mappings)."""
    head, _, rest = key.partition(".")
    if not rest:
        data[head] = value
        return
    inner = data.get(head)
    if not isinstance(inner, dict):
        inner = {}
    data[head] = inner
    set_dotted(inner, rest, value)


def _floats(text: str, option: str, *, kind: type = float) -> tuple:
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise DataReconError(f"{option} must be comma-separated numbers like 3,32,32 or 0,1; got {text!r}") from None


def own_model_target(spec: str, *, weights: Path | None, input_shape: str | None, value_range: str,
                     loss: str | None, weight_decay: float) -> Any:
    """The :class:`~datarecon.attacks.base.Target` of ``--model package.module:factory --weights FILE``.

    Imports the factory (the user's own code; the current folder is searched first, as ``python -m``
    does), loads the safetensors weights (never a pickle) and checks the module with
    :meth:`Target.from_module`.

    Raises:
        DataReconError: missing --weights / --input-shape, unknown module or factory, weights that do
            not match the module (first tensor named), outputs or loss that do not fit.
    """
    from datarecon.attacks.base import Target
    from datarecon.models.byom import build_from_factory, check_outputs, load_weights

    if weights is None:
        raise DataReconError(f"--model {spec} needs --weights FILE.safetensors (the trained state dict)")
    if input_shape is None:
        raise DataReconError(f"--model {spec} needs --input-shape, the shape of one input, e.g. 3,32,32")
    shape = _floats(input_shape, "--input-shape", kind=int)
    lo_hi = _floats(value_range, "--value-range")
    if len(lo_hi) != 2:
        raise DataReconError(f"--value-range must be lower,upper like 0,1; got {value_range!r}")
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = build_from_factory(spec)
    params = load_weights(module, weights)
    if loss is None:
        outputs = check_outputs(module, params, shape, value_range=(lo_hi[0], lo_hi[1]))
        loss = "logistic" if outputs == 1 else "cross-entropy"
    return Target.from_module(module, loss=loss, input_shape=shape, value_range=(lo_hi[0], lo_hi[1]),
                              weight_decay=weight_decay)


def _reconstruct_runs(model: Path, *, out: Path, runs: int, batch_mode: str, method: str, init: str,
                      **kwargs: Any) -> None:
    """``--runs K``: K run directories OUT/run<j> pooled into OUT (experiments.reconstruct.reconstruct_runs);
    one line per run, then the one result: the pool."""
    from datarecon.experiments.reconstruct import DATA_INITS_NOTE, reconstruct_runs, run_name
    from datarecon.kernel.status import EVALUABLE

    if init in DATA_INITS:
        typer.echo(DATA_INITS_NOTE.format(init=init), err=True)
    recs = reconstruct_runs(model, out=out, runs=runs, mode=batch_mode, method=method, init=init, **kwargs)
    rels = []
    for j, rec in enumerate(recs):
        rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
        shown = f", relative residual {rel:.4g}" if rel is not None else ""
        typer.echo(f"{method} run {j}: {rec.status} after {rec.steps_done} steps{shown}; wrote {out / run_name(j)}")
        if rec.status in EVALUABLE and rel is not None:
            rels.append((rel, j))
    pooled = [j for j, rec in enumerate(recs) if rec.status in EVALUABLE]
    if not pooled:
        raise DataReconError(f"none of the {runs} {method} runs finished (all diverged); nothing was pooled in {out}; "
                             "lower the step sizes and rerun with --overwrite")
    m = sum(int(recs[j].x.shape[0]) for j in pooled)
    best = f"; best relative residual {min(rels)[0]:.4g} (run {min(rels)[1]})" if rels else ""
    typer.echo(f"{method}: {len(pooled)} of {runs} runs pooled, {m} candidates{best}; wrote {out} "
               f"(evaluate it with `datarecon evaluate {out}`)")


def register(app: typer.Typer) -> None:
    """Add ``reconstruct`` to ``app``."""
    app.command("reconstruct")(reconstruct)
