"""``datarecon reconstruct``: run a reconstruction attack on a trained model directory.

The command builds one :class:`~datarecon.experiments.reconstruct.ReconstructionRun` and executes
it. Fields come, in increasing priority, from the run's defaults, ``--config FILE`` (a run file,
YAML/TOML, one-to-one with ``ReconstructionRun``: docs/RUNS.md), the explicit options (each flag
overrides one field: ``--method`` → ``attack.method``, ``--steps`` → ``attack.steps``, ``--init`` →
``init.name``, ``--checkpoint-every`` → ``checkpoint.every``, ...; an attack option is refused when
the method has no such field) and ``--set field=value`` (value parsed as YAML; a plain ``field`` is
an attack field, a dotted ``init.scale`` any field of the run). The command parses; the layers are
merged and validated once by :func:`~datarecon.experiments.reconstruct.run_from_layers`, the method's
config from the ATTACKS registry, so a new method plugs in by registering itself.

The attack only receives the attacker's view (θ*, architecture, loss, weight decay, input shape
and range, labels). The one place this command loads data is a data-dependent initialisation
(``ground-truth``, ``partition``, ``mix``): an experimenter's choice, loaded through the model's
data spec and labelled as such in the output and in run.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

from datarecon.attacks import ATTACKS, INITS
from datarecon.attacks.presets import PRESETS
from datarecon.cli._common import resume_command
from datarecon.cli._own import OWN_OPTIONS, OwnOptions, is_own_model, own_model_target, own_options_refused
from datarecon.cli.options import (
    Common,
    Flag,
    Output,
    common_options,
    config_options,
    flags,
    option_group,
    output_options,
    union_flags,
)
from datarecon.config import read_config_mapping
from datarecon.errors import DataReconError
from datarecon.experiments.reconstruct import (
    DATA_INITS_NOTE,
    OWN_MODEL,
    ReconstructionRun,
    RunLayers,
    RunOptions,
    budgeted_runs,
    execute,
    layered_init_name,
    prepare,
    reconstruct_runs,
    run_from_layers,
    run_name,
    with_preset,
)
from datarecon.kernel.outdir import check_out_dir
from datarecon.kernel.status import EVALUABLE

DATA_INITS = ("ground-truth", "partition", "mix")


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["a=1", "b=x"]`` → ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise DataReconError(f"--set expects field=value, got {item!r}")
        key, value = item.split("=", 1)
        if not key.strip() or any(not part for part in key.strip().split(".")):
            raise DataReconError(f"--set {item}: the field name {key.strip()!r} is empty or has an empty part; pass "
                                 "field=value (e.g. --set lr_x=0.01 or --set init.scale=0.05)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


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


def _coefficient(text: str) -> float | str:
    """``--init-coefficient``: auto, fit or a number."""
    try:
        return float(text)
    except ValueError:
        return text.strip()


def _flags() -> tuple[Flag, ...]:
    """One flag per field of a run: its settings (ReconstructionRun), every method's attack fields
    and every initialisation's parameters (a field another method or init lacks is refused for it)."""
    methods = sorted(ATTACKS.names(), key=lambda m: (m != "kkt", m))  # the default method's fields first
    run = flags(ReconstructionRun, skip=("model", "attack", "init"), prefix={"checkpoint": "", "knowledge": "known-"},
                rename={"candidates": ("--candidates", "-m"), "checkpoint.every": "--checkpoint-every",
                        "early_stop.rel_tol": "--early-stop-tol", "knowledge.known_init": "--known-init"},
                parse={"knowledge.recipe": _recipe_option})
    attack = union_flags({m: ATTACKS.get(m).config_cls for m in methods}, head="attack", what="methods",
                         parse={"init_coefficient": _coefficient})
    init = union_flags({i: INITS.get(i).params_cls for i in INITS.names()}, head="init", what="inits",
                       prefix="init-", rename={"l1": "--mix-l1", "l2": "--mix-l2", "noise": "--mix-noise"})
    return run + attack + init


