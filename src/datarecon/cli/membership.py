"""``datarecon membership``: are these images in the model's training set?

``--evaluate`` measures every membership signal (loss, LiRA's confidence, gradient norm, the first
dense layer's subspace, and with ``--references K`` LiRA offline and online and RMIA from K reference
models trained with the model's recipe) on the model's training images against non-members drawn
from the unused part of its training split, and names the strongest signal, chosen where the
reported ROCs are not measured (:mod:`datarecon.experiments.membership`). ``--images`` scores a
user's own images, with a member call at ``--fpr`` calibrated on a null the user can see (``--null``,
default the model's held-out test images). ``--out DIR`` keeps everything, reference models
included, in a membership folder that the next call into it reuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import typer

from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.cli._common import DEFAULT_THREADS, set_threads, threads_help
from datarecon.cli._own import OWN_OPTIONS, OwnFields, is_own_model, labelled, own_model_target
from datarecon.cli.options import Flag, backend_options, config_options, flags, option_group
from datarecon.config import build_config, load_config_file
from datarecon.errors import DataReconError
from datarecon.experiments.execution import Execution
from datarecon.experiments.membership.choice import HALF_IN
from datarecon.experiments.membership.evaluate import evaluate_membership
from datarecon.experiments.membership.folder import check_membership_folder
from datarecon.experiments.membership.images import score_images
from datarecon.experiments.membership.own import OwnModel, OwnSets, evaluate_own_membership, own_record
from datarecon.experiments.membership.settings import (Calibration, MembershipSettings, Runtime, check_budget_applies,
                                                       check_settings_apply, parse_references)
from datarecon.report.text import reference_lines, strongest_lines
from datarecon.kernel.outdir import claim_out_dir
from datarecon.utils.device import parse_device

#: Image rows printed on the terminal (all of them go to --out).
SHOWN = 20


@dataclass(frozen=True)
class Where:
    """Where a membership call reads its settings, writes and computes (one option group).

    Attributes:
        config: a YAML/TOML file of the evaluation's settings (one-to-one with
            :class:`~datarecon.experiments.membership.settings.MembershipSettings`; flags override it), or None.
        out: the membership folder (None: print only).
        overwrite: replace a membership folder of another model or other draws.
        data_dir: the data folder.
        device: torch device of the reference models.
        threads: CPU threads for PyTorch, of the driver and of each reference-model task (0: its default).
        progress: show progress of the reference models and of the scoring.
    """

    config: Path | None
    out: Path | None
    overwrite: bool
    data_dir: Path | None
    device: str
    threads: int
    progress: bool


WHERE = {
    "config": (Path | None, None, typer.Option("--config", help="YAML/TOML membership settings (one-to-one with "
                                               "MembershipSettings, docs/RUNS.md); the flags override it")),
    "out": (Path | None, None, typer.Option("--out", help="membership folder: result, table, ROC figure and the "
                                            "reference models (a rerun into it reuses them)")),
    "overwrite": (bool, False, typer.Option("--overwrite", help="replace a membership folder of another model or "
                                            "other draws")),
    "data_dir": (Path | None, None, typer.Option("--data-dir", envvar="DATARECON_DATA",
                                                 help="data folder (the non-members, the default null)")),
    "device": (str, "cpu", typer.Option("--device", help="cpu, cuda or cuda:N (the reference models).")),
    "threads": (int, DEFAULT_THREADS, typer.Option("--threads", help=threads_help(per=", each reference-model task's "
                                                                                      "too"))),
    "progress": (bool, True, typer.Option("--progress/--no-progress", help="Show progress of the reference models "
                                          "and the scoring (a bar on a terminal, plain lines in a log).")),
}


def _flags() -> tuple[tuple[Flag, ...], tuple[Flag, ...], tuple[Flag, ...]]:
    """The flags of the attacker's knowledge (``--known-init``, ``--known-n``; the recipe is not used
    here), of the calibration (``--null``, ``--fpr``, ``--signal``) and of the evaluation's settings."""
    knowledge = flags(KnowledgeSettings, rename={"known_init": "--known-init", "n": "--known-n"},
                      skip=("recipe.source", "recipe.unknown"))
    settings = flags(MembershipSettings, prefix={"references": "reference-", "attacks": ""},
                     rename={"references.count": "--references", "references.budget_minutes": "--budget-minutes",
                             "seed": "--draw-seed"}, parse={"references.count": parse_references})
    return knowledge, flags(Calibration, parse={"null": Path}), settings


