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

import torch
import typer
import yaml

from datarecon.errors import DataReconError, DivergenceError

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


def build_method_config(method: str, *, config_file: Path | None, options: dict[str, Any],
                        overrides: dict[str, Any]) -> tuple[Any, Any]:
    """(registry entry, validated config) for ``method`` from file + explicit options + --set.

    Raises:
        DataReconError: unknown method (lists valid names), an option the method does not have,
            or invalid values (one line naming each bad field).
    """
    from datarecon.attacks import ATTACKS
    from datarecon.config import build_config, merge, read_config_mapping

    entry = ATTACKS.get(method)
    config_cls = getattr(entry, "config_cls", None)
    if config_cls is None:
        raise DataReconError(f"attack method {method!r} has no config_cls; it cannot be run from the CLI")
    fields = set(config_cls.model_fields)
    for key, value in options.items():
        if value is not None and key not in fields:
            flag = "--" + key.replace("_", "-")
            raise DataReconError(f"option {flag} does not apply to method {method!r}; its fields: {', '.join(sorted(fields))}")
    data = read_config_mapping(config_file) if config_file is not None else {}
    merged = merge(merge(data, {k: v for k, v in options.items() if v is not None}), overrides)
    config = build_config(config_cls, merged, where=f"{method} config")
    return entry, config


def make_attack(entry: Any, config: Any) -> Any:
    """Instantiate a registry entry from its config (``from_config`` or the constructor)."""
    factory = getattr(entry, "from_config", None)
    return factory(config) if factory is not None else entry(config)


def default_candidates(data: dict[str, Any], num_outputs: int, *, data_init: bool) -> int:
    """Default m: n (data-dependent inits) or 2n (Haim et al.), n from the model's data spec."""
    n_per_class = int(data.get("n_per_class", 0) or 0)
    if n_per_class <= 0:
        raise DataReconError("the model's data spec has no n_per_class; pass --candidates M")
    n = n_per_class * (2 if num_outputs == 1 else num_outputs)
    return n if data_init else 2 * n


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
    lr_x: float | None = typer.Option(None, "--lr-x"),
    lr_lambda: float | None = typer.Option(None, "--lr-lambda"),
    lambda_min: float | None = typer.Option(None, "--lambda-min"),
    alpha: float | None = typer.Option(None, "--alpha", help="surrogate sharpness"),
    optimizer: str | None = typer.Option(None, "--optimizer"),
    formulation: str | None = typer.Option(None, "--formulation", help="binary | multiclass | regression | auto"),
    hessian: str | None = typer.Option(None, "--hessian", help="bilevel: inverse-Hessian strategy"),
    set_: list[str] | None = typer.Option(None, "--set", help="field=value override of any config field (repeatable)"),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every"),
    log_every: int = typer.Option(10, "--log-every"),
    early_stop_patience: int = typer.Option(0, "--early-stop-patience", help="stop after N steps without relative-residual improvement (0: off)"),
    early_stop_tol: float = typer.Option(1e-3, "--early-stop-tol"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Reconstruct training-data candidates from a trained model's weights."""
    from datarecon.attacks import INITS, AttackerPrior, InitSources, Target, init_labels, make_init, run_attack
    from datarecon.attacks.selection import ResidualPlateau
    from datarecon.cli._common import parse_device, parse_dtype, prepare_out_dir
    from datarecon.models.checkpoint import EXTRAS, read_model_meta
    from datarecon.utils.io import load_tensors

    entry, config = build_method_config(
        method, config_file=config_file,
        options={"steps": steps, "lr_x": lr_x, "lr_lambda": lr_lambda, "lambda_min": lambda_min, "alpha": alpha,
                 "optimizer": optimizer, "formulation": formulation, "hessian": hessian, "dtype": dtype},
        overrides=parse_set(set_),
    )
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
    if checkpoint_every < 1 or log_every < 1:
        raise DataReconError("--checkpoint-every and --log-every must be >= 1")
    dev = parse_device(device)
    dt = parse_dtype(getattr(config, "dtype", None) or "float64")

    meta = read_model_meta(model)
    target = Target.from_model_dir(model, device=dev, dtype=dt)
    mean = load_tensors(Path(model) / EXTRAS)["input_mean"].to(torch.float64)
    lower, upper = (-mean).to(device=dev, dtype=dt), (1.0 - mean).to(device=dev, dtype=dt)
    data_spec = dict(meta.get("data", {}))
    m = candidates if candidates is not None else default_candidates(data_spec, target.num_outputs,
                                                                     data_init=init in DATA_INITS)

    sources = None
    if init in DATA_INITS:
        from datarecon.data import DataSpec, load_task

        typer.echo(f"initialisation (experimenter's choice): loading {init} images of {data_spec.get('dataset')} "
                   f"via the model's data spec; the attack itself never sees them", err=True)
        task = load_task(DataSpec.model_validate(data_spec), data_dir=data_dir)
        norm = task.normalisation
        sources = InitSources(ground_truth=norm.to_model(task.train.x), ground_truth_labels=task.train.y,
                              partition=norm.to_model(task.partition.x) if task.partition.x.shape[0] else None,
                              partition_labels=task.partition.y if task.partition.x.shape[0] else None)

    generator = torch.Generator().manual_seed(seed)
    x0 = make_init(init, m=m, input_shape=target.input_shape, mean=mean, generator=generator, sources=sources,
                   dtype=dt, device=dev, **init_params)
    labels = init_labels(init, m=m, sources=sources, **init_params)
    if labels is None:
        prior = AttackerPrior.balanced(m=m, num_outputs=target.num_outputs, input_shape=target.input_shape,
                                       lower=lower, upper=upper)
    else:
        labels = labels.to(torch.float64) if target.num_outputs == 1 else labels.long()
        prior = AttackerPrior(labels=labels.to(dev), input_shape=target.input_shape, lower=lower, upper=upper)
    prior.check(target)

    prepare_out_dir(out, overwrite=overwrite, resume=resume)
    attack = make_attack(entry, config)
    early = (ResidualPlateau(key="rel_residual", patience=early_stop_patience, rel_tol=early_stop_tol)
             if early_stop_patience > 0 else None)
    record = {"init": {"name": init, "params": init_params, "experimenter_choice": init in DATA_INITS},
              "early_stop": {"patience": early_stop_patience, "rel_tol": early_stop_tol}, "device": str(dev)}
    rec = run_attack(attack, target, prior, x0=x0, generator=generator, steps=getattr(config, "steps", None),
                     out=out, checkpoint_every=checkpoint_every, resume=resume, progress=progress,
                     log_every=log_every, seed=seed, early_stop=early, record=record)
    if rec.status == "diverged":
        raise DivergenceError(rec.summary.get("message", f"{method} diverged") + f" (last finite state in {out})")
    final = rec.summary.get("final", {})
    rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
    shown = f"loss {final.get('loss', float('nan')):.4g}" + (f", relative residual {rel:.4g}" if rel is not None else "")
    typer.echo(f"{method}: {rec.status} after {rec.steps_done} steps ({shown}); wrote {out}")


def register(app: typer.Typer) -> None:
    """Add ``reconstruct`` to ``app``."""
    app.command("reconstruct")(reconstruct)