FLAGS = _flags()


@dataclass(frozen=True)
class ModelOptions:
    """Which model is attacked: a model directory, or your own module and what a model directory would record.

    Attributes:
        model: the model directory, or package.module:factory.
        weights: your model's weights (a safetensors state dict).
        input_shape: your model: the shape of one input (``3,32,32``).
        value_range: your model: ``lower,upper`` of valid inputs.
        loss: your model: its training loss (None: logistic for one output, cross-entropy for several).
        weight_decay: your model: its training weight decay.
    """

    model: str | None
    weights: Path | None
    input_shape: str | None
    value_range: str
    loss: str | None
    weight_decay: float


MODEL_OPTIONS = {
    "model": (str | None, None, typer.Option("--model", help="model directory (from `datarecon train`; run.model), or "
                                             "package.module:factory returning your nn.Module (with --weights)")),
    **OWN_OPTIONS,
}


@dataclass(frozen=True)
class RunSource:
    """Where the run's fields come from besides the generated flags.

    Attributes:
        method: the attack method (``attack.method``; None: the run file's, else kkt).
        init: the initialisation (``init.name``; None: the run file's, else gaussian).
        config_file: a run file (YAML/TOML) the options override.
        sets: ``field=value`` overrides of any field (``--set``, repeatable).
        preset: a settings preset laid under the run file (``attacks.presets.PRESETS``).
    """

    method: str | None
    init: str | None
    config_file: Path | None
    sets: list[str] | None
    preset: str | None


SOURCE_OPTIONS = {
    "method": (str | None, None, typer.Option("--method", help=f"attack method ({', '.join(ATTACKS.ordered())}; "
                                              "default kkt)")),
    "init": (str | None, None, typer.Option("--init", help=f"initialisation ({', '.join(INITS.ordered())}; default "
                                            "gaussian)")),
    "config_file": (Path | None, None, typer.Option("--config", help="run file (YAML/TOML, one-to-one with "
                                                    "ReconstructionRun; docs/RUNS.md); the options override it")),
    "sets": (list[str] | None, None, typer.Option("--set", help="field=value override of any config field "
                                                  "(repeatable)")),
    "preset": (str | None, None, typer.Option("--preset", help="a published recipe's settings ("
                                              + "; ".join(f"{k}: {PRESETS.get(k).description}" for k in PRESETS.ordered())
                                              + "), under the run file, the flags and --set")),
}


@dataclass(frozen=True)
class BatchOptions:
    """``--runs K``: K runs of one run with consecutive seeds, stepped together and pooled.

    Attributes:
        runs: K ≥ 1 (1: a single run into OUT) as given, or ``auto``: as many as ``budget_minutes`` allows
            (:mod:`datarecon.experiments.reconstruct.budget`).
        mode: ``auto`` (looped on CPU, batched on CUDA), ``batched`` (KKT/DecoReco: one vmapped
            gradient and one update per step) or ``looped``.
        budget_minutes: with ``runs`` ``auto``: the K runs' time budget in minutes.
    """

    runs: str
    mode: str
    budget_minutes: float | None = None

    def count(self) -> int | None:
        """K as given, or None for ``auto``.

        Raises:
            DataReconError: a count that is not an integer or ``auto``; ``auto`` without a budget or a budget
                without ``auto``.
        """
        if self.runs.strip().lower() == "auto":
            if self.budget_minutes is None:
                raise DataReconError("--runs auto picks K from a time budget; pass --budget-minutes MINUTES "
                                     "(e.g. --runs auto --budget-minutes 30)")
            return None
        try:
            runs = int(self.runs)
        except ValueError:
            raise DataReconError(f"--runs takes a count K >= 1 or auto, got {self.runs!r}; pass e.g. --runs 4, or "
                                 "--runs auto --budget-minutes 30") from None
        if self.budget_minutes is not None:
            raise DataReconError("--budget-minutes applies to --runs auto (K chosen to fit the budget); pass "
                                 "--runs auto, or drop --budget-minutes")
        return runs