KNOWLEDGE_FLAGS, CALIBRATION_FLAGS, SETTINGS_FLAGS = _flags()


@dataclass(frozen=True)
class Subject(OwnFields):
    """The model measured: a model directory, or a user's own model with its examples and training function.

    Attributes:
        model: the model directory, or ``package.module:factory`` returning the user's nn.Module.
        weights, input_shape, value_range, loss, weight_decay: the user's model
            (:class:`~datarecon.cli._own.OwnOptions`).
        train: its training examples (the members): a safetensors file of inputs x and labels y.
        heldout: examples it did not train on (the non-members), the same form.
        public: further examples it did not train on, never a candidate (RMIA's population), or None.
        recipe: ``package.module:train``, the function ``train(x, y, seed) -> nn.Module`` that trains it, for the
            reference models (inputs in the dtype of its weights, labels as its loss takes them:
            :func:`~datarecon.experiments.membership.trainers.recipe_inputs`), or None (no reference attacks).
    """

    model: str
    train: Path | None
    heldout: Path | None
    public: Path | None
    recipe: str | None

    def given(self) -> list[str]:
        """The options given that only a user's own model takes."""
        return self.own.given() + [k for k, v in {"--train": self.train, "--heldout": self.heldout,
                                                  "--public": self.public, "--recipe": self.recipe}.items()
                                   if v is not None]


SUBJECT = {
    "model": (str, ..., typer.Option(..., "--model", help="model directory (from `datarecon train`), or "
                                     "package.module:factory returning your nn.Module (with --weights)")),
    **OWN_OPTIONS,
    "train": (Path | None, None, typer.Option("--train", help="your model: its training examples, the members "
                                              "(safetensors: inputs x, labels y)")),
    "heldout": (Path | None, None, typer.Option("--heldout", help="your model: examples it did not train on, the "
                                                "non-members (safetensors: x, y)")),
    "public": (Path | None, None, typer.Option("--public", help="your model: further unseen examples for RMIA's "
                                               "population (safetensors: x, y)")),
    "recipe": (str | None, None, typer.Option("--recipe", help="your model: package.module:train, the function "
                                              "train(x, y, seed) -> nn.Module for the reference models; x: inputs "
                                              "(n, *input-shape) in the dtype of --weights, y: (n,) labels as in "
                                              "--train (class indices int64; one output: -1/+1 in that dtype), seed: "
                                              "an int")),
}


@config_options(KNOWLEDGE_FLAGS, into="knowledge")
@config_options(CALIBRATION_FLAGS, into="calibration")
@config_options(SETTINGS_FLAGS, into="settings")
@backend_options(workers="Reference-model tasks in flight (1: in-process).", default_workers=1)
@option_group("where", Where, WHERE)
@option_group("subject", Subject, SUBJECT, first=True)
def membership(
    images: Path | None = typer.Option(None, "--images", help="images to score: a folder of PNGs, an .npz or a "
                                       ".safetensors file (values 0-255 or [0, 1]; labels as array y)"),
    evaluate: bool = typer.Option(False, "--evaluate", help="measure every signal on the model's own training "
                                  "images against non-members it never saw (ROC AUC, TPR at 1% and 0.1% FPR)"),
    *,
    subject: Subject,
    where: Where,
    knowledge: dict[str, Any],
    calibration: dict[str, Any],
    settings: dict[str, Any],
    backend: Execution,
) -> None:
    """Membership inference: loss, LiRA, RMIA, gradient norm and subspace signals on a model's training set."""
    if (images is None) == (not evaluate):
        raise DataReconError("pass --images PATH (score your images) or --evaluate (measure the signals), one of them")
    if evaluate and calibration:
        raise DataReconError("--null, --fpr and --signal set the member call of --images; --evaluate measures every "
                             "signal's whole ROC: drop them")
    model = subject.model
    set_threads(where.threads)
    parse_device(where.device)
    known = build_config(KnowledgeSettings, knowledge, where="knowledge")
    cfg = (load_config_file(where.config, MembershipSettings, overrides=settings) if where.config is not None
           else build_config(MembershipSettings, settings, where="membership settings"))
    calibrated = build_config(Calibration, calibration, where="calibration")
    check_budget_applies(cfg.references, budget_given="budget_minutes" in (settings.get("references") or {}))
    check_settings_apply(cfg.references, _given(settings, subject, backend), evaluate=evaluate,
                         out=where.out is not None)
    mine = _own_model(subject, images=images)
    drawn = [flag for flag, key in (("--nonmembers", "nonmembers"), ("--population", "population")) if key in settings]
    if mine is not None and drawn:  # they draw from a model directory's data spec; a user's model brings its sets
        raise DataReconError(f"{drawn[0]} draws from a model directory's data; your own model's non-members are "
                             f"--heldout FILE and its population samples --public FILE: drop {drawn[0]}")
    if not cfg.references.auto and cfg.references.count and where.out is None and evaluate:
        raise DataReconError(f"--references {cfg.references.count} needs --out DIR: the reference models are kept "
                             "there and reused by the next call")
    threads = where.threads or (1 if (backend.workers or 1) > 1 else None)
    run = _Run(model=model, known=known, settings=cfg, calibration=calibrated, where=where,
               execution=dataclasses.replace(backend, threads=threads), progress=where.progress, own=mine)
    if where.out is None:
        result = run.evaluate(None) if evaluate else run.images(images, None)  # type: ignore[arg-type]
    else:
        with claim_out_dir(where.out, kind="membership", overwrite=where.overwrite,
                           resume=not where.overwrite) as claim:
            if not claim.clear:
                check_membership_folder(where.out, run.record())  # before any work
            result = run.evaluate(claim) if evaluate else run.images(images, claim)  # type: ignore[arg-type]
    _print_evaluation(result) if evaluate else _print_scores(result, calibrated.fpr)
    if where.out is not None:
        typer.echo(f"wrote {where.out}")


