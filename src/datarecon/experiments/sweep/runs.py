"""Execute one sweep run spec: a typed :class:`~datarecon.experiments.sweep.config.RunSpec` becomes a
:class:`~datarecon.experiments.reconstruct.ReconstructionRun` (:meth:`RunSpec.to_run`) and runs
through :func:`~datarecon.experiments.reconstruct.execute`, so sweeps, ``datarecon reconstruct``,
experiment files and the paper reproductions build targets, priors, x₀ and attacks the same way
and write the same run directory (``docs/dev/CONTRACTS.md``). Errors are re-worded in the sweep
file's terms (``attack.lr_x`` instead of ``--lr-x``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from datarecon.attacks.base import ATTACKS, Reconstruction
from datarecon.errors import DataReconError
from datarecon.experiments.reconstruct import RunOptions, TargetRecord, check_before_target, execute
from datarecon.experiments.sweep.config import RunSpec

#: ``datarecon reconstruct`` options whose sweep field is not ``attack.<name>``
SWEEP_FIELDS = {"--candidates": "candidates", "--steps": "steps", "--dtype": "dtype", "--seed": "seed",
                "--init": "init.name", "--init-count": "init.count", "--init-scale": "init.scale",
                "--mix-l1": "init.l1", "--mix-l2": "init.l2", "--mix-noise": "init.noise"}
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


def sweep_field(flag: str) -> str:
    """The sweep-file field of a ``datarecon reconstruct`` option (``--lr-x`` → ``attack.lr_x``)."""
    return SWEEP_FIELDS.get(flag, "attack." + flag[2:].replace("-", "_"))


def _run_flags() -> set[str]:
    """The ``datarecon reconstruct`` options that name a field of a sweep run (the others, such as
    ``--resume`` or ``--out``, have no sweep field and stay as they are)."""
    fields = {f for name in ATTACKS.names() for f in ATTACKS.get(name).config_cls.model_fields}
    return set(SWEEP_FIELDS) | {"--" + f.replace("_", "-") for f in fields}


def sweep_message(message: str) -> str:
    """An error message of the reconstruction API with its command-line options named as sweep fields."""
    flags = _run_flags()

    def field(m: re.Match[str]) -> str:
        return sweep_field(m.group(0)) if m.group(0) in flags else m.group(0)

    return _FLAG.sub(field, re.sub(r"pass (--[a-z][a-z0-9-]*)",
                                   lambda m: ("set " if m.group(1) in flags else "pass ") + m.group(1), message))


@contextmanager
def in_sweep_terms(spec: RunSpec) -> Iterator[None]:
    """Re-raise a :class:`DataReconError` of one sweep run naming the run and its sweep fields, not CLI flags."""
    try:
        yield
    except DataReconError as exc:
        params = f" {spec.params}" if spec.params else ""
        raise type(exc)(f"sweep run {spec.index}{params}: {sweep_message(str(exc))} in the sweep file") from None


def validate_spec(spec: RunSpec, target: TargetRecord | None = None) -> None:
    """Check a run spec's attack and initialisation fields without running anything (one-line errors); with
    ``target`` (what the sweep's model directory records) also what :func:`~datarecon.experiments.reconstruct.
    check_before_target` checks (knowledge, the priors the target can take, no prior coupling runs)."""
    with in_sweep_terms(spec):
        run = spec.to_run()
        if target is not None:
            check_before_target(run, target, cli=False)


def run_from_spec(spec: RunSpec | Mapping[str, Any], *, out: str | Path, resume: bool = True,
                  progress: bool = False, hooks: tuple | list = (), checkpoint_every: int = 100,
                  log_every: int = 10, data_dir: str | Path | None = None) -> Reconstruction:
    """Execute one run spec into the run directory ``out``.

    Args:
        spec: a :class:`~datarecon.experiments.sweep.config.RunSpec` (or a mapping of its fields).
        out: the run directory.
        resume: continue from ``out/checkpoint`` when present (a crashed sweep task).
        progress: per-step progress bar.
        hooks: extra engine hooks (e.g. test-only fault injection).
        checkpoint_every, log_every: the run's ``checkpoint`` settings.
        data_dir: data folder, used only by data-dependent initialisations.

    Returns:
        The :class:`~datarecon.attacks.base.Reconstruction`.

    Raises:
        DataReconError: bad attack/init fields, unknown names, or a model that does not fit.
    """
    if not isinstance(spec, RunSpec):
        spec = RunSpec.model_validate(spec)
    with in_sweep_terms(spec):
        run = spec.to_run(checkpoint_every=checkpoint_every, log_every=log_every)
        how = RunOptions(resume=resume, progress=progress, hooks=tuple(hooks), data_dir=data_dir, nested=True)
        return execute(run, out, how, record={"sweep_params": spec.params})
