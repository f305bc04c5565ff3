"""What the attacker knows beyond the weights: the typed threat model of a run.

The default attacker of the papers has the weights θ*, the architecture, the loss (and weight
decay), the input shape and range and the label set (:class:`~datarecon.attacks.base.Target`,
:class:`~datarecon.attacks.base.AttackerPrior`). A stronger attacker may also know

* the **initialisation** θ_init the target was trained from (Loo et al. 2023): as a safetensors
  file with the model's parameter names (``known_init: path``), or rebuilt from the architecture
  and a seed (``known_init: "seed:N"``, model directories only, which record their architecture);
  for a fine-tuned model, the public pretrained model it started from (``known_init:
  "pretrained"`` for the directory the model records, ``"pretrained:DIR"`` for another copy), with
  the new head drawn from the recorded seed where the training drew one
  (:func:`datarecon.models.pretrained.finetune_start`, the very construction the training used);
* the **training-set size** n (``n``);
* the **training recipe** (``recipe``): the optimiser, learning rate, momentum, batch size, the seed
  of the batch order and the number of epochs the model directory records, some of them possibly
  unknown (``unknown: [lr, order]``: the dynamics-matching attack then learns the learning rate
  and draws its own batch order).

:class:`KnowledgeSettings` is the part of a run file (``knowledge:``) and of the CLI
(``--known-init``, ``--known-n``) that says so; :func:`resolve_known_init` turns it into a
:class:`KnownInit` (tensors and their SHA-256) after checking it against the target, and
:func:`threat_model` is the record written to run.json and shown at the top of every report. Each
attack declares what it uses (``Attack.uses``). :func:`attacker_knowledge` resolves it all for a target at once
(the known θ_init and n, the recipe, restored labels, and the first dense layer's subspace analysis), for the
reconstruction attacks and the membership signals alike.

A model directory records the SHA-256 of the initialisation it was trained from
(``init_sha256`` in model.json, :func:`init_digest`); a known initialisation whose hash differs
is refused, so an attack never silently runs with the wrong θ_init. The hash says nothing about
the training images.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.labels import RestoredLabels, restore_labels
from datarecon.attacks.subspace import analyse, first_dense_layer
from datarecon.config import RecordedConfig
from datarecon.errors import DataReconError
from datarecon.kernel.step import TrainingRecipe
from datarecon.models.pretrained import HEAD_NEW, finetune_start, load_recorded_pretrained
from datarecon.models.spec import ArchSpec, build_model, first_layer_init_std
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.io import load_tensors, params_digest

__all__ = ["KNOWLEDGE_ITEMS", "KnowledgeSettings", "KnownInit", "KnownRecipe", "RESTORED_NEEDS_INIT", "RecipeSettings",
           "SUBSPACE_SEED", "attacker_knowledge", "check_known_n", "init_digest", "resolve_known_init", "resolve_recipe", "threat_model"]

#: Everything an attack may declare in its ``uses`` (the default attacker has ``weights``).
KNOWLEDGE_ITEMS: tuple[str, ...] = ("weights", "known_init", "n", "recipe")

#: recipe fields an attacker may not know (the others are the recorded ones)
UNKNOWABLE: tuple[str, ...] = ("lr", "order")


class RecipeSettings(BaseModel):
    """The training recipe as attacker knowledge (run file ``knowledge.recipe``, CLI ``--known-recipe``).

    Attributes:
        source: ``model``: the recipe the model directory records (optimiser ``gd`` with a
            constant learning rate, momentum, batch size, epochs done, the seed of the batch order;
            the loss and weight decay are the target's).
        unknown: recorded fields the attacker does not know: ``lr`` (learned by the attack from a
            starting value) and ``order`` (the batch order: the attack draws its own, seeded).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["model"] = Field(default="model", description="where the recipe comes from")
    unknown: tuple[Literal["lr", "order"], ...] = Field(default=(), description="fields the attacker does not know")


@dataclass(frozen=True)
class KnownRecipe:
    """What the attacker knows of a model's training: the recorded recipe (the one
    :class:`~datarecon.kernel.step.TrainingRecipe`, ``epochs`` the ones trained, what the attacker does
    not know as None), the training-set size and the fields it knows.

    Attributes:
        recipe: the recorded training (``lr`` and ``seed`` None when unknown).
        n: training-set size.
        known: the fields the attacker knows, in order.
    """

    recipe: TrainingRecipe
    n: int
    known: tuple[str, ...]

    @property
    def batch_size(self) -> int:
        """b, 1 ≤ b ≤ n (b = n: full batch)."""
        return int(self.recipe.batch_size or self.n)

    @property
    def epochs(self) -> int:
        """Epochs trained."""
        return int(self.recipe.epochs)

    @property
    def lr(self) -> float | None:
        """η (None: unknown)."""
        return self.recipe.lr

    @property
    def momentum(self) -> float:
        """μ of the heavy-ball buffer."""
        return float(self.recipe.momentum)

    @property
    def order_seed(self) -> int | None:
        """The seed of the batch order (None: unknown)."""
        return self.recipe.seed

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.n // self.batch_size)

    @property
    def steps(self) -> int:
        """Training steps in all: epochs · ⌈n/b⌉."""
        return self.epochs * self.steps_per_epoch

    @property
    def norm_mode(self) -> str:
        """How the training ran batch norm (``train``: batch statistics; ``eval``: the running ones fixed)."""
        return self.recipe.norm_mode

    def record(self) -> dict[str, Any]:
        """run.json / report form: every field, with the unknown ones as None, and ``known``.

        The optimiser, schedule and augmentation are fixed by what can be replayed (SGD with heavy-ball
        momentum at a constant lr; ``datarecon train`` has no data augmentation), so they are recorded
        as constants, known to the attacker with the model's loss."""
        return {"n": self.n, "batch_size": self.batch_size, "epochs": self.epochs, "lr": self.lr,
                "momentum": self.momentum, "order_seed": self.order_seed, "optimizer": "sgd",
                "schedule": "constant", "augmentation": "none", "known": list(self.known),
                **({"norm_mode": "train"} if self.norm_mode == "train" else {})}


def resolve_recipe(settings: RecipeSettings, model_meta: Mapping[str, Any] | None) -> KnownRecipe:
    """The recipe a model directory records, with the fields ``settings.unknown`` names hidden.

    Raises:
        DataReconError: no model directory; a recorded training the attack cannot replay (L-BFGS,
            a schedule other than constant, DP-SGD, margin ascent).
    """
    if model_meta is None or "training" not in model_meta:
        raise DataReconError("a known recipe is read from a model directory's record of its training; this model "
                             "has none (a model of your own): drop --known-recipe")
    tr = model_meta["training"]
    metrics = model_meta.get("metrics") or {}
    if tr.get("optimizer") != "gd" or tr.get("schedule") != "constant" or tr.get("dp"):
        raise DataReconError(f"the recorded training (optimizer {tr.get('optimizer')}, schedule {tr.get('schedule')}"
                             f"{', DP-SGD' if tr.get('dp') else ''}) cannot be replayed: dynamics matching replays "
                             "gd / SGD with a constant learning rate; train the target with those")
    if (tr.get("margin_ascent") or {}).get("steps") or "margin_ascent_steps" in metrics:
        raise DataReconError("the recorded training ends with margin ascent, which dynamics matching does not "
                             "replay; train the target without it")
    n = int(metrics.get("n_train") or 0)
    if n < 1:
        raise DataReconError("the model directory records no training-set size (metrics n_train); retrain it")
    b = int(tr.get("batch_size") or n)
    hidden = set(settings.unknown)
    # n is part of the recipe: the number of steps per epoch and the candidates the replay trains on
    known = tuple(f for f in ("n", "lr", "momentum", "batch_size", "epochs", "order") if f not in hidden)
    recipe = TrainingRecipe(loss=str(model_meta.get("loss", tr.get("loss", ""))),
                            weight_decay=float(model_meta.get("weight_decay", tr.get("weight_decay", 0.0)) or 0.0),
                            lr=None if "lr" in hidden else float(tr["lr"]), momentum=float(tr.get("momentum", 0.0)),
                            epochs=int(metrics.get("epochs_done", tr.get("epochs", 0))), batch_size=b,
                            seed=None if "order" in hidden else int(model_meta.get("seed", tr.get("seed", 0))),
                            norm_mode=recorded_norm_mode(model_meta))
    return KnownRecipe(recipe=recipe, n=n, known=known)


def recorded_norm_mode(model_meta: Mapping[str, Any]) -> Literal["train", "eval"]:
    """How the recorded training ran batch norm: its ``norm_mode``, or (``auto``, and model directories
    written before the field existed) eval for a fine-tuning and train from scratch."""
    mode = (model_meta.get("training") or {}).get("norm_mode", "auto")
    if mode in ("train", "eval"):
        return mode
    if mode != "auto":
        raise DataReconError(f"the model directory records training.norm_mode {mode!r}, which no training writes "
                             "(auto, train or eval): its model.json was changed; re-create the model with "
                             "`datarecon train`")
    return "eval" if model_meta.get("pretrained") else "train"

_SEED = re.compile(r"^seed:(\d+)$")
#: ``known_init: seed``: the seed the model directory records (its training seed)
RECORDED_SEED = "seed"
#: ``known_init: pretrained`` (the recorded pretrained directory) or ``pretrained:DIR``
PRETRAINED = "pretrained"


class KnowledgeSettings(RecordedConfig):
    """The attacker's knowledge beyond θ* (run file key ``knowledge``; all off by default).

    Attributes:
        known_init: the initialisation θ_init: ``"seed:N"`` (rebuilt from the model directory's
            architecture with seed N), ``"seed"`` (with the seed the model directory records),
            ``"pretrained"`` / ``"pretrained:DIR"`` (a fine-tuned model's start: the pretrained model
            it records, or the one in DIR, with the head the training used) or the path of a
            safetensors file with the model's parameter names; None: unknown (the weights-only
            attacker).
        n: the training-set size, if the attacker knows it (sets the subspace dimension and, when
            ``candidates`` is not given, nothing else).
        labels: the candidates' labels: ``balanced`` (the assumption that the classes are equally
            frequent, or the init's own labels: the default) or ``restored`` (estimated from the read-out's
            change θ* − θ_init, :func:`datarecon.attacks.labels.restore_labels`; needs ``known_init`` and a
            multiclass target).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    added_fields: ClassVar[tuple[str, ...]] = ("recipe", "labels")  # records of earlier runs stay valid

    known_init: str | None = Field(default=None, description="seed:N, seed, pretrained[:DIR] or a safetensors "
                                   "file of θ_init")
    n: int | None = Field(default=None, ge=1, description="training-set size known to the attacker")
    recipe: RecipeSettings | None = Field(default=None, description="the training recipe known to the attacker")
    labels: Literal["balanced", "restored"] = Field(default="balanced", description="candidate labels: balanced "
                                                    "(equal class shares assumed) or restored (from θ* − θ_init)")


    @field_validator("known_init")
    @classmethod
    def _form(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        if not v:
            raise ValueError("known_init is empty; pass seed:N or the path of a safetensors file")
        if v.startswith("seed:") and not _SEED.match(v):
            raise ValueError(f"known_init {v!r} is not seed:N with N a non-negative integer (e.g. seed:0)")
        if v.startswith(f"{PRETRAINED}:") and not v[len(PRETRAINED) + 1:].strip():
            raise ValueError(f"known_init {v!r} names no directory; pass pretrained (the recorded one) or "
                             "pretrained:DIR")
        return v

    @property
    def any(self) -> bool:
        """True when the attacker knows more than the weights."""
        return self.known_init is not None or self.n is not None or self.recipe is not None or self.labels != "balanced"


@dataclass(frozen=True)
class KnownInit:
    """A resolved θ_init.

    Attributes:
        params: name → tensor, the target's parameter names and shapes.
        sha256: :func:`init_digest` of ``params``.
        source: ``seed:N`` or the file's absolute path.
        stats: batch norm's running statistics at the start, by buffer name (a rebuilt initialisation's
            fresh ones, a pretrained model's own); empty when unknown (a file of parameters) or when the
            network has no batch norm. A replay of a training in train mode starts from them.
    """

    params: dict[str, torch.Tensor]
    sha256: str
    source: str
    stats: dict[str, torch.Tensor] = field(default_factory=dict)

    def to(self, *, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> KnownInit:
        return KnownInit(params={k: v.to(device=device, dtype=dtype) for k, v in self.params.items()},
                         sha256=self.sha256, source=self.source,
                         stats={k: v.to(device=device, dtype=dtype) for k, v in self.stats.items()})


def init_digest(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of named parameters (:func:`datarecon.utils.io.params_digest`: float64 casts, sorted
    names, shapes and bytes), as model directories record it for their initialisation."""
    return params_digest(params)


def _check_fits(init: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor], where: str) -> None:
    missing = [k for k in params if k not in init]
    extra = [k for k in init if k not in params]
    if missing or extra:
        what = (f"missing {', '.join(missing[:4])}" if missing else "") + \
               ("; " if missing and extra else "") + (f"unexpected {', '.join(extra[:4])}" if extra else "")
        raise DataReconError(f"{where} does not fit the model ({what}); it must hold one tensor per model "
                             f"parameter: {', '.join(list(params)[:6])}")
    for k, v in params.items():
        if tuple(init[k].shape) != tuple(v.shape):
            raise DataReconError(f"{where}: {k} has shape {tuple(init[k].shape)}, the model's is {tuple(v.shape)}; "
                                 "pass the initialisation of this architecture")
        if not init[k].dtype.is_floating_point or not bool(torch.isfinite(init[k]).all()):
            raise DataReconError(f"{where}: {k} is not a finite float tensor; pass the initialisation as floats")


