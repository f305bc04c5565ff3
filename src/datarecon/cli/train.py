"""``datarecon train`` (train a target model) and ``datarecon info`` (show a model card).

Options override the fields of ``--config FILE`` (YAML/TOML mapping one-to-one to
:class:`datarecon.training.target.TrainConfig`); without a config file, ``--dataset``,
``--task`` and ``--n-per-class`` are required. User errors are raised as
:class:`~datarecon.errors.DataReconError`; the main CLI prints them on one line (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from datarecon.cli._common import ThreadsOption
from datarecon.errors import DataReconError


def _hidden(text: str | None) -> list[int] | None:
    if text is None:
        return None
    text = text.strip()
    if text in ("", "none"):
        return []
    try:
        widths = [int(s) for s in text.split(",")]
    except ValueError:
        raise DataReconError(f"--hidden must be a comma-separated list of widths like 1000,1000; got {text!r}") from None
    return widths


def _cap(text: str | None) -> float | str | None:
    """``--max-lr-factor``: a number >= 1, or ``none`` (no cap)."""
    if text is None:
        return None
    if text.strip().lower() in ("none", "inf", "off"):
        return "none"
    try:
        return float(text)
    except ValueError:
        raise DataReconError(f"--max-lr-factor must be a number >= 1 or 'none' (no cap); got {text!r}") from None


def _strip_none(d: dict[str, Any]) -> dict[str, Any]:
    """Drop ``None`` values (options not given) recursively, and mappings left empty."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = _strip_none(v)
            if not v:
                continue
        if v is not None:
            out[k] = v
    return out


