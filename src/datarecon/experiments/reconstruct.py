"""Python API for one reconstruction run: model directory in, run directory out.

:func:`prepare_attack` builds what an attack receives — the attacker's view of
the target (θ*, architecture, loss, weight decay), the attacker prior (m
labels in the model's class proportions, the pixel box of the model input
space) — plus x₀ from a named initialisation. :func:`reconstruct` runs the
method into a run directory (``docs/dev/CONTRACTS.md``). ``datarecon
reconstruct``, sweeps and the paper reproductions all go through these two.

Data-dependent initialisations (``ground-truth``, ``partition``, ``mix``) are
the experimenter's explicit choice (Runkel et al. 2024, §4.3/§4.5): only then
are images loaded, from the model's own data spec, and handed to the
initialisation — never to the attack. Their labels then come with the images.

Example:
    >>> from datarecon.experiments.reconstruct import reconstruct
    >>> rec = reconstruct("model-dir", out="run-dir", method="kkt", steps=500)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from datarecon.attacks.base import ATTACKS, AttackerPrior, Reconstruction, Target
from datarecon.config import build_config, merge
from datarecon.errors import DataReconError, DivergenceError

DTYPES = {"float32": torch.float32, "float64": torch.float64}
DATA_INITS_NOTE = ("initialisation (experimenter's choice): loading {init} images through the model's data spec; "
                   "the attack itself never sees them")


@dataclass(frozen=True)
class AttackSetup:
    """Inputs of one attack run.

    Attributes:
        target: the attacker's view of the model.
        prior: labels and pixel box (model input space).
        x0: (m, C, H, W) initial candidates in model input space.
        generator: the seeded generator (continues into the attack).
        record: what run.json records about the set-up (init name and params, m, device).
    """

    target: Target
    prior: AttackerPrior
    x0: torch.Tensor
    generator: torch.Generator
    record: dict[str, Any] = field(default_factory=dict)


def method_config(method: str, fields: Mapping[str, Any] | BaseModel | None = None, **options: Any) -> BaseModel:
    """The validated config of ``method`` from a mapping (or a ready config) plus keyword overrides.

    ``None`` values are ignored. Raises DataReconError for an unknown method (lists valid names),
    a field the method does not have, or invalid values (one line naming each bad field).
    """
    entry = ATTACKS.get(method)
    config_cls = getattr(entry, "config_cls", None)
    if config_cls is None:
        raise DataReconError(f"attack method {method!r} has no config_cls; it cannot be built from a config")
    base = fields.model_dump() if isinstance(fields, BaseModel) else dict(fields or {})
    known = set(config_cls.model_fields)
    for key, value in options.items():
        if value is not None and key not in known:
            flag = "--" + key.replace("_", "-")
            raise DataReconError(f"option {flag} does not apply to method {method!r}; "
                                 f"its fields: {', '.join(sorted(known))}")
    return build_config(config_cls, merge(base, options), where=f"{method} config")


def make_attack(method: str, config: BaseModel) -> Any:
    """Instantiate the registered attack ``method`` from its config."""
    entry = ATTACKS.get(method)
    factory = getattr(entry, "from_config", None)
    return factory(config) if factory is not None else entry(config)


def default_candidates(data: Mapping[str, Any], num_outputs: int, *, data_init: bool) -> int:
    """Default m: n for data-dependent inits, else 2n (Haim et al.); n from the model's data spec."""
    n_per_class = int(data.get("n_per_class", 0) or 0)
    if n_per_class <= 0:
        raise DataReconError("the model's data spec has no n_per_class; pass candidates (--candidates M)")
    n = n_per_class * (2 if num_outputs == 1 else num_outputs)
    return n if data_init else 2 * n


def init_sources(model_dir: str | Path, *, data_dir: str | Path | None = None) -> Any:
    """Training and partition images of the model's data spec in model input space (experimenter side)."""
    from datarecon.attacks.init import InitSources
    from datarecon.data import DataSpec, Normalisation, load_task
    from datarecon.models.checkpoint import EXTRAS, read_model_meta
    from datarecon.utils.io import load_tensors

    meta = read_model_meta(model_dir)
    task = load_task(DataSpec.model_validate(meta["data"]), data_dir=data_dir)
    norm = Normalisation.from_mean(meta.get("normalisation", "unit"),
                                   load_tensors(Path(model_dir) / EXTRAS)["input_mean"])
    has_part = task.partition.x.shape[0] > 0
    return InitSources(ground_truth=norm.to_model(task.train.x).double(), ground_truth_labels=task.train.y,
                       partition=norm.to_model(task.partition.x).double() if has_part else None,
                       partition_labels=task.partition.y if has_part else None)