def resolve_known_init(spec: str, params: Mapping[str, torch.Tensor], *, model_meta: Mapping[str, Any] | None,
                       base_dir: str | Path | None = None) -> KnownInit:
    """θ_init from ``spec`` (``seed:N`` or a safetensors file), checked against the target.

    Args:
        spec: :attr:`KnowledgeSettings.known_init` (``seed`` is the recorded seed).
        params: θ* (names and shapes to match).
        model_meta: the model directory's model.json (architecture, recorded ``init_sha256``), or
            None for a model without a model directory (then only a file is possible).
        base_dir: folder a relative path is resolved against (default: the current folder).

    Returns:
        :class:`KnownInit` in the dtype of ``params``.

    Raises:
        DataReconError: ``seed:N`` without a model directory, ``seed`` on a model that records no
            seed; a file that is missing, not safetensors, or misses / misshapes a parameter (also a
            rebuilt architecture that differs from the weights); a hash that differs from the one the
            model directory records.
    """
    dtype = next(iter(params.values())).dtype
    device = next(iter(params.values())).device
    if spec == RECORDED_SEED:
        recorded = (model_meta or {}).get("seed")
        if model_meta is None or recorded is None:
            raise DataReconError("known_init seed uses the seed the model directory records, and this model records "
                                 "none; pass seed:N or a safetensors file of θ_init")
        spec = f"seed:{int(recorded)}"
    match = _SEED.match(spec)
    stats: dict[str, torch.Tensor] = {}
    if spec == PRETRAINED or spec.startswith(f"{PRETRAINED}:"):
        init, stats, where, source = _pretrained_start(spec, model_meta, base_dir=base_dir)
    elif match:
        if model_meta is None or "arch" not in model_meta:
            raise DataReconError(f"known_init {spec} needs a model directory to rebuild the architecture from; "
                                 "for your own model pass a safetensors file of θ_init (--known-init FILE)")


        arch = ArchSpec.model_validate(model_meta["arch"])
        # in the dtype training built it in: a float32 draw is not a rounded float64 draw
        built = torch_dtype((model_meta.get("training") or {}).get("dtype") or "float64")
        net = build_model(arch, generator=torch.Generator().manual_seed(int(match.group(1))), dtype=built)
        init = {k: v.detach() for k, v in net.named_parameters()}
        stats = {k: v.detach() for k, v in net.named_buffers() if v.is_floating_point()}
        where, source = f"known_init {spec}", spec
    else:
        path = Path(spec)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise DataReconError(f"known_init file {path} not found; pass seed:N or the path of a safetensors file "
                                 "with the model's initial parameters")
        init = load_tensors(path)  # refuses pickles and non-safetensors files with one line
        where, source = f"known_init file {path}", str(path.resolve())
    _check_fits(init, params, where)
    digest = init_digest(init)
    recorded = (model_meta or {}).get("init_sha256")
    if recorded and recorded != digest:
        pretrained = (model_meta or {}).get("pretrained") or ((model_meta or {}).get("training") or {}).get(
            "pretrained")
        if isinstance(pretrained, dict):  # its start is the pretrained model, whatever seed it records
            hint = (f"the model was fine-tuned from the pretrained model in {pretrained.get('path')}: pass "
                    f"{PRETRAINED} (--known-init {PRETRAINED})")
        elif model_meta and model_meta.get("seed") is not None:
            hint = f"the model was trained with seed {model_meta.get('seed')}"
        else:
            hint = "pass the initialisation the model was trained from"
        raise DataReconError(f"{where} is not the initialisation this model was trained from (sha256 "
                             f"{digest[:12]} vs recorded {recorded[:12]}); {hint}")
    return KnownInit(params={k: init[k].to(device=device, dtype=dtype) for k in params}, sha256=digest,
                     source=source, stats={k: v.to(device=device, dtype=dtype) for k, v in stats.items()})


