"""The typed reconstruction run: :class:`ReconstructionRun` (a run file maps one-to-one to it), its layers
(defaults < run file < flags < ``--set``) and the attack configs of the ATTACKS registry with their ``method``
tag (docs/RUNS.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

import datarecon.attacks  # noqa: F401  (registers every built-in attack in ATTACKS)
from datarecon.attacks.base import (
    ATTACKS,
    Attack,
)
from datarecon.attacks.init import INITS
from datarecon.attacks.knowledge import (KnowledgeSettings)
from datarecon.attacks.presets import PRESETS
from datarecon.attacks.priors import check_weights
from datarecon.config import (
    MAX_SEED,
    MAX_STEPS,
    RecordedConfig,
    build_config,
    layered,
    merge,
    read_config_mapping,
    set_dotted,
)
from datarecon.errors import DataReconError
from datarecon.utils.device import parse_device
from datarecon.utils.dtypes import torch_dtype


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
    """Stop on a plateau of the metric the attack declares (attacker-side; ``patience`` 0: off).

    Attributes:
        patience: steps without a relative improvement of at least ``rel_tol`` before stopping.
        rel_tol: relative improvement of the metric that counts as progress, in (0, 1); set away from its
            default only with a patience (alone it would change nothing).
    """

    patience: int = Field(default=0, ge=0, le=MAX_STEPS)
    rel_tol: float = Field(default=1e-3, gt=0)

    @model_validator(mode="after")
    def _tolerance_needs_a_patience(self) -> EarlyStopSettings:
        if self.rel_tol >= 1:
            raise DataReconError(f"early_stop.rel_tol {self.rel_tol:g} is a relative improvement per step, which "
                                 "never reaches 1 or more (the rule would stop after the patience whatever happened); "
                                 "pass --early-stop-tol in (0, 1)")
        if not self.patience and self.rel_tol != type(self).model_fields["rel_tol"].default:
            raise DataReconError(f"early_stop.rel_tol {self.rel_tol:g} does nothing without early_stop.patience; pass "
                                 "--early-stop-patience N (N >= 1) with --early-stop-tol, or drop --early-stop-tol")
        return self


class CheckpointSettings(_Frozen):
    """How often a run saves its state and logs its history (steps; neither changes the result).

    Attributes:
        every: steps between checkpoints (the work a crash can lose), >= 1.
        log_every: steps between rows of ``history.jsonl``, >= 1.
    """

    every: int = Field(default=100, ge=1)
    log_every: int = Field(default=10, ge=1)


class RunSettings(_Frozen, RecordedConfig):
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
        step_probe: steps of the step-size probe before the run (:mod:`datarecon.attacks.probe`: when the
            attack's step sizes fail a probe of this many steps, the stable scale of them whose objective fell
            furthest, searched by bisection in log scale up to the edge of stability); 0: off.
        retry_diverged: a run that diverges later starts again from its start with every step size
            divided by 10, up to this many times (run.json's ``retry_diverged`` records each setting that
            diverged and where); 0: a diverged run stays diverged.
    """

    added_fields: ClassVar[tuple[str, ...]] = ("step_probe", "retry_diverged")

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

    def recorded(self, data: Any) -> Any:
        # the weights-only default is left out, so records and hashes of earlier runs stay as they were
        data = super().recorded(data)
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
        preset: a key of :data:`~datarecon.attacks.presets.PRESETS` laid under the run file (``--preset``).
    """

    file: Mapping[str, Any] = field(default_factory=dict)
    flags: Mapping[str, Any] = field(default_factory=dict)
    sets: Mapping[str, Any] = field(default_factory=dict)
    method: str | None = None
    init: str | None = None
    model: str | None = None
    where: str = "run"
    preset: str | None = None


def with_preset(preset: str | None, file: Mapping[str, Any], *, method: str | None = None) -> dict[str, Any]:
    """The run file's fields over the preset's (:data:`~datarecon.attacks.presets.PRESETS`; None: the file's).

    Raises:
        DataReconError: an unknown preset (the valid names listed), or a method other than the preset's chosen by
            ``--method`` or the file (the preset's fields are that method's).
    """
    if preset is None:
        return dict(file)
    entry = PRESETS.get(preset)
    section = file.get("attack")
    chosen = method or (section.get("method") if isinstance(section, Mapping) else None)
    if chosen is not None and chosen != entry.method:
        raise DataReconError(f"preset {preset!r} sets {entry.method} settings and this run's method is {chosen!r}; "
                             f"drop --preset or pass --method {entry.method}")
    return merge(entry.run_fields(), dict(file))


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
    """The run of ``layers``: defaults < preset < run file < flags < sets, merged as mappings and validated once
    (:func:`build_run`).

    Raises:
        DataReconError: an unknown preset or one of another method, a section that is not a mapping, an unknown key
            of the file, no model, a flag
            the method has no field for, a field given by a flag and by ``--set``, invalid fields, fewer than 1
            step or a bad device (one line).
    """
    if layers.preset is not None:
        layers = replace(layers, file=with_preset(layers.preset, layers.file, method=layers.method), preset=None)
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


