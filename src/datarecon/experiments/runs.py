"""Execute one sweep run spec: a thin adapter onto :func:`datarecon.experiments.reconstruct.reconstruct`.

A :class:`~datarecon.experiments.sweep.config.RunSpec` (method, attack fields, init, candidates,
steps, dtype, seed) is translated into the one Python API for a reconstruction run, so sweeps,
``datarecon reconstruct`` and the paper reproductions build targets, priors, x₀ and attacks the
same way and write the same run directory (``docs/dev/CONTRACTS.md``).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from datarecon.attacks.base import ATTACKS, Reconstruction
from datarecon.errors import DataReconError

#: ``datarecon reconstruct`` options whose sweep field is not ``attack.<name>``
SWEEP_FIELDS = {"--candidates": "candidates", "--steps": "steps", "--dtype": "dtype", "--seed": "seed",
                "--init": "init.name", "--init-count": "init.count", "--init-scale": "init.scale",
                "--mix-l1": "init.l1", "--mix-l2": "init.l2", "--mix-noise": "init.noise"}
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


def sweep_field(flag: str) -> str:
    """The sweep-file field of a ``datarecon reconstruct`` option (``--lr-x`` → ``attack.lr_x``)."""
    return SWEEP_FIELDS.get(flag, "attack." + flag[2:].replace("-", "_"))


def sweep_message(message: str) -> str:
    """An error message of the reconstruction API with its command-line options named as sweep fields."""
    return _FLAG.sub(lambda m: sweep_field(m.group(0)), message.replace("pass --", "set --"))


@contextmanager
def in_sweep_terms(spec: Any):
    """Re-raise a :class:`DataReconError` of one sweep run naming the run and its sweep fields, not CLI flags."""
    try:
        yield
    except DataReconError as exc:
        params = f" {spec.params}" if getattr(spec, "params", None) else ""
        raise type(exc)(f"sweep run {spec.index}{params}: {sweep_message(str(exc))} in the sweep file") from None


def load_attack_modules() -> None:
    """Import every module of ``datarecon.attacks`` so their registry entries exist (spawned workers
    start with an empty registry)."""
    import datarecon.attacks as pkg

    for info in pkgutil.walk_packages(pkg.__path__, prefix="datarecon.attacks."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional attack whose dependencies are missing: not registered
            continue


def attack_fields(spec: Any) -> dict[str, Any]:
    """The method config fields of a run spec: ``attack`` plus ``steps`` and ``dtype`` when the
    method's config has them."""
    if spec.method not in ATTACKS:
        load_attack_modules()
    known = set(getattr(ATTACKS.get(spec.method), "config_cls").model_fields)
    fields = dict(spec.attack)
    for name in ("steps", "dtype"):
        if name in known:
            fields[name] = getattr(spec, name)
    return fields


def validate_spec(spec: Any) -> None:
    """Check a run spec's attack and initialisation fields without running anything (one-line errors)."""
    from datarecon.attacks.init import init_params
    from datarecon.experiments.reconstruct import method_config

    with in_sweep_terms(spec):
        method_config(spec.method, attack_fields(spec))
        init = dict(spec.init)
        init_params(init.pop("name"), **init)


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
    from datarecon.experiments.reconstruct import reconstruct
    from datarecon.experiments.sweep.config import RunSpec

    if not isinstance(spec, RunSpec):
        spec = RunSpec.model_validate(spec)
    init = dict(spec.init)
    init_name = init.pop("name")
    with in_sweep_terms(spec):
        return reconstruct(spec.model_dir, out=out, method=spec.method, config=attack_fields(spec), init=init_name,
                           init_params=init, candidates=spec.candidates, seed=spec.seed, device=spec.device,
                           data_dir=data_dir, resume=resume, progress=progress, checkpoint_every=checkpoint_every,
                           log_every=log_every, hooks=list(hooks), record={"sweep_params": spec.params})