def _pretrained_start(spec: str, model_meta: Mapping[str, Any] | None, *,
                      base_dir: str | Path | None
                      ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str, str]:
    """θ_init of a fine-tuned model from its public pretrained model: (params, running statistics, where, source).

    Raises:
        DataReconError: a model that was not fine-tuned, a missing or invalid pretrained directory,
            or one whose weights are not those the model records.
    """
    meta = model_meta or {}
    record = meta.get("pretrained")
    if not isinstance(record, dict):
        raise DataReconError(f"known_init {spec}: this model was not fine-tuned from a pretrained model (its "
                             "model.json records none); pass seed, seed:N or a safetensors file of θ_init")
    path = Path(spec[len(PRETRAINED) + 1:].strip() if spec != PRETRAINED else str(record.get("path")))
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    try:
        bundle = load_recorded_pretrained(meta, path=None if spec == PRETRAINED and path.is_absolute() else path)
    except DataReconError as exc:
        raise DataReconError(f"known_init {spec}: {exc}") from None
    built = torch_dtype((meta.get("training") or {}).get("dtype") or "float64")
    weights = {k: v for k, v in bundle.model.state_dict().items() if v.is_floating_point()}
    net = finetune_start(weights, bundle.arch, ArchSpec.model_validate(meta["arch"]),
                         seed=int(meta.get("seed") or 0), dtype=built, new_head=record.get("head") == HEAD_NEW)
    return ({k: v.detach() for k, v in net.named_parameters()},
            {k: v.detach() for k, v in net.named_buffers() if v.is_floating_point()}, f"known_init {spec}",
            f"{PRETRAINED}:{path.resolve()}")