BATCH_OPTIONS = {
    "runs": (str, "1", typer.Option("--runs", help="K independent runs (seeds SEED..SEED+K-1) into OUT/run0..run<K-1>, "
                                  "stepped together (how: --batch-mode) and pooled into OUT "
                                  "(evaluate OUT); auto: as many as --budget-minutes allows")),
    "mode": (str, "auto", typer.Option("--batch-mode", help="with --runs: auto (looped on CPU, where batching "
                                        "measured slower; batched on CUDA) | batched | looped")),
    "budget_minutes": (float | None, None, typer.Option("--budget-minutes", help="with --runs auto: the time "
                                                        "budget of the K runs (K from the measured cost of run "
                                                        "0's probe and first steps; run.json runs_auto)")),
}


@output_options(out="run directory to write", resume="continue from OUT/checkpoint", overwrite="replace an existing OUT")
@option_group("model", ModelOptions, MODEL_OPTIONS, first=True)
@option_group("source", RunSource, SOURCE_OPTIONS, first=True)
@config_options(FLAGS)
@option_group("batch", BatchOptions, BATCH_OPTIONS)
@common_options()
def reconstruct(
    data_dir: Path | None = typer.Option(None, "--data-dir", help="data folder (data-dependent inits only)"),
    *,
    model: ModelOptions,
    source: RunSource,
    batch: BatchOptions,
    output: Output,
    common: Common,
    overrides: dict[str, Any],
) -> None:
    """Reconstruct training-data candidates from a trained model's weights.

    Every field of the run (docs/RUNS.md) has its flag below: the run's settings, each method's attack
    fields (those of other methods are refused) and each initialisation's parameters.
    """
    runs = batch.count()
    if runs == 1 and batch.mode != "auto":
        raise DataReconError(f"--batch-mode {batch.mode} applies to --runs K (K runs stepped together); pass "
                             "--runs K or drop --batch-mode")
    run, target, record = _run(model, source, overrides)
    out, resume, overwrite = output.out, output.resume, output.overwrite
    if runs != 1:
        if target is not None:
            raise DataReconError("--runs K applies to a model directory; run a model given as "
                                 "package.module:factory once per --seed")
        options = RunOptions(resume=resume, overwrite=overwrite, progress=common.progress, data_dir=data_dir)
        record = {"resume_command": resume_command()}
        if runs is None:
            runs, record["runs_auto"] = _budgeted(run, out, options, budget_minutes=float(batch.budget_minutes or 0))
        _reconstruct_runs(run, out, options, runs=runs, batch_mode=batch.mode, record=record)
        return
    check_out_dir(out, kind="run", overwrite=overwrite, resume=resume)  # before the note below
    setup = None
    if run.init.name in DATA_INITS:  # the note once the images are read and fit the run: a refusal stays one line
        setup = prepare(run, data_dir=data_dir, target=target)
        typer.echo(DATA_INITS_NOTE.format(init=run.init.name), err=True)
    record["resume_command"] = resume_command()
    options = RunOptions(resume=resume, overwrite=overwrite, progress=common.progress, data_dir=data_dir,
                     raise_on_divergence=True)
    rec = execute(run, out, options, setup=setup, record=record, target=target)
    final = rec.summary.get("final", {})
    rel = rec.summary.get("selection", {}).get("relative_residual", {}).get("value")
    shown = f"loss {final.get('loss', float('nan')):.4g}" + (f", relative residual {rel:.4g}" if rel is not None else "")
    typer.echo(f"{run.method}: {rec.status} after {rec.steps_done} steps ({shown}); wrote {out}")


