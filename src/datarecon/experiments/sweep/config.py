"""Typed sweep configuration and its deterministic expansion into run specs.

A sweep file (YAML/TOML) maps one-to-one to :class:`SweepConfig`::

    model_dir: models/digits-mlp
    method: kkt
    attack: {lr_lambda: 1.0e-4}          # base attack-config fields (the method's own config)
    init: {name: gaussian, scale: 1.0e-3}
    candidates: 20
    steps: 1000
    search:
      grid:   {attack.momentum: [0.0, 0.9]}
      random:
        init.scale:        {dist: log-uniform, low: 1.0e-6, high: 0.1}
        attack.lambda_min: {dist: uniform, low: 0.01, high: 0.5}
      samples: 16
      seeds: [0, 1]
    budget: 64
    seed: 0
    selection: {criterion: relative_residual}

Search keys are dotted paths into the run spec: ``attack.<field>``, ``init.<field>`` (including
``init.name``), ``candidates``, ``steps``, ``dtype``. Any field of the attack's or the
initialisation's config may be swept; each expanded spec is validated when its run is built
(unknown fields are refused there with a one-line error).

Expansion order (deterministic, and stable when the budget grows): for each random sample
``s = 0 .. samples-1``, for each grid point (keys sorted, values in the listed order), for each
seed. Random sample ``s`` is drawn from its own ``torch.Generator`` seeded from ``(seed, s)``, so
adding samples never changes the earlier ones. ``budget`` caps the number of runs (it truncates
the tail of that order, i.e. late random samples first).

The expansion is lazy (the grid's product and the random draws are produced one run at a time),
and the number of runs is computed from the sizes before any work: a sweep of more than
:data:`MAX_RUNS` runs is refused unless ``budget`` caps it (three 1000-value grid keys alone make
10⁹ runs).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from datarecon.attacks.selection import DEFAULT_CRITERION
from datarecon.attacks import ATTACKS
from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.config import MAX_SEED, MAX_STEPS, Seed, set_dotted
from datarecon.errors import DataReconError
from datarecon.experiments.reconstruct import build_run, method_config
from datarecon.registry import Registry, registered

#: the most runs one sweep may have (a run is a folder and an index row; more is a typo or needs a budget)
MAX_RUNS = 100_000

# ---------------------------------------------------------------------------
# distributions


@dataclass(frozen=True)
class Distribution:
    """A registered sampling distribution: ``sample(spec, generator) -> value`` and a checker."""

    sample: Callable[[Any, torch.Generator], Any]
    doc: str


DISTRIBUTIONS: Registry[Distribution] = Registry("distribution")


def _uniform01(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def _log_uniform(spec: Any, g: torch.Generator) -> float:
    lo, hi = math.log(spec.low), math.log(spec.high)
    return float(math.exp(lo + (hi - lo) * _uniform01(g)))


def _uniform(spec: Any, g: torch.Generator) -> float:
    return float(spec.low + (spec.high - spec.low) * _uniform01(g))


def _int_uniform(spec: Any, g: torch.Generator) -> int:
    return int(torch.randint(int(spec.low), int(spec.high) + 1, (), generator=g))


def _choice(spec: Any, g: torch.Generator) -> Any:
    return spec.values[int(torch.randint(len(spec.values), (), generator=g))]


DISTRIBUTIONS.register("log-uniform", Distribution(_log_uniform, "exp(U(log low, log high)); 0 < low < high"))
DISTRIBUTIONS.register("uniform", Distribution(_uniform, "U(low, high)"))
DISTRIBUTIONS.register("int-uniform", Distribution(_int_uniform, "integers low..high inclusive"))
DISTRIBUTIONS.register("choice", Distribution(_choice, "one of values, equally likely"))


class Dist(BaseModel):
    """One random dimension: ``dist`` is a :data:`DISTRIBUTIONS` name.

    Attributes:
        dist: ``log-uniform`` | ``uniform`` | ``int-uniform`` | ``choice``.
        low, high: bounds (log-uniform needs 0 < low < high).
        values: the options of ``choice``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dist: Annotated[str, registered(DISTRIBUTIONS)]
    low: float | None = None
    high: float | None = None
    values: tuple[Any, ...] | None = None


    @model_validator(mode="after")
    def _check(self) -> Dist:
        if self.dist == "choice":
            if not self.values:
                raise ValueError("dist 'choice' needs a non-empty 'values' list")
            return self
        if self.low is None or self.high is None:
            raise ValueError(f"dist {self.dist!r} needs 'low' and 'high'")
        if not self.low <= self.high:
            raise ValueError(f"dist {self.dist!r} needs low <= high, got {self.low} > {self.high}")
        if self.dist == "log-uniform" and self.low <= 0:
            raise ValueError(f"dist 'log-uniform' needs low > 0, got {self.low}")
        return self

    def sample(self, generator: torch.Generator) -> Any:
        return DISTRIBUTIONS.get(self.dist).sample(self, generator)