def prepare_attack(model_dir: str | Path, *, init: str = "gaussian", init_params: Mapping[str, Any] | None = None,
                   candidates: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float64,
                   device: str | torch.device = "cpu", data_dir: str | Path | None = None,
                   sources: Any = None) -> AttackSetup:
    """Target, prior and x₀ for attacking ``model_dir``.

    Args:
        model_dir: a model directory (``datarecon train``).
        init: initialisation name (``datarecon.attacks.init.INITS``).
        init_params: its parameters (e.g. ``scale`` for gaussian, ``l1``/``l2`` for mix).
        candidates: m; default 2n (n for data-dependent inits).
        seed: seeds x₀ and the attack's generator.
        dtype, device: of the attack.
        data_dir: data folder (only data-dependent inits read it).
        sources: ready :class:`~datarecon.attacks.init.InitSources` (skips loading the data).

    Raises:
        DataReconError: unknown init (lists valid names), m < 1, labels inconsistent with the model.
    """
    from datarecon.attacks.init import INITS, init_labels, make_init
    from datarecon.models.checkpoint import EXTRAS, read_model_meta
    from datarecon.utils.io import load_tensors

    params = dict(init_params or {})
    entry = INITS.get(init)
    data_init = bool(getattr(entry, "needs", ()))
    if candidates is not None and candidates < 1:
        raise DataReconError(f"candidate count must be at least 1, got {candidates}; pass --candidates M with M >= 1")
    meta = read_model_meta(model_dir)
    target = Target.from_model_dir(model_dir, device=device, dtype=dtype)
    mean = load_tensors(Path(model_dir) / EXTRAS)["input_mean"].to(torch.float64)
    lower, upper = (-mean).to(device=device, dtype=dtype), (1.0 - mean).to(device=device, dtype=dtype)
    m = candidates if candidates is not None else default_candidates(meta.get("data", {}), target.num_outputs,
                                                                     data_init=data_init)
    if data_init and sources is None:
        sources = init_sources(model_dir, data_dir=data_dir)
    generator = torch.Generator().manual_seed(int(seed))
    x0 = make_init(init, m=m, input_shape=target.input_shape, mean=mean, generator=generator, sources=sources,
                   dtype=dtype, device=device, **params)
    labels = init_labels(init, m=m, sources=sources, **params)
    if labels is None:
        prior = AttackerPrior.balanced(m=m, num_outputs=target.num_outputs, input_shape=target.input_shape,
                                       lower=lower, upper=upper)
    else:
        labels = labels.to(torch.float64) if target.num_outputs == 1 else labels.long()
        prior = AttackerPrior(labels=labels.to(device), input_shape=target.input_shape, lower=lower, upper=upper)
    prior.check(target)
    record = {"init": {"name": init, "params": params, "experimenter_choice": data_init},
              "candidates": m, "device": str(device)}
    return AttackSetup(target=target, prior=prior, x0=x0, generator=generator, record=record)


def reconstruct(model_dir: str | Path, *, out: str | Path, method: str = "kkt",
                config: Mapping[str, Any] | BaseModel | None = None, steps: int | None = None,
                init: str = "gaussian", init_params: Mapping[str, Any] | None = None,
                candidates: int | None = None, seed: int = 0, device: str | torch.device = "cpu",
                data_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
                progress: bool = True, checkpoint_every: int = 100, log_every: int = 10, early_stop_patience: int = 0,
                early_stop_tol: float = 1e-3, hooks: Sequence[Any] = (), sources: Any = None,
                record: Mapping[str, Any] | None = None, raise_on_divergence: bool = False) -> Reconstruction:
    """Run ``method`` on ``model_dir`` into the run directory ``out``.

    Args:
        model_dir: the target's model directory.
        out: run directory (created; resumed with ``resume=True``). An existing non-empty ``out`` is
            refused unless ``resume`` or ``overwrite``; ``overwrite`` replaces only a run directory
            (:mod:`datarecon.utils.outdir`), and only after the model and settings were accepted.
        method: attack name (``kkt``, ``decoreco``, ``gradnorm``, ``bilevel``).
        config: the method's config fields (mapping or config object); ``steps`` overrides.
        init, init_params, candidates, seed, device, data_dir, sources: see :func:`prepare_attack`.
        resume: continue from ``out/checkpoint`` (bit-identical on CPU).
        overwrite: replace an existing run directory ``out``.
        progress: show a progress bar with the loss terms.
        checkpoint_every, log_every: checkpoint and history periods (steps).
        early_stop_patience, early_stop_tol: stop on a plateau of the relative stationarity residual
            (attacker-side; 0 disables).
        hooks: extra engine hooks.
        record: extra fields for run.json.
        raise_on_divergence: raise :class:`DivergenceError` instead of returning a diverged result.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction` (also written to ``out``).
    """
    from datarecon.attacks.runner import run_attack
    from datarecon.attacks.selection import ResidualPlateau
    from datarecon.utils.outdir import check_out_dir, clear_out_dir

    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    clear = check_out_dir(out, kind="run", overwrite=overwrite, resume=resume)
    cfg = method_config(method, config, steps=steps)
    dtype = DTYPES[getattr(cfg, "dtype", None) or "float64"]
    setup = prepare_attack(model_dir, init=init, init_params=init_params, candidates=candidates, seed=seed,
                           dtype=dtype, device=device, data_dir=data_dir, sources=sources)
    attack = make_attack(method, cfg)
    if clear:  # only now: a bad model or setting leaves the old run untouched
        clear_out_dir(out, kind="run")
    early = (ResidualPlateau(key="rel_residual", patience=early_stop_patience, rel_tol=early_stop_tol)
             if early_stop_patience > 0 else None)
    rec_meta = {**setup.record, "early_stop": {"patience": early_stop_patience, "rel_tol": early_stop_tol},
                **dict(record or {})}
    rec = run_attack(attack, setup.target, setup.prior, x0=setup.x0, generator=setup.generator,
                     steps=getattr(cfg, "steps", None), out=out, checkpoint_every=checkpoint_every, resume=resume,
                     progress=progress, log_every=log_every, seed=seed, early_stop=early, hooks=list(hooks),
                     record=rec_meta)
    if raise_on_divergence and rec.status == "diverged":
        raise DivergenceError(rec.summary.get("message", f"{method} diverged") + f" (last finite state in {out})")
    return rec