def _given(settings: dict[str, Any], subject: Subject, backend: Execution) -> dict[str, str]:
    """What the command line set that acts on reference models or an evaluation only, as
    :func:`~datarecon.experiments.membership.settings.check_settings_apply` names it → the option as spelled."""
    found = {}
    for flag in SETTINGS_FLAGS:
        value: Any = settings
        for part in flag.path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            spelled = flag.decls[0].split("/")
            found[flag.path] = spelled[0] if value is not False or len(spelled) == 1 else spelled[1]
    if subject.recipe is not None and is_own_model(subject.model, subject.own.weights):  # else refused as such
        found["recipe"] = "--recipe"
    options = {"--backend": backend.backend != "local", "--workers": (backend.workers or 1) != 1,
               "--ray-address": backend.ray_address is not None}
    chosen = [flag for flag, given in options.items() if given]
    if chosen:
        found["execution"] = chosen[0]
    return found


@dataclass(frozen=True)
class _Own:
    """A user's model as the command line gave it: its target, examples and factory, weights and recipe."""

    target: Any
    sets: OwnSets
    model: OwnModel


def _own_model(data: Subject, *, images: Path | None) -> _Own | None:
    """The user's model of ``--model package.module:factory --weights FILE``, its examples read and checked; None
    for a model directory (whose data spec names its examples: the own-model options are refused)."""
    model, own = data.model, data.own
    if not is_own_model(model, own.weights):
        given = data.given()
        if given:
            raise DataReconError(f"{', '.join(given)} apply to --model package.module:factory only; a model directory "
                                 "records its recipe and data itself")
        return None
    if images is not None:
        raise DataReconError("--images calls images against a model directory's held-out null; for your own model "
                             "measure the signals with --evaluate --train FILE --heldout FILE")
    target = own_model_target(model, own, homogeneity=False)
    if data.train is None or data.heldout is None:
        raise DataReconError(f"--model {model} needs --train FILE (its training examples) and --heldout FILE "
                             "(examples it did not train on): safetensors files of inputs x and labels y")
    shape = tuple(target.input_shape)
    members, nonmembers = labelled(data.train, "--train", input_shape=shape), labelled(data.heldout, "--heldout",
                                                                                      input_shape=shape)
    shared = _shared_examples(members[0], nonmembers[0])
    if shared:
        raise DataReconError(f"{shared} of the {len(nonmembers[0])} --heldout examples ({data.heldout}) are also "
                             f"--train examples ({data.train}); the non-members must be examples the model did not "
                             "train on: pass other --heldout examples")
    sets = OwnSets(members=members, nonmembers=nonmembers,
                   population=None if data.public is None else labelled(data.public, "--public", input_shape=shape),
                   sources=(str(data.train), str(data.heldout), str(data.public)))
    return _Own(target=target, sets=sets, model=OwnModel(factory=model, weights=Path(own.weights),  # type: ignore[arg-type]
                                                           recipe=data.recipe))