# ---------------------------------------------------------------------------
# configs

SWEEPABLE_ROOTS = ("attack", "init", "candidates", "steps", "dtype")


def _check_key(key: str) -> str:
    root = key.split(".", 1)[0]
    if root not in SWEEPABLE_ROOTS or (root in ("attack", "init") and "." not in key):
        raise ValueError(
            f"search key {key!r} is not sweepable; use attack.<field>, init.<field>, candidates, steps or dtype"
        )
    return key


class SearchSpace(BaseModel):
    """What varies between runs.

    Attributes:
        grid: dotted key -> list of values; the cartesian product is taken.
        random: dotted key -> :class:`Dist`; ``samples`` joint draws are taken.
        samples: number of random draws (default: from ``budget`` when random keys exist, else 1).
        seeds: run seeds (each point is run once per seed); an int ``k`` means ``0..k-1``;
            default: the sweep's ``seed``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    grid: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    random: dict[str, Dist] = Field(default_factory=dict)
    samples: int | None = Field(default=None, ge=1)
    seeds: tuple[Seed, ...] | int | None = None

    @field_validator("grid")
    @classmethod
    def _grid_keys(cls, v: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
        for key, values in v.items():
            _check_key(key)
            if len(values) == 0:
                raise ValueError(f"grid key {key!r} has no values")
        return v

    @field_validator("random")
    @classmethod
    def _random_keys(cls, v: dict[str, Dist]) -> dict[str, Dist]:
        for key in v:
            _check_key(key)
        return v

    @model_validator(mode="after")
    def _disjoint(self) -> SearchSpace:
        both = sorted(set(self.grid) & set(self.random))
        if both:
            raise ValueError(f"keys {both} are both in grid and random; keep each key in one of them")
        return self

    def seed_list(self, default: int) -> Sequence[int]:
        """The run seeds: ``seeds`` as given, ``range(seeds)`` for a count (lazy), else ``(default,)``."""
        if self.seeds is None:
            return (default,)
        if isinstance(self.seeds, int):
            if self.seeds < 1:
                raise DataReconError(f"search.seeds must be >= 1 (got {self.seeds}); or give a list of seeds")
            return range(self.seeds)
        return tuple(self.seeds)


class Resources(BaseModel):
    """Per-run resources (used by the Ray backend; ``num_cpus`` also sets torch's threads)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    num_cpus: float = Field(default=1.0, gt=0)
    num_gpus: float = Field(default=0.0, ge=0)


class Selection(BaseModel):
    """Attacker-side model selection: a criterion of ``run.json``'s ``selection`` mapping.

    Attributes:
        criterion: a :data:`datarecon.attacks.selection.CRITERIA` name (attacker-side only, e.g.
            ``relative_residual`` = ‖θ* − g‖² / ‖θ*‖²); never a ground-truth metric.
        mode: ``min`` or ``max``; ``None``: the direction registered with the criterion.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    criterion: str = DEFAULT_CRITERION
    mode: Literal["min", "max"] | None = None


class SweepConfig(BaseModel):
    """A hyper-parameter sweep of one attack on one target.

    Attributes:
        model_dir: the target model directory (relative paths: to the current directory).
        method: attack registry name (``kkt``, ``decoreco``, ``gradnorm``, ``bilevel``).
        attack: base fields of the method's attack config.
        init: base initialisation: ``{name: <INITS name>, **params}``.
        candidates: number of candidates m (``None``: the attack's default, e.g. 2n).
        steps: optimisation steps per run.
        dtype, device: numerics of each run (``dtype`` None: the method's default, e.g. float32 for
            the KKT family, float64 for bilevel).
        search: what varies (:class:`SearchSpace`).
        knowledge: what the attacker knows beyond θ* (every run of the sweep), as a run file's
            ``knowledge``.
        budget: maximum number of runs (``None``: the full expansion).
        seed: drives the random draws (and the run seed when ``search.seeds`` is absent).
        selection: the attacker-side criterion used for the best-so-far display, ranking and pooling.
        max_retries: how often a crashed or killed run is retried before it is recorded as failed.
        resources: per-run CPUs/GPUs.
        name: a label stored with the sweep.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model_dir: str
    method: str = "kkt"
    attack: dict[str, Any] = Field(default_factory=dict)
    init: dict[str, Any] = Field(default_factory=lambda: {"name": "gaussian", "scale": 1e-3})
    candidates: int | None = Field(default=None, ge=1)
    steps: int = Field(default=1000, ge=1, le=MAX_STEPS)
    dtype: Literal["float32", "float64"] | None = None
    device: str = "cpu"
    search: SearchSpace = Field(default_factory=SearchSpace)
    budget: int | None = Field(default=None, ge=1, le=MAX_RUNS)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    selection: Selection = Field(default_factory=Selection)
    max_retries: int = Field(default=2, ge=0)
    resources: Resources = Field(default_factory=Resources)
    name: str = ""
    knowledge: dict[str, Any] = Field(default_factory=dict, description="the attacker's knowledge beyond θ* "
                                      "(known_init: seed:N or a file, n), as in a run file")

    @field_validator("knowledge")
    @classmethod
    def _knowledge(cls, v: dict[str, Any]) -> dict[str, Any]:
        return KnowledgeSettings.model_validate(v).model_dump(exclude_none=True)

    @field_validator("init")
    @classmethod
    def _init_name(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "name" not in v:
            raise ValueError("init needs a 'name' (an initialisation registry key, e.g. gaussian)")
        return v

    @model_validator(mode="after")
    def _size(self) -> SweepConfig:
        if self.budget is None and (total := full_size(self)) > MAX_RUNS:
            s = self.search
            parts = [" x ".join(str(len(s.grid[k])) for k in sorted(s.grid)) + " grid values"] if s.grid else []
            parts += [f"{n_samples(self)} random samples"] if s.random else []
            parts += [f"{len(s.seed_list(self.seed))} seeds"] if s.seeds is not None else []
            raise DataReconError(f"the sweep expands to {total:,} runs ({', '.join(parts)}), more than {MAX_RUNS:,}; "
                                 "shrink the search or set budget: N to run the first N")
        return self


class RunSpec(BaseModel):
    """One fully resolved attack run of a sweep (what a worker executes).

    Attributes:
        model_dir: the target model directory (absolute).
        method, attack, init, candidates, steps, dtype, device, seed: as in :class:`SweepConfig`,
            with the sampled values filled in.
        params: the swept values of this run, dotted key -> value (for display and the index).
        index: position in the sweep's expansion order.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model_dir: str
    method: str
    attack: dict[str, Any] = Field(default_factory=dict)
    init: dict[str, Any]
    candidates: int | None = None
    steps: int
    dtype: Literal["float32", "float64"] = "float64"
    device: str = "cpu"
    seed: int = 0
    params: dict[str, Any] = Field(default_factory=dict)
    index: int = 0
    knowledge: dict[str, Any] = Field(default_factory=dict)

    def attack_fields(self) -> dict[str, Any]:
        """The method config fields: ``attack`` plus ``steps`` and ``dtype`` where the method has them."""
        known = set(ATTACKS.get(self.method).config_cls.model_fields)
        return {**self.attack, **{name: getattr(self, name) for name in ("steps", "dtype") if name in known}}

    def to_run(self, *, checkpoint_every: int = 100, log_every: int = 10) -> Any:
        """This spec as a :class:`~datarecon.experiments.reconstruct.ReconstructionRun` (one-line errors)."""
        fields = {"model": self.model_dir, "attack": {"method": self.method, **self.attack_fields()},
                  "init": dict(self.init), "candidates": self.candidates, "seed": self.seed,
                  "device": self.device, "checkpoint": {"every": checkpoint_every, "log_every": log_every}}
        if self.knowledge:
            fields["knowledge"] = dict(self.knowledge)
        return build_run(fields)

    def identity(self, *, model_id: str | None = None) -> dict[str, Any]:
        """What determines the run's result (the run key hashes this): no index/params/device/path."""
        out = {"model": model_id or self.model_dir, "method": self.method, "attack": self.attack,
               "init": self.init, "candidates": self.candidates, "steps": self.steps, "dtype": self.dtype,
               "seed": self.seed}
        if self.knowledge:  # absent for the weights-only attacker: earlier run keys stay valid
            out["knowledge"] = dict(self.knowledge)
        return out


# ---------------------------------------------------------------------------
# expansion


def sample_seed(seed: int, sample: int) -> int:
    """The seed of random draw ``sample`` of a sweep with ``seed`` (stable, platform-independent)."""
    digest = hashlib.sha256(f"datarecon-sweep:{seed}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def draw_random(space: Mapping[str, Dist], *, seed: int, sample: int) -> dict[str, Any]:
    """Random draw number ``sample``: one value per key, keys in sorted order."""
    g = torch.Generator().manual_seed(sample_seed(seed, sample))
    return {key: space[key].sample(g) for key in sorted(space)}


def grid_points(grid: Mapping[str, tuple[Any, ...]]) -> Iterator[dict[str, Any]]:
    """Cartesian product of the grid (keys sorted; values in the listed order), one point at a time;
    a single ``{}`` for no grid."""
    keys = sorted(grid)
    return (dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys)))


def grid_size(grid: Mapping[str, tuple[Any, ...]]) -> int:
    """The number of grid points, from the sizes alone (nothing is built)."""
    return math.prod(len(v) for v in grid.values())


def n_samples(config: SweepConfig) -> int:
    """Number of random draws (see :class:`SearchSpace`)."""
    s = config.search
    if not s.random:
        return 1
    if s.samples is not None:
        return s.samples
    if config.budget is not None:
        per = grid_size(s.grid) * len(s.seed_list(config.seed))
        return max(1, config.budget // per)
    return 1


def full_size(config: SweepConfig) -> int:
    """The number of runs the whole expansion has, without ``budget`` (computed from the sizes)."""
    return n_samples(config) * grid_size(config.search.grid) * len(config.search.seed_list(config.seed))


def method_dtype(method: str) -> str:
    """The default dtype of ``method``'s attack config."""
    return str(getattr(method_config(method), "dtype", "float64"))


def expand(config: SweepConfig, *, model_dir: str | None = None) -> list[RunSpec]:
    """All runs of a sweep, in the deterministic order described in the module docstring.

    Args:
        config: the sweep.
        model_dir: override of ``config.model_dir`` written into the specs (e.g. resolved path).

    Returns:
        At most ``config.budget`` run specs; same config (and seed) -> same list.
    """
    base = {"model_dir": model_dir or config.model_dir, "method": config.method, "attack": dict(config.attack),
            "init": dict(config.init), "candidates": config.candidates, "steps": config.steps,
            "dtype": config.dtype or method_dtype(config.method), "device": config.device,
            "knowledge": dict(config.knowledge)}
    seeds = config.search.seed_list(config.seed)
    specs: list[RunSpec] = []
    for s in range(n_samples(config)):
        drawn = draw_random(config.search.random, seed=config.seed, sample=s) if config.search.random else {}
        for point in grid_points(config.search.grid):
            for run_seed in seeds:
                spec = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
                params = {**point, **drawn}
                for key in sorted(params):
                    set_dotted(spec, key, params[key])
                if len(seeds) > 1 or config.search.seeds is not None:
                    params["seed"] = run_seed
                specs.append(RunSpec(**spec, seed=run_seed, params=params, index=len(specs)))
                if config.budget is not None and len(specs) >= config.budget:
                    return specs
    return specs