def _run(model_options: ModelOptions, source: RunSource, overrides: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """(the typed run, a user's own model as the target or None, extra run.json fields): the command
    line parsed into the run's layers (:func:`~datarecon.experiments.reconstruct.run_from_layers`
    merges and validates them)."""
    config_file = source.config_file
    fields = with_preset(source.preset, read_config_mapping(config_file) if config_file is not None else {},
                         method=source.method)
    sets = parse_set(source.sets)
    _check_counts(overrides)
    init_name = layered_init_name(fields, source.init)
    for key in overrides.get("init", {}):  # an init flag the chosen initialisation has no field for
        flag = next(f for f in FLAGS if f.path == f"init.{key}")
        if init_name not in flag.owners:
            raise DataReconError(f"{flag.decls[0]} applies to {', '.join(flag.owners)} inits, not {init_name!r}")
    model, target, record = _own_model(model_options, init_name=init_name)
    where = f"run file {config_file}" if config_file is not None else "run"
    run = run_from_layers(RunLayers(file=fields, flags=overrides, sets=sets, method=source.method, init=source.init,
                                    model=model, where=where))
    if source.preset is not None:
        record["preset"] = source.preset
    return run, target, record


def _own_model(options: ModelOptions, *, init_name: str) -> tuple[str | None, Any, dict[str, Any]]:
    """(run.model, target, record): a model given as package.module:factory becomes the target itself
    (run.model the placeholder OWN_MODEL, the record naming it); the own-model options are refused
    for a model directory (it records them)."""
    model, weights = options.model, options.weights
    own = OwnOptions(weights=weights, input_shape=options.input_shape, value_range=options.value_range,
                     loss=options.loss, weight_decay=options.weight_decay)
    if model is not None and is_own_model(model, weights):
        target = own_model_target(model, own)
        if init_name in DATA_INITS:
            raise DataReconError(f"--init {init_name} needs the model's training data; a model given as "
                                 "package.module:factory has none: use --init gaussian or uniform")
        return OWN_MODEL, target, {"own_model": {"factory": model,
                                                 "weights": str(Path(weights).resolve()) if weights else None}}
    own_options_refused(own)
    return model, None, {}


def _check_counts(overrides: dict[str, Any]) -> None:
    """The one-line messages of counts below 1 (before the run's own validation words them generically)."""
    candidates = overrides.get("candidates")
    if candidates is not None and candidates < 1:
        raise DataReconError(f"candidate count must be at least 1, got {candidates}; pass --candidates M with M >= 1")
    if any(v is not None and v < 1 for v in overrides.get("checkpoint", {}).values()):
        raise DataReconError("--checkpoint-every and --log-every must be >= 1")


def drop_none(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without ``None`` values, recursively (an option left out overrides nothing)."""
    return {k: drop_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None}


def _budgeted(run: ReconstructionRun, out: Path, options: RunOptions, *, budget_minutes: float) -> tuple[int, Any]:
    """``--runs auto``: K and run.json's ``runs_auto`` (:func:`~datarecon.experiments.reconstruct.budget.
    budgeted_runs`), the output folder checked before anything is measured; one line saying what was chosen."""
    check_out_dir(out, kind="run", overwrite=options.overwrite, resume=options.resume)
    runs, chosen = budgeted_runs(run, out, budget_minutes=budget_minutes, resume=options.resume,
                                 data_dir=options.data_dir)
    typer.echo(f"--runs auto: {runs} runs in --budget-minutes {budget_minutes:g} (one run measured at about "
               f"{chosen['seconds_per_run'] / 60:.3g} minutes here)", err=True)
    return runs, chosen


def _reconstruct_runs(run: ReconstructionRun, out: Path, options: RunOptions, *, runs: int, batch_mode: str, record: dict[str, Any]) -> None:
    """``--runs K``: K run directories OUT/run<j> pooled into OUT (experiments.reconstruct.reconstruct_runs);
    one line per run, then the one result: the pool."""
    method = run.method
    if run.init.name in DATA_INITS:  # the note once the images are read and fit the run: a refusal stays one line
        prepare(run, data_dir=options.data_dir)
        typer.echo(DATA_INITS_NOTE.format(init=run.init.name), err=True)
    recs = reconstruct_runs(run, out, options, runs=runs, mode=batch_mode, record=record)
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