def check_known_n(n: int | None, model_meta: Mapping[str, Any] | None) -> None:
    """Refuse a known training-set size that is not the one the model directory records (``metrics.n_train``):
    the attacker's knowledge is checked as a known θ_init is, so a false n is not used silently.

    Raises:
        DataReconError: the recorded n and the fix.
    """
    recorded = ((model_meta or {}).get("metrics") or {}).get("n_train")
    if n is None or not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 1 or n == recorded:
        return
    raise DataReconError(f"known n = {n} is not this model's training-set size: its model directory records "
                         f"n_train {recorded}; set knowledge.n (--known-n) to {recorded} or leave it out")


def threat_model(settings: KnowledgeSettings, known: KnownInit | None, *, uses: tuple[str, ...],
                 requires: tuple[str, ...] = (), recipe: KnownRecipe | None = None,
                 labels: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run.json record of the attacker's knowledge and what the attack used of it.

    Args:
        labels: the restored labels' record (:meth:`datarecon.attacks.labels.RestoredLabels.summary`),
            or None where the labels are the balanced assumption or the init's.

    Returns:
        ``{"weights": True, "known_init": {"source", "sha256"} | None, "n": int | None,
        "used": [...], "summary": one line}`` (and ``"labels"`` when restored).
    """
    has = {"weights": True, "known_init": known is not None, "n": settings.n is not None, "recipe": recipe is not None}
    used = [item for item in KNOWLEDGE_ITEMS if item in uses and has[item]]
    parts = ["weights θ*, architecture, loss, input range, label set"]
    if known is not None:
        parts.append(f"initialisation θ_init ({known.source})")
    if settings.n is not None:
        parts.append(f"n = {settings.n}")
    if recipe is not None:
        hidden = [f for f in UNKNOWABLE if f not in recipe.known]
        parts.append("training recipe (" + ", ".join(recipe.known) + (f"; not: {', '.join(hidden)}" if hidden else "")
                     + ")")
    if labels is not None:
        parts.append("labels restored from θ* − θ_init (counts " + ", ".join(str(c) for c in labels["counts"]) + ")")
    unused = [item for item in KNOWLEDGE_ITEMS if has[item] and item not in used]
    summary = "attacker knows: " + "; ".join(parts) + (f" (not used by this attack: {', '.join(unused)})"
                                                        if unused else "")
    return {"weights": True, "known_init": None if known is None else {"source": known.source, "sha256": known.sha256},
            "n": settings.n, "used": used, "requires": list(requires), "summary": summary,
            **({"recipe": recipe.record()} if recipe is not None else {}),
            **({"labels": dict(labels)} if labels is not None else {})}


#: Seed of the randomized SVD of the subspace analysis (fixed: the analysis is part of the attacker's set-up).
SUBSPACE_SEED = 0


def attacker_knowledge(target: Target, prior: AttackerPrior, knowledge: KnowledgeSettings, *,
                       model_meta: Mapping[str, Any] | None, uses: tuple[str, ...] = ("weights", "known_init", "n"),
                       requires: tuple[str, ...] = ()) -> tuple[AttackerPrior, dict[str, Any]]:
    """The prior with the attacker's knowledge resolved (known θ_init, n) and the subspace analysis
    of the first dense layer (W, or W − a·W_init) added; and the threat-model record for run.json.

    The analysis is skipped (``subspace`` None) for models without a dense layer.

    Raises:
        DataReconError: a known initialisation that does not fit or is not the model's; a known n that is not
            the recorded training-set size.
    """

    check_known_n(knowledge.n, model_meta)
    known = None
    if knowledge.known_init is not None:
        known = resolve_known_init(knowledge.known_init, target.params, model_meta=model_meta)
    recipe = None if knowledge.recipe is None else resolve_recipe(knowledge.recipe, model_meta)
    init_std = None
    if model_meta is not None and "arch" in model_meta and known is None:

        init_std = first_layer_init_std(ArchSpec.model_validate(model_meta["arch"]))
    try:
        first_dense_layer(target.model, target.params)
        has_dense = True
    except DataReconError:  # no nn.Linear (CNN read-outs are analysed; other models may have none)
        has_dense = False
    analysis = None
    if has_dense:
        analysis = analyse(target.model, target.params, known_init=None if known is None else known.params,
                           n=knowledge.n, fit_coefficient=target.weight_decay > 0, init_std=init_std,
                           generator=torch.Generator().manual_seed(SUBSPACE_SEED))
    prior = dataclasses.replace(prior, known_init=known, n=knowledge.n, subspace=analysis, recipe=recipe)
    restored = None
    if knowledge.labels == "restored":
        prior, restored = _restored_labels(target, prior)
    return prior, threat_model(knowledge, known, uses=uses, requires=requires, recipe=recipe,
                               labels=None if restored is None else restored.summary())


#: how the labels stay balanced, in each command's words
_BALANCED = "reconstruct --known-labels balanced, membership --labels balanced (knowledge.labels: balanced in a file)"
#: the refusal of restored labels without θ_init
RESTORED_NEEDS_INIT = ("labels restored from the weights read the read-out's change θ* − θ_init; pass --known-init "
                        f"(e.g. pretrained; knowledge.known_init in a file), or keep the labels balanced: {_BALANCED}")


def _restored_labels(target: Target, prior: AttackerPrior) -> tuple[AttackerPrior, RestoredLabels]:
    """The prior with its m labels restored from the read-out's change θ* − θ_init (m: the candidate count,
    the training-set size n the estimate shares out)."""
    if prior.known_init is None:
        raise DataReconError(RESTORED_NEEDS_INIT)
    if target.num_outputs < 2:
        raise DataReconError("labels are restored for a multiclass read-out; a binary or regression target keeps "
                             f"its labels balanced: {_BALANCED}")
    restored = restore_labels(target.model, target.params, prior.known_init.params, prior.m)
    labels = restored.labels.to(device=prior.labels.device)
    return dataclasses.replace(prior, labels=labels), restored
