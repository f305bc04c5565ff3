"""Build one attack run from a :class:`~datarecon.experiments.sweep.config.RunSpec` and execute it.

:func:`run_from_spec` is what a sweep worker calls: it loads the attacker's view of the model
directory (θ*, architecture, loss, weight decay; never the training images), builds the attack
from the ``ATTACKS`` registry (``config_cls`` + ``from_config``), the attacker prior (m balanced
labels, pixel box of the model input space) and x₀ (``datarecon.attacks.init.make_init``), and
runs :func:`datarecon.attacks.runner.run_attack` into a run directory (run contract in
``docs/dev/CONTRACTS.md``).

Data-dependent initialisations (``ground-truth``, ``partition``, ``mix``) are the experimenter's
explicit choice (Runkel et al. 2024, §4.3/§4.5): only then are images loaded, from the model's
own data spec, and handed to the initialisation (never to the attack).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import ATTACKS, AttackerPrior, Reconstruction, Target
from datarecon.config import build_config
from datarecon.errors import DataReconError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def load_attack_modules() -> None:
    """Import every module of ``datarecon.attacks`` so their registry entries exist."""
    import datarecon.attacks as pkg

    for info in pkgutil.walk_packages(pkg.__path__, prefix="datarecon.attacks."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional attack whose dependencies are missing: not registered
            continue


def build_attack(method: str, fields: dict[str, Any]) -> Any:
    """The attack ``method`` with its config validated from ``fields`` (one-line error on bad fields)."""
    if method not in ATTACKS:
        load_attack_modules()
    entry = ATTACKS.get(method)
    config_cls = getattr(entry, "config_cls", None)
    if config_cls is None:
        raise DataReconError(f"attack {method!r} has no config_cls; it cannot be built from a config")
    cfg = build_config(config_cls, fields, where=f"{method} attack config")
    return entry.from_config(cfg) if hasattr(entry, "from_config") else entry(cfg)


def default_candidates(data: dict[str, Any]) -> int:
    """m = 2n (Haim et al. 2022) from the model's data spec, n = n_per_class × task classes."""
    from datarecon.data import DataSpec

    spec = DataSpec.model_validate(data)
    return 2 * spec.n_per_class * spec.resolved_task().num_classes


def run_from_spec(spec: Any, *, out: str | Path, resume: bool = True, progress: bool = False,
                  hooks: tuple | list = (), checkpoint_every: int = 100, log_every: int = 10,
                  data_dir: str | Path | None = None) -> Reconstruction:
    """Execute one run spec into the run directory ``out``.

    Args:
        spec: a :class:`~datarecon.experiments.sweep.config.RunSpec` (or a mapping of its fields).
        out: the run directory.
        resume: continue from ``out/checkpoint`` when present (a crashed sweep task).
        progress: per-step progress bar.
        hooks: extra engine hooks (e.g. test-only fault injection).
        checkpoint_every, log_every: see :func:`datarecon.attacks.runner.run_attack`.
        data_dir: data folder, used only by data-dependent initialisations.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction`.

    Raises:
        DataReconError: bad attack/init fields, unknown names, or a model that does not fit.
    """
    from datarecon.attacks.init import INITS, InitSources, init_labels, make_init
    from datarecon.attacks.runner import run_attack
    from datarecon.experiments.sweep.config import RunSpec
    from datarecon.models.checkpoint import load_model_dir
    from datarecon.models.spec import is_homogeneous

    if not isinstance(spec, RunSpec):
        spec = RunSpec.model_validate(spec)
    dtype = DTYPES[spec.dtype]
    attack = build_attack(spec.method, {**spec.attack, "steps": spec.steps, "dtype": spec.dtype})

    bundle = load_model_dir(spec.model_dir, device=spec.device, dtype=dtype)
    target = Target(model=bundle.model, params=bundle.params, loss=bundle.loss, weight_decay=bundle.weight_decay,
                    input_shape=tuple(bundle.arch.input_shape), num_outputs=bundle.arch.num_outputs,
                    homogeneous=is_homogeneous(bundle.arch), model_dir=str(Path(spec.model_dir).resolve()))
    shape = tuple(target.input_shape)
    mean = bundle.input_mean.to(torch.float64)
    m = spec.candidates or default_candidates(bundle.data)

    init = dict(spec.init)
    init_name = init.pop("name")
    sources = None
    if INITS.get(init_name).needs:
        sources = _init_sources(bundle, data_dir=data_dir)
    labels = init_labels(init_name, m=m, sources=sources, **init)
    if labels is not None:
        labels = labels.to(torch.float64) if target.num_outputs == 1 else labels.long()
        prior = AttackerPrior(labels=labels, input_shape=shape, lower=(0.0 - mean).to(dtype),
                              upper=(1.0 - mean).to(dtype))
    else:
        prior = AttackerPrior.balanced(m=m, num_outputs=target.num_outputs, input_shape=shape,
                                       lower=(0.0 - mean).to(dtype), upper=(1.0 - mean).to(dtype))
    generator = torch.Generator().manual_seed(int(spec.seed))
    x0 = make_init(init_name, m=m, input_shape=shape, mean=mean, generator=generator, sources=sources,
                   dtype=dtype, device=spec.device, **init)
    record = {"init": spec.init, "candidates": m, "sweep_params": spec.params}
    return run_attack(attack, target, prior, x0=x0, generator=generator, steps=spec.steps, out=out,
                      checkpoint_every=checkpoint_every, resume=resume, progress=progress, log_every=log_every,
                      seed=spec.seed, hooks=list(hooks), record=record)


def _init_sources(bundle: Any, *, data_dir: str | Path | None) -> Any:
    """Training and partition images of the model's data spec, in model input space (experimenter side)."""
    from datarecon.attacks.init import InitSources
    from datarecon.data import DataSpec, Normalisation, load_task

    task = load_task(DataSpec.model_validate(bundle.data), data_dir=data_dir)
    norm = Normalisation.from_mean(bundle.normalisation, bundle.input_mean)
    return InitSources(ground_truth=norm.to_model(task.train.x).double(), ground_truth_labels=task.train.y,
                       partition=norm.to_model(task.partition.x).double(), partition_labels=task.partition.y)