def train_cmd(
    out: Annotated[Path, typer.Option("--out", help="Model directory to write.")],
    config: Annotated[Path | None, typer.Option("--config", help="YAML/TOML training config; options override it.")] = None,
    dataset: Annotated[str | None, typer.Option(help="Dataset (cifar10, mnist, digits).")] = None,
    task: Annotated[str | None, typer.Option(help="Task (vehicles-animals, odd-even, pair:a,b, classes:a,b,..., all).")] = None,
    n_per_class: Annotated[int | None, typer.Option("--n-per-class", help="Training images per class.")] = None,
    selection: Annotated[str | None, typer.Option(help="first | random.")] = None,
    data_seed: Annotated[int | None, typer.Option("--data-seed", help="Seed of --selection random.")] = None,
    n_heldout_per_class: Annotated[int | None, typer.Option("--n-heldout-per-class",
                                                            help="Held-out test images per class.")] = None,
    n_partition_per_class: Annotated[int | None, typer.Option("--n-partition-per-class",
                                                              help="Disjoint partition images per class.")] = None,
    normalisation: Annotated[str | None, typer.Option(help="unit | unit-minus-mean.")] = None,
    arch: Annotated[str | None, typer.Option(help="Architecture (affine, one-hidden, mlp, cnn, resnet8, resnet18).")] = None,
    hidden: Annotated[str | None, typer.Option("--hidden", "--channels",
                                               help="Hidden widths (cnn: channels; resnets: stage widths), comma-separated, e.g. 1000,1000.")] = None,
    kernel: Annotated[int | None, typer.Option("--kernel", help="Convolution kernel side (cnn; default 3).")] = None,
    bias: Annotated[bool | None, typer.Option("--bias/--no-bias", help="Linear layers with biases.")] = None,
    init_scale: Annotated[float | None, typer.Option("--init-scale", help="Std of first-layer weights.")] = None,
    loss: Annotated[str | None, typer.Option(help="Loss (logistic, mse, huber, cross-entropy).")] = None,
    weight_decay: Annotated[float | None, typer.Option("--weight-decay", help="wd in (wd/2)|θ|².")] = None,
    optimizer: Annotated[str | None, typer.Option(help="gd | lbfgs.")] = None,
    lr: Annotated[float | None, typer.Option(help="Learning rate.")] = None,
    momentum: Annotated[float | None, typer.Option(help="Heavy-ball momentum (gd).")] = None,
    epochs: Annotated[int | None, typer.Option(help="Maximum epochs (full-batch steps).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Mini-batch SGD with batches of this size "
                                                   "(order drawn from --seed; default: full batch).")] = None,
    schedule: Annotated[str | None, typer.Option(help="constant | loss-normalised | increasing.")] = None,
    max_lr_factor: Annotated[str | None, typer.Option(
        "--max-lr-factor", help="Cap of growing schedules relative to --lr, or 'none' (loss-normalised then "
                                "steps lr*grad log L in the log domain).")] = None,
    margin_ascent_steps: Annotated[int | None, typer.Option(
        "--margin-ascent-steps", help="Margin-ascent steps after the epochs (0: off).")] = None,
    margin_ascent_step_size: Annotated[float | None, typer.Option(
        "--margin-ascent-step-size", help="Initial margin-ascent angle (radians).")] = None,
    margin_ascent_growth: Annotated[float | None, typer.Option(
        "--margin-ascent-growth", help="Angle factor after an accepted step.")] = None,
    margin_ascent_max_step: Annotated[float | None, typer.Option(
        "--margin-ascent-max-step", help="Largest margin-ascent angle.")] = None,
    margin_ascent_min_step: Annotated[float | None, typer.Option(
        "--margin-ascent-min-step", help="Stop margin ascent when the angle falls below this.")] = None,
    loss_threshold: Annotated[float | None, typer.Option("--loss-threshold", help="Stop below this loss.")] = None,
    stop_at_zero_error: Annotated[bool | None, typer.Option("--stop-at-zero-error/--no-stop-at-zero-error",
                                                            help="Stop at zero training error.")] = None,
    margin_patience: Annotated[int | None, typer.Option("--margin-patience",
                                                        help="Stop when the normalised margin is stable over this many epochs.")] = None,
    margin_rtol: Annotated[float | None, typer.Option("--margin-rtol",
                                                      help="Relative change counted as stable (--margin-patience).")] = None,
    kkt_score: Annotated[bool | None, typer.Option("--kkt-score/--no-kkt-score",
                                                   help="Record the KKT-regime score in the model card.")] = None,
    dp_noise: Annotated[float | None, typer.Option("--dp-noise", help="DP-SGD (Opacus; pip install "
                                                   "'datarecon[dp]'): noise multiplier sigma.")] = None,
    dp_epsilon: Annotated[float | None, typer.Option("--dp-epsilon", help="DP-SGD: target epsilon at --dp-delta "
                                                     "(sigma solved by Opacus; instead of --dp-noise).")] = None,
    dp_clip: Annotated[float | None, typer.Option("--dp-clip", help="DP-SGD: per-sample clip norm C.")] = None,
    dp_batch_size: Annotated[int | None, typer.Option("--dp-batch-size",
                                                      help="DP-SGD: expected Poisson batch size.")] = None,
    dp_delta: Annotated[float | None, typer.Option("--dp-delta", help="DP-SGD: delta < 1/n (default 1/(10n)).")] = None,
    dp_accountant: Annotated[str | None, typer.Option("--dp-accountant",
                                                      help="DP-SGD: Opacus accountant (rdp, prv, gdp).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 | float64.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda[:N].")] = None,
    seed: Annotated[int | None, typer.Option(help="Initialisation seed.")] = None,
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help="Epochs between checkpoints.")] = None,
    log_every: Annotated[int | None, typer.Option("--log-every", help="Epochs between history rows.")] = None,
    data_dir: Annotated[str | None, typer.Option("--data-dir", envvar="DATARECON_DATA",
                                                 help="Data folder (default $DATARECON_DATA).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out directory.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue from OUT/checkpoint.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress",
                                           help="Show progress (a bar on a terminal, plain lines in a log).")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", hidden=True,
                                        help="Deprecated: --no-progress, and no model card.")] = False,
    threads: ThreadsOption = 0,
) -> None:
    """Train a target model full batch and write its model directory."""
    from datarecon.cli._common import set_threads
    from datarecon.config import load_config_file

    set_threads(threads)
    from datarecon.training.target import TrainConfig, build_train_config, train_target

    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    overrides: dict[str, Any] = _strip_none({
        "data": {"dataset": dataset, "task": task, "n_per_class": n_per_class, "selection": selection,
                 "normalisation": normalisation, "seed": data_seed, "n_heldout_per_class": n_heldout_per_class,
                 "n_partition_per_class": n_partition_per_class},
        "arch": {"name": arch, "hidden": _hidden(hidden), "bias": bias, "init_scale": init_scale, "kernel": kernel},
        "loss": loss, "weight_decay": weight_decay, "optimizer": optimizer, "lr": lr, "momentum": momentum,
        "epochs": epochs, "batch_size": batch_size, "schedule": schedule, "max_lr_factor": _cap(max_lr_factor),
        "margin_ascent": {"steps": margin_ascent_steps, "step_size": margin_ascent_step_size,
                          "growth": margin_ascent_growth, "max_step": margin_ascent_max_step,
                          "min_step": margin_ascent_min_step},
        "stop": {"loss_threshold": loss_threshold, "zero_error": stop_at_zero_error,
                 "margin_patience": margin_patience, "margin_rtol": margin_rtol},
        "kkt_score": kkt_score,
        "dp": {"noise_multiplier": dp_noise, "target_epsilon": dp_epsilon, "max_grad_norm": dp_clip,
               "batch_size": dp_batch_size, "delta": dp_delta, "accountant": dp_accountant},
        "dtype": dtype, "device": device, "seed": seed, "checkpoint_every": checkpoint_every,
        "log_every": log_every,
    })
    if overrides.get("max_lr_factor") == "none":
        overrides["max_lr_factor"] = None  # after _strip_none: an explicit "no cap"
    if config is not None:
        cfg = load_config_file(config, TrainConfig, overrides=overrides)
    else:
        given = overrides.get("data", {})
        missing = [f"--{k.replace('_', '-')}" for k in ("dataset", "task", "n_per_class") if k not in given]
        if missing:
            raise DataReconError(f"missing {', '.join(missing)}; pass them or a --config FILE")
        cfg = build_train_config(overrides)
    result = train_target(cfg, data_dir=data_dir, out=out, resume=resume, overwrite=overwrite,
                          progress=progress and not quiet)
    if not quiet:
        from datarecon.models.checkpoint import load_model_dir
        from datarecon.training.target import model_card

        typer.echo(model_card(load_model_dir(result.out)))
    typer.echo(f"wrote {result.out}")


def info_cmd(model_dir: Annotated[Path, typer.Argument(help="A model directory (from datarecon train).")]) -> None:
    """Print the model card of a model directory (architecture, data, loss, metrics, versions)."""
    from datarecon.models.checkpoint import load_model_dir
    from datarecon.training.target import model_card

    typer.echo(model_card(load_model_dir(model_dir)))


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``info`` to ``app``."""
    app.command("train")(train_cmd)
    app.command("info")(info_cmd)