def run_name(index: int) -> str:
    """Folder name of run ``index`` of :func:`reconstruct_runs` (``run0``, ``run1``, ...)."""
    return f"run{index}"


def reconstruct_runs(model_dir: str | Path, *, out: str | Path, runs: int, method: str = "kkt",
                     config: Mapping[str, Any] | BaseModel | None = None, steps: int | None = None,
                     init: str = "gaussian", init_params: Mapping[str, Any] | None = None,
                     candidates: int | None = None, seed: int = 0, device: str | torch.device = "cpu",
                     data_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
                     progress: bool = True, checkpoint_every: int = 100, log_every: int = 10,
                     early_stop_patience: int = 0, early_stop_tol: float = 1e-3, mode: str = "batched",
                     sources: Any = None) -> list[Reconstruction]:
    """``runs`` independent runs of ``method`` on ``model_dir``, stepped together (attacks/batched.py).

    Run j is exactly the run :func:`reconstruct` makes with ``seed + j`` (its own x₀, λ₀ and
    generator), written to the run directory ``out/run<j>`` (:func:`run_name`); KKT / DecoReco runs
    share one vmapped gradient per step in ``mode="batched"``, other methods are stepped in turn.

    Args:
        runs: K ≥ 1.
        mode: ``batched`` | ``looped`` (:data:`datarecon.attacks.batched.MODES`).
        Others: as in :func:`reconstruct` (``overwrite``/``resume`` apply to each run directory;
            ``out`` itself is only created, never cleared).

    Returns:
        One :class:`~datarecon.attacks.base.Reconstruction` per run, in run order.

    Raises:
        DataReconError: runs < 1, an unknown mode, bad settings, or a run directory that may not be
            written (see :func:`reconstruct`).
    """
    from datarecon.attacks.batched import MODES, BatchMember, run_batched
    from datarecon.attacks.selection import ResidualPlateau
    from datarecon.utils.outdir import check_out_dir, clear_out_dir

    if runs < 1:
        raise DataReconError(f"--runs must be at least 1, got {runs}")
    if mode not in MODES:
        raise DataReconError(f"unknown batch mode {mode!r}; valid modes: {', '.join(MODES)}")
    if overwrite and resume:
        raise DataReconError("pass either --resume (continue the run in --out) or --overwrite (start afresh), not both")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataReconError(f"--out {out} is an existing file; choose a directory for --out")
    dirs = [out / run_name(j) for j in range(runs)]
    clear = [check_out_dir(d, kind="run", overwrite=overwrite, resume=resume) for d in dirs]
    cfg = method_config(method, config, steps=steps)
    dtype = DTYPES[getattr(cfg, "dtype", None) or "float64"]
    members = []
    target = None
    for j, d in enumerate(dirs):
        setup = prepare_attack(model_dir, init=init, init_params=init_params, candidates=candidates, seed=seed + j,
                               dtype=dtype, device=device, data_dir=data_dir, sources=sources)
        target = target or setup.target  # one model directory: the same target for every run
        early = (ResidualPlateau(key="rel_residual", patience=early_stop_patience, rel_tol=early_stop_tol)
                 if early_stop_patience > 0 else None)
        record = {**setup.record, "early_stop": {"patience": early_stop_patience, "rel_tol": early_stop_tol},
                  "batch": {"runs": runs, "index": j, "mode": mode}}
        members.append(BatchMember(attack=make_attack(method, cfg), prior=setup.prior, x0=setup.x0,
                                   generator=setup.generator, out=d, seed=seed + j, early_stop=early, record=record))
    for d, c in zip(dirs, clear, strict=True):
        if c:  # only now: a bad model or setting leaves the old runs untouched
            clear_out_dir(d, kind="run")
    return run_batched(members, target, mode=mode, steps=getattr(cfg, "steps", None), checkpoint_every=checkpoint_every,
                       resume=resume, progress=progress, log_every=log_every)