def _shared_examples(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many rows of ``b`` equal a row of ``a`` exactly (the same example given as a member and a non-member)."""
    seen = {row.numpy().tobytes() for row in a.reshape(len(a), -1)}
    return sum(row.numpy().tobytes() in seen for row in b.reshape(len(b), -1))


class _Run:
    """One invocation's inputs, so that the two modes share them."""

    def __init__(self, *, model: str, known: Any, settings: Any, calibration: Calibration, where: Where,
                 execution: Execution, progress: bool, own: _Own | None) -> None:
        self.model, self.known, self.settings, self.calibration = model, known, settings, calibration
        self.where, self.execution, self.progress, self.own = where, execution, progress, own

    def record(self) -> Any:
        """The model as the membership folder records it (a model directory, or the user's model)."""
        return self.model if self.own is None else own_record(self.model, weights=self.own.model.weights)

    def runtime(self) -> Any:
        return Runtime(execution=self.execution, device=self.where.device, data_dir=self.where.data_dir,
                       log=typer.echo, progress=self.progress)

    def evaluate(self, out: Any) -> dict[str, Any]:
        if self.own is not None:
            return evaluate_own_membership(self.own.target, self.own.sets, self.own.model, settings=self.settings,
                                           knowledge=self.known, out=out, runtime=self.runtime())
        return evaluate_membership(self.model, settings=self.settings, knowledge=self.known, out=out,
                                   runtime=self.runtime())

    def images(self, images: Path, out: Any) -> dict[str, Any]:
        return score_images(self.model, images, calibration=self.calibration, knowledge=self.known, out=out,
                            attacks=self.settings.attacks, runtime=self.runtime())


def _print_evaluation(result: dict[str, Any]) -> None:
    """What ``--evaluate`` prints: the knowledge, where the images came from, the reference models (or why and what
    they would cost), one line per signal, the strongest beside the loss threshold, and the empirical ε bound."""
    typer.echo(result["knowledge"]["summary"])
    candidates = result["candidates"]
    typer.echo(f"members: {candidates['members']['source']}")
    typer.echo(f"non-members: {candidates['nonmembers']['count']} {candidates['nonmembers']['source']}")
    for line in reference_lines(result.get("references")):
        typer.echo(line)
    split = result["split"]
    if split["calibration"]["members"]:
        typer.echo(f"the strongest signal is chosen on a calibration part of {split['calibration']['members']} "
                   f"members + {split['calibration']['nonmembers']} non-members and its headline measured on the "
                   f"other {split['report']['members']} + {split['report']['nonmembers']}; every signal below is "
                   "measured on all the candidates of its scope")
    width = max(len(k) for k in result["signals"])
    for name, v in result["signals"].items():
        text = v["line"].split(": ", 1)[1] if v.get("line") else v["note"]
        where = " (the half-in pool)" if v.get("scope") == HALF_IN else ""
        typer.echo(f"  {name:<{width}}  {v['kind']:<9}  {text}{where}")
        if v.get("line") and v.get("note"):
            typer.echo(f"  {'':<{width}}  {'':<9}  note: {v['note']}")
        if v.get("baseline_line"):
            typer.echo(f"  {'':<{width}}  {'':<9}  beside it, {v['baseline_line']}")
    for line in strongest_lines(result):
        typer.echo(line)


def _print_scores(result: dict[str, Any], fpr: float) -> None:
    """What ``--images`` prints: the knowledge, the null, the first :data:`SHOWN` images' calls and notes."""
    typer.echo(result["knowledge"]["summary"])
    typer.echo(f"signal: {result['signal']} ({result['signal_rule']}); null: {result['null']['count']} images "
               f"from {result['null']['source']}; threshold at most {fpr:.1%} of the null pass")
    for row in result["images"][:SHOWN]:
        typer.echo(f"  {row['name']:<32} score {row['score']:.4g}  p {row['p_value']:.4f}  "
                   f"{'MEMBER' if row['member'] else 'non-member'}")
    if result["n_images"] > SHOWN:
        typer.echo(f"  ... {result['n_images'] - SHOWN} more (all in --out)")
    typer.echo(f"{result['members']} of {result['n_images']} images called members at {fpr:.1%} FPR")
    for note in result["notes"]:
        typer.echo(f"note: {note}")


def register(app: typer.Typer) -> None:
    """Add ``membership`` to ``app``."""
    app.command("membership")(membership)
