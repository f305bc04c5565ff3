"""Python API for one reconstruction run: a typed :class:`ReconstructionRun` in, a run directory out.

A :class:`ReconstructionRun` describes one run completely (the model directory, the attack's
config as a union discriminated on ``method``, the initialisation as a union discriminated on
``name``, the candidate count, seed, device, early stop and checkpointing); a run file (YAML/TOML)
maps one-to-one to it (docs/RUNS.md). :func:`execute` is the one entry point that runs it:
``datarecon reconstruct`` (whose flags override a ``--config`` run file), sweeps (a run plus a
search space), the paper reproductions and experiment files all build a run and call it.

:func:`prepare` builds what an attack receives — the attacker's view of the target (θ*,
architecture, loss, weight decay), the attacker prior (m labels in the model's class proportions,
the pixel box of the model input space) — plus x₀ from the run's initialisation.

Data-dependent initialisations (``ground-truth``, ``partition``, ``mix``) are
the experimenter's explicit choice (Runkel et al. 2024, §4.3/§4.5): only then
are images loaded, from the model's own data spec, and handed to the
initialisation — never to the attack. Their labels then come with the images.

Example:
    >>> from datarecon.experiments.reconstruct import ReconstructionRun, execute
    >>> run = ReconstructionRun.model_validate({"model": "model-dir", "attack": {"method": "kkt", "steps": 500}})
    >>> rec = execute(run, "run-dir")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_serializer

import datarecon.attacks  # noqa: F401  (registers every built-in attack in ATTACKS)
from datarecon.attacks.base import (
    ATTACK_LOOP,
    ATTACKS,
    Attack,
    AttackerPrior,
    AttackSetup,
    Reconstruction,
    Target,
    check_weight_scale,
)
from datarecon.attacks.batched import BatchMember, resolve_mode, run_batched
from datarecon.attacks.init import INITS, CandidateSpec, InitSources, init_labels, make_init
from datarecon.attacks.knowledge import (PRETRAINED, KnowledgeSettings, check_known_n, resolve_known_init,
                                        resolve_recipe, threat_model)
from datarecon.attacks.labels import RestoredLabels, restore_labels
from datarecon.attacks import priors
from datarecon.attacks.priors import check_weights, weighted_priors
from datarecon.attacks.probe import probe_step_sizes, scaled
from datarecon.attacks.runner import run_attack
from datarecon.attacks.selection import CRITERIA, DEFAULT_CRITERION, ResidualPlateau
from datarecon.attacks.subspace import SUBSPACE_FILE, analyse, first_dense_layer, save_analysis
from datarecon.config import (
    MAX_SEED,
    MAX_STEPS,
    build_config,
    build_record,
    drop_defaults,
    layered,
    merge,
    read_config_mapping,
    set_dotted,
)
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.data.selection import check_fingerprint
from datarecon.data.draw import train_count
from datarecon.errors import DataReconError, DivergenceError
from datarecon.experiments.pool import PoolSpec, write_pool
from datarecon.kernel.files import RUN_JSON
from datarecon.kernel.losses import loss_name
from datarecon.kernel.outdir import claim_out_dir
from datarecon.kernel.status import EVALUABLE, Status
from datarecon.models.checkpoint import EXTRAS, read_model_meta
from datarecon.models.spec import ArchSpec, first_layer_init_std
from datarecon.utils.device import parse_device
from datarecon.utils.dtypes import torch_dtype
from datarecon.utils.io import load_tensors, read_json
from datarecon.utils.memory import refuse_if_too_large

DATA_INITS_NOTE = ("initialisation (experimenter's choice): loading {init} images through the model's data spec; "
                   "the attack itself never sees them")


def _tagged(cls: type[BaseModel], *, tag: str, value: str) -> type[BaseModel]:
    """``cls`` with a ``Literal[value]`` field ``tag`` (the discriminator of a union), same other fields."""
    model = create_model(f"{cls.__name__}{value.title().replace('-', '')}", __base__=cls,
                         **{tag: (Literal[value], value)})
    model.__doc__ = f"{cls.__doc__ or cls.__name__} (``{tag}: {value}``)"
    return model


_ATTACK_SPECS: dict[str, type[BaseModel]] = {}
_INIT_SPECS: dict[str, type[BaseModel]] = {}


def attack_spec(method: str) -> type[BaseModel]:
    """The config class of the registered attack ``method`` with a ``method`` tag (built on first use,
    so an attack registered after import, e.g. a plug-in, is a run's method like the built-in ones).

    Raises:
        DataReconError: an unknown method (the registry's message lists the valid names).
    """
    config_cls = ATTACKS.get(method).config_cls
    spec = _ATTACK_SPECS.get(method)
    if spec is None or spec.__base__ is not config_cls:
        spec = _ATTACK_SPECS[method] = _tagged(config_cls, tag="method", value=method)
    return spec


def init_spec(name: str) -> type[BaseModel]:
    """The parameter class of the initialisation ``name`` with a ``name`` tag (as :func:`attack_spec`)."""
    params_cls = INITS.get(name).params_cls
    spec = _INIT_SPECS.get(name)
    if spec is None or spec.__base__ is not params_cls:
        spec = _INIT_SPECS[name] = _tagged(params_cls, tag="name", value=name)
    return spec


def _tagged_config(value: Any, *, tag: str, default: str, spec_of: Any, what: str) -> BaseModel:
    """``value`` as the tagged config it names: a tagged config of the right class is kept as it is, a
    mapping (its tag defaulting to ``default``) is validated once; one-line errors name the bad field."""
    if isinstance(value, BaseModel) and tag in type(value).model_fields:
        if type(value) is spec_of(getattr(value, tag)):
            return value
        value = value.model_dump()
    if not isinstance(value, Mapping):
        raise DataReconError(f"invalid {what}: must be a mapping like {{{tag}: {default}}}, got {value!r}")
    fields = dict(value)
    name = str(fields.get(tag, default))
    spec = spec_of(name)
    return build_config(spec, {**fields, tag: name}, where=f"{name} config" if what == "attack" else f"init {name}")


#: default length of the step-size probe before a run (``RunSettings.step_probe``): the divergences it
#: prevents came within 5 to 25 steps (docs/RESULTS.md, fine-tuned ResNets)
STEP_PROBE_STEPS = 50


#: most retries of a diverged run (``RunSettings.retry_diverged``): each divides the step sizes by 10, so
#: beyond this the steps are too small to move in float32
MAX_RETRIES = 6

#: the factor on every step size of a diverged run's retry
RETRY_FACTOR = 0.1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class EarlyStopSettings(_Frozen):
    """Stop on a plateau of the relative stationarity residual (attacker-side; ``patience`` 0: off).

    Attributes:
        patience: steps without a relative improvement of at least ``rel_tol`` before stopping.
        rel_tol: relative improvement of the residual that counts as progress, > 0.
    """

    patience: int = Field(default=0, ge=0, le=MAX_STEPS)
    rel_tol: float = Field(default=1e-3, gt=0)


class CheckpointSettings(_Frozen):
    """How often a run saves its state and logs its history (steps; neither changes the result).

    Attributes:
        every: steps between checkpoints (the work a crash can lose), >= 1.
        log_every: steps between rows of ``history.jsonl``, >= 1.
    """

    every: int = Field(default=100, ge=1)
    log_every: int = Field(default=10, ge=1)


class RunSettings(_Frozen):
    """Everything of a :class:`ReconstructionRun` but the model (the ``attack`` stage of an experiment file).

    Attributes:
        attack: the method's config with its ``method`` tag (``kkt`` when the tag is left out);
            ``attack.steps`` and ``attack.dtype`` are the run's steps and precision (each method
            has its own default dtype: float32 for the KKT family, float64 for bilevel).
        init: the initialisation with its ``name`` tag (default ``gaussian``, scale 1).
        candidates: m; None: 2n (n for data-dependent inits), n from the model's data spec.
        seed: seeds x₀ and the attack's generator, >= 0.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        early_stop: :class:`EarlyStopSettings`.
        checkpoint: :class:`CheckpointSettings`.
        knowledge: what the attacker knows beyond the weights (:class:`~datarecon.attacks.knowledge.
            KnowledgeSettings`: a known initialisation, n); default: the weights only.
        step_probe: steps of the step-size probe before the run (:mod:`datarecon.attacks.probe`: the
            attack's step sizes divided by 10 while a probe of this many steps diverges); 0: off.
        retry_diverged: a run that diverges later starts again from its start with every step size
            divided by 10, up to this many times (run.json's ``retry_diverged`` records each setting that
            diverged and where); 0: a diverged run stays diverged.
    """

    attack: Any = Field(default_factory=lambda: attack_spec("kkt")())
    init: Any = Field(default_factory=lambda: init_spec("gaussian")())
    candidates: int | None = Field(default=None, ge=1)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    device: str = "cpu"
    early_stop: EarlyStopSettings = Field(default_factory=EarlyStopSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    knowledge: KnowledgeSettings = Field(default_factory=KnowledgeSettings)
    step_probe: int = Field(default=STEP_PROBE_STEPS, ge=0, le=MAX_STEPS)
    retry_diverged: int = Field(default=0, ge=0, le=MAX_RETRIES)

    @model_serializer(mode="wrap")
    def _drop_default_knowledge(self, handler):  # type: ignore[no-untyped-def]
        # the weights-only default is left out, so records and hashes of earlier runs stay as they were
        data = drop_defaults(self, handler(self), ("step_probe", "retry_diverged"))
        if isinstance(data, dict) and not self.knowledge.any:
            data.pop("knowledge", None)
        return data

    @field_validator("attack", mode="before")
    @classmethod
    def _attack(cls, value: Any) -> BaseModel:
        """The attack's tagged config from the ATTACKS registry (``kkt`` when the tag is left out)."""
        return _tagged_config(value, tag="method", default="kkt", spec_of=attack_spec, what="attack")

    @field_validator("init", mode="before")
    @classmethod
    def _init(cls, value: Any) -> BaseModel:
        """The initialisation's tagged parameters from the INITS registry (``gaussian`` by default)."""
        return _tagged_config(value, tag="name", default="gaussian", spec_of=init_spec, what="init")

    @property
    def method(self) -> str:
        """The attack's registry name."""
        return str(self.attack.method)  # type: ignore[attr-defined]

    @property
    def dtype(self) -> torch.dtype:
        """The attack's precision (``attack.dtype``)."""
        return torch_dtype(self.attack.dtype)

    @property
    def steps(self) -> int:
        """The attack's step count (``attack.steps``)."""
        return int(self.attack.steps)

    def method_config(self) -> BaseModel:
        """The attack's own config object (its method's config class, without the ``method`` tag), as
        the attack class takes it: the run's validated values, not validated again."""
        config_cls = ATTACKS.get(self.method).config_cls
        return config_cls.model_construct(
            _fields_set=self.attack.model_fields_set - {"method"},
            **{name: getattr(self.attack, name) for name in config_cls.model_fields})

    def init_params(self) -> dict[str, Any]:
        """The initialisation's parameters (without the ``name`` tag)."""
        fields = self.init.model_dump()
        fields.pop("name", None)
        return fields


#: ``ReconstructionRun.model`` of a run on a user's own module (:meth:`Target.from_module`): it has
#: no model directory; run.json's ``own_model`` says what was attacked.
OWN_MODEL = "<own module>"


class ReconstructionRun(RunSettings):
    """One reconstruction run, complete: a run file (YAML/TOML) maps one-to-one to it (docs/RUNS.md).

    Attributes:
        model: the target's model directory (``datarecon train``); a relative path is relative to
            the current directory.
    """

    model: str


def load_run(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> ReconstructionRun:
    """Read a run file into a :class:`ReconstructionRun`, ``overrides`` (a nested mapping) on top.

    Raises:
        DataReconError: a missing or unparsable file, or invalid fields (one line naming each).
    """
    return build_run(merge(read_config_mapping(path), dict(overrides or {})), where=f"run file {path}")


def build_run(fields: Mapping[str, Any], *, where: str = "run") -> ReconstructionRun:
    """Validate a mapping into a :class:`ReconstructionRun`: each part once, with one-line messages.

    The attack and the initialisation are validated through their registries, so an unknown
    method or init lists the valid names and a bad field reads ``invalid kkt config: lr_x: ...``.

    Raises:
        DataReconError: unknown names or invalid fields (one line).
    """
    data = dict(fields)
    for key in ("attack", "init"):
        if data.get(key) is None:
            data.pop(key, None)
    return build_config(ReconstructionRun, data, where=where)



def run_fields() -> tuple[str, ...]:
    """The run's own fields (``candidates``, ``seed``, ``model``, ...): every field of
    :class:`ReconstructionRun` but ``attack`` and ``init``."""
    return tuple(f for f in ReconstructionRun.model_fields if f not in ("attack", "init"))


def layered_init_name(file_fields: Mapping[str, Any], init: str | None = None) -> str:
    """The initialisation a layered run uses: ``init`` when given, else the run file's, else gaussian."""
    section = file_fields.get("init")
    return init or (section.get("name") if isinstance(section, Mapping) else None) or "gaussian"


@dataclass(frozen=True)
class RunLayers:
    """Where one run's fields come from, in increasing priority: the defaults, a run file, the
    command line's fields, and ``--set`` overrides.

    Attributes:
        file: the run file's mapping (``{}``: none).
        flags: the command line's fields as a nested mapping (``attack`` and ``init`` sections and
            run fields; ``None`` values override nothing).
        sets: ``field=value`` overrides: a plain field is an attack field (``lr_x``), a dotted one any
            field of the run (``init.scale``, ``attack.steps``, ``checkpoint.every``).
        method: the attack method chosen over the file's (``--method``).
        init: the initialisation chosen over the file's (``--init``; the file's parameters then go).
        model: the model chosen over the file's (``--model``).
        where: how errors name the source (``run file F``).
    """

    file: Mapping[str, Any] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)
    sets: Mapping[str, Any] = field(default_factory=dict)
    method: str | None = None
    init: str | None = None
    model: str | None = None
    where: str = "run"


def _layered_attack(layers: RunLayers) -> tuple[str, dict[str, Any]]:
    """(method, its fields, not yet validated): run file < flags < sets; a flag the method has no
    field for is refused, naming the method's fields."""
    attack_file = dict(layers.file.get("attack") or {})
    method = layers.method or attack_file.pop("method", None) or "kkt"
    attack_file.pop("method", None)
    given = dict(layers.flags.get("attack") or {})
    sets = layers.sets
    attack_sets = {k: v for k, v in sets.items() if "." not in k and k not in run_fields()}
    attack_sets.update({k.split(".", 1)[1]: v for k, v in sets.items() if k.startswith("attack.")})
    steps = given.get("steps")
    if isinstance(steps, int) and steps < 1:  # the one message of every count below 1 (not "greater than 0")
        raise DataReconError(f"steps must be at least 1, got {steps}; pass --steps N with N >= 1")
    known = set(ATTACKS.get(method).config_cls.model_fields)
    for key, value in given.items():
        if value is not None and key not in known:
            flag = "--" + key.replace("_", "-")
            raise DataReconError(f"option {flag} does not apply to method {method!r}; "
                                 f"its fields: {', '.join(sorted(known))}")
    return method, layered(attack_file, given, attack_sets)


def _dotted(mapping: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The dotted names of the non-None leaves of a nested mapping."""
    out: set[str] = set()
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out |= _dotted(value, f"{prefix}{key}.")
        elif value is not None:
            out.add(f"{prefix}{key}")
    return out


def _refuse_set_twice(layers: RunLayers) -> None:
    """Refuse a ``--set`` of a field that a flag of the same command line sets too (``--model M --set model=C``):
    one of two values would be used silently."""
    flagged = _dotted(layers.flags) | {name for name, given in (("model", layers.model), ("attack.method", layers.method),
                                                                ("init.name", layers.init)) if given is not None}
    for key, value in layers.sets.items():
        field = key if "." in key or key in run_fields() else f"attack.{key}"
        clash = next((f for f in sorted(flagged) if f == field or f.startswith(f"{field}.")
                      or field.startswith(f"{f}.")), None)
        if clash is not None:
            by = f"--model {layers.model}" if clash == "model" else "its flag"
            raise DataReconError(f"{clash} is given twice, by {by} and by --set {key}={value}; give it once")


def run_from_layers(layers: RunLayers) -> ReconstructionRun:
    """The run of ``layers``: defaults < run file < flags < sets, merged as mappings and validated once
    (:func:`build_run`).

    Raises:
        DataReconError: a section that is not a mapping, an unknown key of the file, no model, a flag
            the method has no field for, a field given by a flag and by ``--set``, invalid fields, fewer than 1
            step or a bad device (one line).
    """
    fields, where = layers.file, layers.where
    for section, example in (("attack", "{method: kkt, steps: 500}"), ("init", "{name: gaussian, scale: 0.05}")):
        if fields.get(section) is not None and not isinstance(fields[section], Mapping):
            raise DataReconError(f"invalid {where}: {section}: must be a mapping like {example}, got "
                                 f"{fields[section]!r}")
    _refuse_set_twice(layers)
    method, attack = _layered_attack(layers)
    init_name = layered_init_name(fields, layers.init)
    init_file = dict(fields.get("init") or {})
    if init_name != init_file.get("name", "gaussian"):
        init_file = {}  # another initialisation was chosen: the file's parameters were for the old one
    init_file.pop("name", None)
    if unknown := [k for k in fields if k not in (*run_fields(), "attack", "init")]:  # before "missing --model"
        raise DataReconError(f"invalid {where}: {', '.join(map(str, unknown))}: unknown "
                             f"key{'s' if len(unknown) > 1 else ''} (allowed keys: attack, init, {', '.join(run_fields())})")
    if layers.model is None and "model" not in fields and "model" not in layers.sets:
        raise DataReconError("missing --model; pass the model directory (--model DIR) or a run file with model: DIR")
    run_flags = {k: v for k, v in layers.flags.items() if k not in ("attack", "init")}
    data = merge({k: v for k, v in fields.items() if k not in ("attack", "init")},
                 {**run_flags, "attack": {"method": method, **attack},
                  "init": {"name": init_name, **init_file, **dict(layers.flags.get("init") or {})},
                  **({"model": str(layers.model)} if layers.model is not None else {})})
    for key, value in layers.sets.items():
        if ("." in key or key in run_fields()) and not key.startswith("attack."):
            set_dotted(data, key, value)
    run = build_run(data, where=where)
    if run.steps < 1:
        raise DataReconError(f"steps must be at least 1, got {run.steps}; pass --steps N with N >= 1")
    parse_device(run.device)
    return run


def method_config(method: str, fields: Mapping[str, Any] | BaseModel | None = None, **options: Any) -> BaseModel:
    """The validated config of ``method`` from a mapping (or a ready config) plus keyword overrides.

    ``None`` values are ignored. Raises DataReconError for an unknown method (lists valid names),
    a field the method does not have, or invalid values (one line naming each bad field).
    """
    config_cls = ATTACKS.get(method).config_cls
    base = fields.model_dump() if isinstance(fields, BaseModel) else dict(fields or {})
    known = set(config_cls.model_fields)
    for key, value in options.items():
        if value is not None and key not in known:
            flag = "--" + key.replace("_", "-")
            raise DataReconError(f"option {flag} does not apply to method {method!r}; "
                                 f"its fields: {', '.join(sorted(known))}")
    return build_config(config_cls, merge(base, options), where=f"{method} config")


def make_attack(method: str, config: BaseModel) -> Attack:
    """Instantiate the registered attack ``method`` from its validated config (its prior weights checked against
    its dtype's range: :func:`~datarecon.attacks.priors.check_weights`)."""
    check_weights(config)
    return ATTACKS.get(method).from_config(config)


def default_candidates(data: Mapping[str, Any], num_outputs: int, *, data_init: bool) -> int:
    """Default m: n for data-dependent inits, else 2n (Haim et al.); n from the model's data spec."""
    n = train_count(data, num_classes=2 if num_outputs == 1 else num_outputs)
    if n <= 0:
        raise DataReconError("the model's data spec has no n_per_class; pass candidates (--candidates M)")
    return n if data_init else 2 * n


def init_sources(model_dir: str | Path, *, data_dir: str | Path | None = None) -> Any:
    """Training and partition images of the model's data spec in model input space (experimenter side)."""
    meta = read_model_meta(model_dir)
    where = f"data spec of {Path(model_dir) / 'model.json'}"
    task = load_task(build_record(DataSpec, meta["data"], where=where).checked(where), data_dir=data_dir)
    check_fingerprint(task, meta.get("data_fingerprint"), where=str(model_dir), splits=("train", "partition"))
    norm = Normalisation.from_mean(meta.get("normalisation", "unit"),
                                   load_tensors(Path(model_dir) / EXTRAS)["input_mean"])
    has_part = task.partition.x.shape[0] > 0
    return InitSources(ground_truth=norm.to_model(task.train.x).double(), ground_truth_labels=task.train.y,
                       partition=norm.to_model(task.partition.x).double() if has_part else None,
                       partition_labels=task.partition.y if has_part else None)


def _check_knowledge(knowledge: KnowledgeSettings, requires: tuple[str, ...], *, cli: bool = True) -> None:
    """Refuse an attack that needs knowledge (the recipe, θ_init) the run does not give; the fix names the flags
    (``cli``) or a file's fields."""
    if "recipe" in requires and knowledge.recipe is None:
        raise DataReconError("this attack replays the training: it needs the training recipe; " + (
            "pass --known-recipe model (knowledge.recipe in a run file)" if cli else
            "set knowledge: {recipe: {source: model}}"))
    if "known_init" in requires and knowledge.known_init is None:
        raise DataReconError("this attack needs the initialisation θ_init: " + (
            "pass --known-init seed:N (model directories) or --known-init FILE.safetensors (knowledge.known_init in "
            "a run file)" if cli else "set knowledge: {known_init: seed} (the seed the model records), seed:N or the "
            "path of a safetensors file"))


@dataclass(frozen=True)
class TargetRecord:
    """What a run can be checked against before its target exists (an experiment, before it trains): whether the
    target is fine-tuned, its training-set size and its input shape (None: not known)."""

    fine_tuned: bool
    n_train: int | None = None
    input_shape: tuple[int, ...] | None = None
    batch_norm: bool | None = None


def _check_step_controls(run: ReconstructionRun, *, cli: bool = True) -> None:
    """Refuse the step-size probe and the retry of a diverged run for an attack without step sizes to scale
    (dynamics matching: Adam bounds its step; bilevel: a line search): there they would do nothing (a retry would
    repeat the same run). The probe's default runs for every method and is a no-op there; only another length
    asked for is refused."""
    if ATTACKS.get(run.method).step_size_fields:
        return
    if run.retry_diverged:
        raise DataReconError(f"attack {run.method!r} has no step sizes a retry could lower, so a retry would diverge "
                             "the same way; " + ("drop --retry-diverged" if cli else "set retry_diverged to 0"))
    if run.step_probe not in (0, STEP_PROBE_STEPS):
        raise DataReconError(f"attack {run.method!r} has no step sizes to probe (it chooses or bounds its own step); "
                             + ("drop --step-probe" if cli else "leave step_probe out"))


def check_before_target(run: ReconstructionRun, target: TargetRecord, *, cli: bool = True) -> None:
    """The checks of :func:`prepare` that need no weights, for a caller that checks a single run before its target
    exists (an experiment, before it trains; a sweep, before its first run): the steps, the device, the attack built
    from its config (no prior coupling runs), the knowledge its method requires (θ_init for restored labels), a
    known n and pretrained start that fit the target, the feature-statistics prior only with batch norm, the
    candidates' memory. ``cli``: fixes name the flags, else the run's fields.

    Raises:
        DataReconError: one line naming the problem.
    """
    if run.steps < 1:
        raise DataReconError(f"steps must be at least 1, got {run.steps}; set attack.steps (--steps N) to N >= 1")
    parse_device(run.device)
    attack = make_attack(run.method, run.method_config())
    if attack.coupled():  # an experiment's run and a sweep's runs are stepped alone
        raise DataReconError("group consistency pulls restarts stepped together toward their consensus (datarecon "
                             "reconstruct --runs K) and this run is stepped alone; set group_weight to 0")
    _check_knowledge(run.knowledge, ATTACKS.get(run.method).requires, cli=cli)
    _check_step_controls(run, cli=cli)
    if run.knowledge.labels == "restored" and run.knowledge.known_init is None:
        raise DataReconError(_RESTORED_NEEDS_INIT)
    if target.batch_norm is False and "feature_stats" in weighted_priors(attack.config):
        raise DataReconError(priors.NO_BATCH_NORM)
    known = run.knowledge.known_init
    if known is not None and (known == PRETRAINED or known.startswith(f"{PRETRAINED}:")) and not target.fine_tuned:
        raise DataReconError(f"known_init {known}: this model was not fine-tuned from a pretrained model; pass seed, "
                             "seed:N or a safetensors file of θ_init")
    check_known_n(run.knowledge.n, {"metrics": {"n_train": target.n_train}})
    if run.candidates is not None and target.input_shape is not None:
        _refuse_candidates_beyond_memory(int(run.candidates), target.input_shape, run.dtype,
                                         option="--candidates" if cli else "candidates:")


@dataclass(frozen=True)
class _InputSpace:
    """The attacked model on the run's device and dtype, and its input space.

    Attributes:
        target: the attacker's view of the model.
        mean: (C, H, W) float64 mean that maps display space [0, 1] to model input space.
        lower, upper: the pixel box of model input space (tensors of the input shape, or floats).
        m: the candidate count.
        meta: the model directory's metadata (None for a user's own model).
        sources: the data-dependent initialisations' images (None when the init needs none).
    """

    target: Target
    mean: torch.Tensor
    lower: Any
    upper: Any
    m: int
    meta: dict[str, Any] | None
    sources: Any


def _input_space(model: str | Path | Target, run: ReconstructionRun, *, data_dir: str | Path | None,
                 sources: Any) -> _InputSpace:
    """The target, pixel box, m and init images of ``run`` against ``model`` (a model directory or a Target)."""
    device, dtype, init, candidates = parse_device(run.device), run.dtype, run.init.name, run.candidates  # type: ignore[attr-defined]
    data_init = INITS.get(init).data
    if isinstance(model, Target):
        target, mean, lower, upper = _own_model(model, candidates=candidates, init=init, data_init=data_init,
                                                sources=sources, device=device, dtype=dtype)
        check_weight_scale(target)
        return _InputSpace(target, mean, lower, upper, int(candidates), None, sources)  # type: ignore[arg-type]
    meta = read_model_meta(model)
    if meta.get("data"):  # the record's data spec, checked before it sizes the candidates or loads data
        where = f"data spec of {Path(model) / 'model.json'}"
        build_record(DataSpec, meta["data"], where=where).checked(where)
    target = Target.from_model_dir(model, device=device, dtype=dtype)
    check_weight_scale(target)
    mean = load_tensors(Path(model) / EXTRAS)["input_mean"].to(torch.float64)
    lower, upper = (-mean).to(device=device, dtype=dtype), (1.0 - mean).to(device=device, dtype=dtype)
    m = candidates if candidates is not None else default_candidates(meta.get("data", {}), target.num_outputs,
                                                                     data_init=data_init)
    if data_init and sources is None:
        sources = init_sources(model, data_dir=data_dir)
    return _InputSpace(target, mean, lower, upper, m, meta, sources)


def _prior(space: _InputSpace, run: ReconstructionRun) -> AttackerPrior:
    """The prior of ``run``: m labels (from the init when it brings them, else in the model's class
    proportions) and the pixel box."""
    target, m, sources, params = space.target, space.m, space.sources, run.init_params()
    labels = init_labels(run.init.name, m=m, sources=sources, **params)  # type: ignore[attr-defined]
    if labels is None:
        prior = AttackerPrior.balanced(m=m, num_outputs=target.num_outputs, input_shape=target.input_shape,
                                       lower=space.lower, upper=space.upper)
    else:
        labels = labels.to(torch.float64) if target.num_outputs == 1 else labels.long()
        prior = AttackerPrior(labels=labels.to(parse_device(run.device)), input_shape=target.input_shape,
                              lower=space.lower, upper=space.upper)
    prior.check(target)
    return prior


def _x0(space: _InputSpace, run: ReconstructionRun, prior: AttackerPrior, generator: torch.Generator) -> torch.Tensor:
    """x₀ (m, C, H, W) of ``run``'s initialisation (an init computed from the attacker's view gets that view)."""
    target, lower, upper, m, mean, sources = space.target, space.lower, space.upper, space.m, space.mean, space.sources
    init, params, dtype, device = run.init.name, run.init_params(), run.dtype, parse_device(run.device)  # type: ignore[attr-defined]
    attacker = None
    if "weights" in INITS.get(init).needs:  # an init computed from the attacker's view (never from images)
        attacker = types.SimpleNamespace(model=target.model, params=target.params, subspace=prior.subspace,
                                         known_init=None if prior.known_init is None else prior.known_init.params,
                                         lower=lower, upper=upper)
    x0 = make_init(init, CandidateSpec(m=m, input_shape=target.input_shape, mean=mean, dtype=dtype, device=device),
                   generator=generator, sources=sources, attacker=attacker, **params)
    return x0


#: Seed of the randomized SVD of the subspace analysis (fixed: the analysis is part of the attacker's set-up).
SUBSPACE_SEED = 0


#: copies of the candidates an attack holds at once: x, its gradient and two optimiser moments (Adam)
CANDIDATE_COPIES = 4


#: the most runs ``reconstruct --runs K`` takes: every run is a folder with its checkpoint, all K are
#: stepped together (their states in memory at once); more runs of one target are a sweep with a budget
MAX_BATCH_RUNS = 10_000


def _refuse_candidates_beyond_memory(m: int, input_shape: tuple[int, ...], dtype: torch.dtype, *,
                                     runs: int = 1, option: str = "--candidates") -> None:
    """One line, before anything is allocated, when m candidates (in each of ``runs`` runs stepped
    together) cannot fit in this machine's memory: :data:`CANDIDATE_COPIES` copies of the candidates,
    plus the m × m cosine matrix of the candidates' selection scores
    (``attacks.selection.candidate_scores``, computed at the end of every run; 3·10⁶ candidates
    passed the first term and failed there after the whole run). ``option``: how messages name the count."""
    need = runs * (CANDIDATE_COPIES * float(m) * float(torch.Size(input_shape).numel()) + float(m) * float(m))
    what = f"{option} {m} of {tuple(input_shape)} inputs" + (f" in each of --runs {runs}" if runs > 1 else "")
    refuse_if_too_large(need * dtype.itemsize, what=what,
                        fix=f"reduce {option} (its default is 2n)" + (" or --runs" if runs > 1 else ""))


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
_RESTORED_NEEDS_INIT = ("labels restored from the weights read the read-out's change θ* − θ_init; pass --known-init "
                        f"(e.g. pretrained; knowledge.known_init in a file), or keep the labels balanced: {_BALANCED}")


def _restored_labels(target: Target, prior: AttackerPrior) -> tuple[AttackerPrior, RestoredLabels]:
    """The prior with its m labels restored from the read-out's change θ* − θ_init (m: the candidate count,
    the training-set size n the estimate shares out)."""
    if prior.known_init is None:
        raise DataReconError(_RESTORED_NEEDS_INIT)
    if target.num_outputs < 2:
        raise DataReconError("labels are restored for a multiclass read-out; a binary or regression target keeps "
                             f"its labels balanced: {_BALANCED}")
    restored = restore_labels(target.model, target.params, prior.known_init.params, prior.m)
    labels = restored.labels.to(device=prior.labels.device)
    return dataclasses.replace(prior, labels=labels), restored


def _own_model(target: Target, *, candidates: int | None, init: str, data_init: bool, sources: Any,
               device: str | torch.device, dtype: torch.dtype) -> tuple[Target, torch.Tensor, float, float]:
    """(target on device/dtype, the mean that maps display to model space, lower, upper) of a user's model."""
    if target.value_range is None:
        raise DataReconError("the target has no value_range; build it with Target.from_module(..., value_range=(lo, hi))")
    if candidates is None:
        raise DataReconError("a model without a data spec has no default candidate count; pass candidates "
                             "(--candidates M, e.g. twice the training-set size)")
    if data_init and sources is None:
        raise DataReconError(f"init {init!r} needs training images, which a model without a model directory does not "
                             "name; use gaussian or uniform (or pass sources in Python)")
    lo, hi = target.value_range
    # display space [0, 1] starts at lo: the uniform init draws U(0, 1) − mean = U(lo, lo + 1)
    mean = torch.full(tuple(target.input_shape), -lo, dtype=torch.float64)
    return target.to(device=device, dtype=dtype), mean, lo, hi


def prepare(run: ReconstructionRun, *, data_dir: str | Path | None = None, sources: Any = None,
            target: Target | None = None) -> AttackSetup:
    """Target, prior, x₀ and generator of ``run``: what its attack receives.

    The target is ``run.model`` read from its model directory, or ``target``: a user's own model
    (:meth:`Target.from_module`; ``run.model`` then only labels the run, ``run.candidates`` is
    required, the pixel box is its ``value_range`` and data-dependent inits need ``sources``).
    m defaults to 2n (n for data-dependent inits); the seed seeds x₀ and the attack's generator;
    the attacker's knowledge beyond θ* (known θ_init, n, recipe) is resolved and checked here and
    recorded (the threat model) in ``record["knowledge"]``.

    Args:
        run: the typed run.
        data_dir: data folder (only data-dependent inits read it).
        sources: ready :class:`~datarecon.attacks.init.InitSources` (skips loading the data).
        target: a user's own model attacked instead of ``run.model``.

    Raises:
        DataReconError: unknown init (lists valid names), m < 1, labels inconsistent with the model,
            a known initialisation that does not fit the model or is not the one it was trained from,
            an attack that needs knowledge the run does not give.
    """
    entry = ATTACKS.get(run.method)
    uses, requires = entry.uses, entry.requires
    init, params = run.init.name, run.init_params()  # type: ignore[attr-defined]
    INITS.get(init)
    if run.candidates is not None and run.candidates < 1:
        raise DataReconError(f"candidate count must be at least 1, got {run.candidates}; "
                             "pass --candidates M with M >= 1")
    if target is not None and "recipe" in requires:  # named first: the knowledge it would ask for next cannot exist
        raise DataReconError(f"{run.method} replays the training a model directory records (its recipe), and a "
                             "model of your own records none; attack a model directory from `datarecon train`, or "
                             "choose another --method")
    _check_knowledge(run.knowledge, requires)
    _check_step_controls(run)
    space = _input_space(run.model if target is None else target, run, data_dir=data_dir, sources=sources)
    _refuse_candidates_beyond_memory(space.m, space.target.input_shape, run.dtype)
    generator = torch.Generator().manual_seed(int(run.seed))
    prior = _prior(space, run)
    prior, threat = attacker_knowledge(space.target, prior, run.knowledge, model_meta=space.meta, uses=uses,
                                       requires=requires)
    x0 = _x0(space, run, prior, generator)
    record = {"init": {"name": init, "params": params, "experimenter_choice": INITS.get(init).data},
              "candidates": space.m, "device": str(parse_device(run.device)), "knowledge": threat}
    if prior.subspace is not None:
        record["subspace"] = prior.subspace.summary()
    return AttackSetup(target=space.target, prior=prior, x0=x0, generator=generator, record=record)


@dataclass(frozen=True)
class RunOptions:
    """How a run is executed: where it continues from, what it shows, what it does on divergence.
    None of it changes the result.

    Attributes:
        resume: continue from ``out/checkpoint`` (bit-identical on CPU); a finished run is returned as it was.
        overwrite: replace an existing run directory ``out`` (only after the model and settings were
            accepted; only what datarecon wrote there).
        progress: show progress with the loss terms (the first run's, for a batch).
        data_dir: data folder (read only by data-dependent initialisations).
        hooks: extra engine hooks (e.g. test-only fault injection).
        raise_on_divergence: raise :class:`DivergenceError` instead of returning a diverged result.
        nested: ``out`` lies inside a folder the caller claimed itself (a demo's or experiment's
            ``run/``, a reproduction piece, a sweep store's run); otherwise a path inside another
            datarecon folder is refused (:func:`datarecon.kernel.outdir.check_outside`).
    """

    resume: bool = False
    overwrite: bool = False
    progress: bool = True
    data_dir: str | Path | None = None
    hooks: tuple[Any, ...] = ()
    raise_on_divergence: bool = False
    nested: bool = False


def execute(run: ReconstructionRun, out: str | Path, options: RunOptions = RunOptions(), *, setup: AttackSetup | None = None,
            sources: Any = None, target: Target | None = None, record: Mapping[str, Any] | None = None
            ) -> Reconstruction:
    """Run ``run`` into the run directory ``out`` (docs/dev/CONTRACTS.md); the one way a run executes.

    Args:
        run: the complete description of the run.
        out: run directory (created; resumed with ``options.resume``). An existing non-empty ``out`` is
            refused unless ``options.resume`` or ``options.overwrite``; ``overwrite`` replaces only a run directory
            (:mod:`datarecon.kernel.outdir`), and only after the model and settings were accepted.
        options: resume, overwrite, progress, data folder, hooks, divergence (:class:`RunOptions`).
        setup: a ready :func:`prepare` result of ``run`` (the caller needs x₀ itself).
        sources: ready :class:`~datarecon.attacks.init.InitSources` (skips loading the data).
        target: a user's own model (:meth:`Target.from_module`) attacked instead of ``run.model``.
        record: extra fields for run.json.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction` (also written to ``out``; run.json
        holds the run under ``run``).

    Raises:
        DataReconError: bad model, settings or output folder; a checkpoint of another run.
    """
    if options.overwrite and options.resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    with claim_out_dir(out, kind="run", overwrite=options.overwrite, resume=options.resume, nested=options.nested) as claim:
        cfg = run.method_config()
        if setup is None:
            setup = prepare(run, data_dir=options.data_dir, sources=sources, target=target)
        attack = make_attack(run.method, cfg)
        if attack.coupled():
            raise DataReconError(_COUPLED_ALONE)
        claim.prepare()  # only now: a bad model or setting leaves the old run untouched
        return _execute(run, out, options, setup=replace(setup, record=_run_record(run, attack, setup, target, record)),
                        attack=attack)


def _run_record(run: ReconstructionRun, attack: Any, setup: AttackSetup, target: Target | None,
                record: Mapping[str, Any] | None) -> dict[str, Any]:
    """What run.json records about ``run`` besides the attack: the set-up, the early stop, the run
    itself, a user's model's input space, and the caller's ``record`` (dict fields merged)."""
    stop = run.early_stop
    rec_meta = {**setup.record, "early_stop": {"patience": stop.patience, "rel_tol": stop.rel_tol},
                "run": run.model_dump(mode="json")}
    if attack.subspace_candidates and isinstance(rec_meta.get("knowledge"), dict):
        # what the default (subspace: null) resolved to for this attacker
        rec_meta["knowledge"] = {**rec_meta["knowledge"], "subspace_candidates": attack.uses_subspace(setup.prior)}
    if target is not None:  # a user's own model: what evaluation needs to map its inputs to images

        rec_meta["model_dir"] = None
        rec_meta["own_model"] = {"value_range": list(target.value_range or (0.0, 1.0)),
                                 "input_shape": list(target.input_shape), "loss": loss_name(target.loss),
                                 "weight_decay": float(target.weight_decay),
                                 "homogeneous_measured": target.homogeneous}
    for key, value in dict(record or {}).items():
        rec_meta[key] = {**rec_meta[key], **value} if isinstance(rec_meta.get(key), dict) and isinstance(value, dict) \
            else value
    return {"seed": run.seed, **rec_meta}


def early_stop_rule(run: ReconstructionRun) -> Any:
    """The run's attacker-side early stop (a plateau of the metric its attack declares,
    :attr:`~datarecon.attacks.base.Attack.early_stop_metric`), or None when ``patience`` is 0.

    Raises:
        DataReconError: an early stop asked of an attack that declares no metric for it.
    """
    stop = run.early_stop
    if not stop.patience:
        return None
    metric = ATTACKS.get(run.method).early_stop_metric
    if metric is None:
        raise DataReconError(f"attack {run.method!r} declares no metric an early stop can watch; drop "
                             "--early-stop-patience (early_stop.patience 0)")
    return ResidualPlateau(key=metric, patience=stop.patience, rel_tol=stop.rel_tol)


def run_loop(run: ReconstructionRun, options: RunOptions) -> Any:
    """The run's loop settings (:class:`~datarecon.kernel.engine.LoopOptions`): its checkpoint and log
    periods with the execution's resume, progress and hooks."""
    return replace(ATTACK_LOOP, log_every=run.checkpoint.log_every, progress=options.progress,
                   checkpoint_every=run.checkpoint.every, resume=options.resume, hooks=tuple(options.hooks))


def probed(run: ReconstructionRun, attack: Any, setup: AttackSetup) -> tuple[Any, AttackSetup]:
    """The attack with the step sizes the probe chose for ``run`` (:func:`~datarecon.attacks.probe.probe_step_sizes`),
    and the set-up whose record says so when they changed."""
    result = probe_step_sizes(attack, setup, steps=min(run.step_probe, run.steps))
    if result.scale == 1.0:
        return attack, setup
    return result.attack, replace(setup, record={**setup.record, "step_probe": result.record})


def _execute(run: ReconstructionRun, out: str | Path, options: RunOptions, *, setup: AttackSetup, attack: Any
             ) -> Reconstruction:
    """The body of :func:`execute` once ``out`` is claimed and prepared (``setup.record``: all of run.json's extras):
    the probe, the run, and its retries at smaller step sizes while it diverges and ``run.retry_diverged`` allows."""
    attack, setup = probed(run, attack, setup)
    start = setup.generator.get_state()
    attack, setup, resume = _resumed_retries(run, Path(out), options, attack, setup)
    while True:
        rec = run_attack(attack, setup, steps=run.steps, out=out, loop=replace(run_loop(run, options), resume=resume),
                         early_stop=early_stop_rule(run))
        if rec.status != Status.DIVERGED or len(_retries(setup)["tried"]) >= run.retry_diverged:
            break
        attack, setup = _retried(run, attack, setup, diverged_at=rec.steps_done, start=start)
        resume = False
    save_subspace(out, setup.prior)
    if options.raise_on_divergence and rec.status == Status.DIVERGED:
        raise DivergenceError(rec.summary.get("message", f"{run.method} diverged") + f" (last finite state in {out})")
    return rec


def _retries(setup: AttackSetup) -> dict[str, Any]:
    """run.json's ``retry_diverged`` of ``setup``: the factor on the probed step sizes and the settings that diverged."""
    return setup.record.get("retry_diverged") or {"scale": 1.0, "tried": []}


def _retried(run: ReconstructionRun, attack: Any, setup: AttackSetup, *, diverged_at: int,
             start: torch.Tensor) -> tuple[Any, AttackSetup]:
    """The next try of a run whose ``attack`` diverged at step ``diverged_at``: every step size times
    :data:`RETRY_FACTOR`, the generator back at its ``start`` state (the same x₀ and λ₀), the record saying so."""
    done = _retries(setup)
    sizes = {f: getattr(attack.config, f) for f in attack.step_size_fields}
    tried = [*done["tried"], {"scale": done["scale"], "diverged_at": diverged_at, "step_sizes": sizes}]
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sizes.items())
    warnings.warn(f"{run.method} diverged at step {diverged_at} with {shown}; retrying from the start with every step "
                  f"size x{RETRY_FACTOR:g} (retry {len(tried)} of {run.retry_diverged})", UserWarning, stacklevel=3)
    generator = torch.Generator(device=setup.generator.device).set_state(start)
    record = {**setup.record, "retry_diverged": {"scale": done["scale"] * RETRY_FACTOR, "tried": tried}}
    return scaled(attack, RETRY_FACTOR), replace(setup, generator=generator, record=record)


def _resumed_retries(run: ReconstructionRun, out: Path, options: RunOptions, attack: Any,
                     setup: AttackSetup) -> tuple[Any, AttackSetup, bool]:
    """A resumed run continues at the step sizes of its last retry; one that had diverged is retried now when
    ``run.retry_diverged`` allows another try. Returns (attack, set-up, whether to resume the checkpoint)."""
    if not (options.resume and (out / RUN_JSON).is_file()):
        return attack, setup, options.resume
    recorded = read_json(out / RUN_JSON)
    done = recorded.get("retry_diverged")
    if isinstance(done, dict):
        attack = scaled(attack, float(done["scale"]))
        setup = replace(setup, record={**setup.record, "retry_diverged": done})
    if recorded.get("status") == Status.DIVERGED and len(_retries(setup)["tried"]) < run.retry_diverged:
        attack, setup = _retried(run, attack, setup, diverged_at=int(recorded.get("steps_done") or 0),
                                 start=setup.generator.get_state())
        return attack, setup, False
    return attack, setup, True


def save_subspace(out: str | Path, prior: AttackerPrior) -> None:
    """Write the prior's subspace analysis beside the run (``subspace.safetensors``), if it has one."""
    if prior.subspace is not None:

        save_analysis(Path(out) / SUBSPACE_FILE, prior.subspace)


def reconstruct(model: str | Path | Target, settings: Mapping[str, Any] | RunSettings, out: str | Path,
                options: RunOptions = RunOptions(), *, sources: Any = None) -> Reconstruction:
    """Attack ``model`` with the run ``settings`` (a run without its model) into ``out``: builds the
    :class:`ReconstructionRun` and :func:`execute` s it.

    Args:
        model: the target's model directory (``run.model``), or a user's own model
            (:meth:`Target.from_module`; ``run.model`` then reads ``"<own module>"``).
        settings: every field of a run but ``model``, as in a run file (docs/RUNS.md), e.g.
            ``{"attack": {"method": "kkt", "steps": 500, "lr_x": 0.01}, "init": {"name": "gaussian",
            "scale": 0.05}, "candidates": 40, "seed": 0}``; or a :class:`RunSettings`.
        out: run directory; see :func:`execute`.
        options, sources: see :func:`execute`.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction` (also written to ``out``).

    Raises:
        DataReconError: see :func:`execute` and :func:`build_run`.
    """
    fields = settings.model_dump() if isinstance(settings, RunSettings) else dict(settings)
    own = model if isinstance(model, Target) else None
    run = build_run({"model": OWN_MODEL if own is not None else str(model), **fields})
    return execute(run, out, options, sources=sources, target=own)


#: the refusal of a prior that couples runs (group consistency) in a run stepped alone
_COUPLED_ALONE = ("group consistency pulls restarts toward their consensus and needs at least two runs stepped "
                  "together: pass --runs K with K >= 2, or set group_weight to 0")


def coupled_mode(run: ReconstructionRun, mode: str, runs: int) -> str:
    """The batch mode of ``runs`` copies of ``run`` (:func:`~datarecon.attacks.batched.resolve_mode`), where a
    prior that couples the runs (``group_weight`` > 0) needs them stepped as one group: ``auto`` resolves
    to ``batched`` then, ``looped`` and a single run are refused."""
    if not make_attack(run.method, run.method_config()).coupled():
        return resolve_mode(mode, run.device)
    if runs < 2:
        raise DataReconError(_COUPLED_ALONE)
    resolved = resolve_mode(mode, run.device) if mode != "auto" else "batched"
    if resolved != "batched":
        raise DataReconError("group consistency couples the runs in one step; --batch-mode looped steps them "
                             "one by one: pass --batch-mode batched (or auto)")
    return resolved


def run_name(index: int) -> str:
    """Folder name of run ``index`` of :func:`reconstruct_runs` (``run0``, ``run1``, ...)."""
    return f"run{index}"


def execute_batch(runs: Sequence[ReconstructionRun], outs: Sequence[str | Path], options: RunOptions = RunOptions(), *,
                  setups: Sequence[AttackSetup], mode: str = "auto") -> list[Reconstruction]:
    """Execute K runs on one target stepped together (:func:`~datarecon.attacks.batched.run_batched`);
    the one way runs execute as a batch (``--runs K`` and the reproductions' batched pieces).

    Run j is written to ``outs[j]`` exactly as a single run of ``runs[j]`` is (its own attack,
    x₀, generator, seed, early stop, checkpoints and history); the runs share one target and,
    in ``mode="batched"``, one vmapped gradient and one update per step for runs of one objective.

    Args:
        runs: the K typed runs (one model; one dtype, checkpoint and log period; steps may differ).
        outs: their run directories (claimed by the caller).
        options: resume (each run continues from its own checkpoint where it has one), progress (of
            the first run), hooks (:class:`RunOptions`).
        setups: :func:`prepare` of each run (target, prior, x₀, generator), with each run's
            ``run.json`` extras in its ``record``.
        mode: ``batched`` | ``looped`` | ``auto`` (looped on CPU, batched on CUDA;
            :func:`datarecon.attacks.batched.resolve_mode`).

    Returns:
        One :class:`~datarecon.attacks.base.Reconstruction` per run, in order.
    """
    shared = {(run.checkpoint.every, run.checkpoint.log_every) for run in runs}
    if len(shared) != 1:
        raise DataReconError(f"the runs of a batch checkpoint and log at {sorted(shared)} steps; give them one period")
    attacks = [probed(run, make_attack(run.method, run.method_config()), setup) for run, setup in zip(runs, setups, strict=True)]
    members = [BatchMember(attack=attack, prior=setup.prior, x0=setup.x0,
                           generator=setup.generator, out=Path(out), seed=run.seed, early_stop=early_stop_rule(run),
                           record=dict(setup.record))
               for run, out, (attack, setup) in zip(runs, outs, attacks, strict=True)]
    steps = {run.steps for run in runs}
    return run_batched(members, setups[0].target, mode=mode, steps=steps.pop() if len(steps) == 1 else None,
                       loop=run_loop(runs[0], options))


def reconstruct_runs(run: ReconstructionRun, out: str | Path, options: RunOptions = RunOptions(), *, runs: int,
                     mode: str = "auto", sources: Any = None, record: Mapping[str, Any] | None = None,
                     criterion: str = DEFAULT_CRITERION) -> list[Reconstruction]:
    """``runs`` copies of ``run`` with seeds ``run.seed + j``, executed as one batch (:func:`execute_batch`),
    and their pool.

    Run j is exactly the run :func:`execute` makes of ``run`` with ``seed + j`` (its own x₀, λ₀ and
    generator; its run.json holds that run under ``run``, so ``execute`` of it reproduces run j, bit
    for bit in ``looped`` mode), written to the run directory ``out/run<j>`` (:func:`run_name`); KKT / DecoReco runs
    share one vmapped gradient per step in ``mode="batched"``, other methods are stepped in turn.
    ``out`` itself then becomes a run directory of method ``pool``: the candidates of every run that
    finished (complete or stopped early), in run order, as ``datarecon sweep pool`` writes them
    (:func:`datarecon.experiments.pool.write_pool`), so ``datarecon evaluate OUT`` evaluates
    the K runs as one result.

    Args:
        run: the typed run of run 0 (a model directory).
        options: as in :func:`execute`; ``overwrite``/``resume`` apply to ``out`` as a whole
            (``overwrite`` deletes only what datarecon wrote there).
        runs: K ≥ 1.
        mode: ``batched`` | ``looped`` | ``auto`` (the default: looped on CPU, where batching
            measured slower, batched on CUDA; :func:`datarecon.attacks.batched.resolve_mode` on
            ``run.device``). run.json records the mode it resolved to.
        sources: as in :func:`execute`.
        record: extra ``run.json`` fields of every run and of the pool (e.g. ``resume_command``).
        criterion: the attacker-side criterion whose best value the pool records.

    Returns:
        One :class:`~datarecon.attacks.base.Reconstruction` per run, in run order.

    Raises:
        DataReconError: runs < 1, an unknown mode, bad settings, or an ``out`` that may not be
            written (see :func:`execute`).
    """
    if runs < 1:
        raise DataReconError(f"--runs must be at least 1, got {runs}; pass --runs K with K >= 1")
    if runs > MAX_BATCH_RUNS:
        raise DataReconError(f"--runs {runs} is more than {MAX_BATCH_RUNS:,} runs of one target in one folder; pass "
                             "fewer, or run a sweep with a budget (datarecon sweep)")
    mode = coupled_mode(run, mode, runs)
    if options.overwrite and options.resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    out = Path(out)
    if options.resume and (out / RUN_JSON).is_file():
        found = read_json(out / RUN_JSON)
        if isinstance(found, dict) and not found.get("batch"):  # its candidates would be replaced by the pool's
            raise DataReconError(f"--out {out} holds a single {found.get('method')} run, not the folder of --runs K; "
                                 "resume it without --runs, or choose another --out for the K runs")
    with claim_out_dir(out, kind="run", overwrite=options.overwrite, resume=options.resume, nested=options.nested) as claim:
        members = [run.model_copy(update={"seed": run.seed + j}) for j in range(runs)]
        first = prepare(members[0], data_dir=options.data_dir, sources=sources)
        _refuse_candidates_beyond_memory(first.prior.m, first.target.input_shape, run.dtype, runs=runs)
        setups = [first, *(prepare(r, data_dir=options.data_dir, sources=sources) for r in members[1:])]
        stop = {"patience": run.early_stop.patience, "rel_tol": run.early_stop.rel_tol}
        setups = [replace(setup, record={**setup.record, "early_stop": stop,
                                         "batch": {"runs": runs, "index": j, "mode": mode},
                                         "run": member.model_dump(mode="json"), **dict(record or {})})
                  for j, (member, setup) in enumerate(zip(members, setups, strict=True))]
        claim.prepare()  # only now: a bad model or setting leaves the old runs untouched
        starts = [setup.generator.get_state() for setup in setups]
        recs = execute_batch(members, [out / run_name(j) for j in range(runs)], options, setups=setups, mode=mode)
        for j, rec in enumerate(recs):  # a diverged run is retried alone at smaller step sizes when asked
            if rec.status == Status.DIVERGED and run.retry_diverged:
                fresh = torch.Generator(device=setups[j].generator.device).set_state(starts[j])
                recs[j] = _execute(members[j], out / run_name(j), replace(options, resume=True, overwrite=False),
                                   setup=replace(setups[j], generator=fresh),
                                   attack=make_attack(run.method, members[j].method_config()))
        for j, setup in enumerate(setups):
            save_subspace(out / run_name(j), setup.prior)
        pool_runs(out, recs, model_dir=str(run.model), criterion=criterion,
                  record={"batch": {"runs": runs, "mode": mode, "method": run.method}, **dict(record or {})})
        return recs


def pool_runs(out: Path, recs: Sequence[Reconstruction], *, model_dir: str, criterion: str = DEFAULT_CRITERION,
              record: Mapping[str, Any] | None = None) -> Path | None:
    """Pool the finished runs ``out/run<j>`` of :func:`reconstruct_runs` into the run directory ``out``.

    Runs that did not finish (diverged) are left out; with none finished nothing is written.

    Returns:
        ``out``, or None when no run finished.
    """
    mode = "max" if CRITERIA.get(criterion).better == "higher" else "min"
    sources = []
    for j, rec in enumerate(recs):
        if rec.status not in EVALUABLE:
            continue
        value = (rec.summary.get("selection", {}).get(criterion) or {}).get("value")
        sources.append({"key": run_name(j), "run_dir": run_name(j), "score": value, "params": {"seed_offset": j}})
    if not sources:
        return None
    config = {"runs": len(recs), "criterion": criterion, "mode": mode, "sources": [s["key"] for s in sources]}
    recorded = read_json(out / sources[0]["run_dir"] / RUN_JSON).get("model_dir", model_dir)
    return write_pool(out, sources, root=out, model_dir=recorded,
                      spec=PoolSpec(config=config, criterion=criterion, mode=mode), record=record)
