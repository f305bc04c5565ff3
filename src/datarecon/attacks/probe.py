"""Step sizes that fit the target, chosen attacker-side: a short probe before the run.

An attack's step sizes (``lr_x``, the multipliers' ``lr_lambda``) are set for one scale of target;
on another (an ascended MLP, a ResNet with batch norm) the same numbers can diverge within a few
steps. Before a run, the probe takes ``steps`` steps of the attack in memory from the run's own
start (x₀, a copy of its generator) and reads only the attack's own objective: if a step's loss is
not finite, the attack stops as diverged, or the objective has grown beyond ``growth`` times its
first value, every step-size field the attack declares (:attr:`~datarecon.attacks.base.Attack.
step_size_fields`) is multiplied by ``factor`` and the probe is taken again, up to ``tries`` times.
The run then starts afresh with the step sizes that passed (its config, hence its resume key, holds
them) and run.json records what was tried. Nothing but the attack's objective enters the choice.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch

from datarecon.attacks.base import Attack, AttackSetup
from datarecon.attacks.runner import run_attack
from datarecon.kernel.engine import LoopOptions, uncounted_loops
from datarecon.kernel.status import Status

__all__ = ["ProbeResult", "probe_step_sizes", "scaled"]

#: the probe's loop: no history beyond what it reads, no progress, no checkpoint
_PROBE_LOOP = LoopOptions(log_every=1, progress=False, checkpoint_every=0)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe chose.

    Attributes:
        attack: the attack with the step sizes that passed (the input attack when none had to change).
        scale: the factor applied to every step-size field (1: unchanged).
        record: run.json's ``step_probe``: steps, the scales tried with each one's verdict, the fields.
    """

    attack: Attack
    scale: float
    record: dict[str, Any]


def scaled(attack: Attack, scale: float) -> Attack:
    """A copy of ``attack`` with every field of its ``step_size_fields`` multiplied by ``scale``."""
    if scale == 1.0:
        return attack
    config = attack.config.model_copy(update={f: getattr(attack.config, f) * scale for f in attack.step_size_fields})
    return type(attack).from_config(config)


def _verdict(history: list[dict[str, float]], status: str) -> str:
    """``ok``, ``diverged`` (a non-finite loss or update) or ``grew`` (the objective rose beyond the growth cap)."""
    if status == Status.DIVERGED:
        return "diverged"
    losses = [row.get("loss", float("nan")) for row in history]
    if not losses or not all(math.isfinite(v) for v in losses):
        return "diverged"
    return "grew" if max(losses) > GROWTH * max(losses[0], 1e-300) else "ok"


#: the objective may rise to this multiple of its first value during the probe (momentum overshoots, the
#: multipliers' first moves) and pass: beyond it the run is on its way to a non-finite loss
GROWTH = 1e3


def probe_step_sizes(attack: Attack, setup: AttackSetup, *, steps: int, factor: float = 0.1,
                     tries: int = 4) -> ProbeResult:
    """The step sizes a run of ``attack`` from ``setup`` starts with (module docstring).

    Args:
        attack: the configured attack; setup: the run's target, prior, x₀ and generator (the
            generator is copied: the run draws the same numbers it would without the probe).
        steps: probe length (0: no probe, the attack unchanged); factor: 0 < factor < 1; tries ≥ 0.

    Returns:
        :class:`ProbeResult` (the last scale tried when none passed: the run then shows the divergence
        itself, with the record saying so).
    """
    if steps <= 0 or not attack.step_size_fields:
        return ProbeResult(attack, 1.0, {})
    tried: list[dict[str, Any]] = []
    scale = 1.0
    candidate = attack
    for attempt in range(tries + 1):
        candidate = scaled(attack, scale)
        generator = torch.Generator(device=setup.generator.device).set_state(setup.generator.get_state())
        probe = replace(setup, x0=setup.x0.clone(), generator=generator)
        with warnings.catch_warnings(), uncounted_loops():  # a diverging probe is the probe working, not news
            warnings.simplefilter("ignore", RuntimeWarning)
            rec = run_attack(candidate, probe, steps=steps, out=None, loop=_PROBE_LOOP)
        verdict = _verdict(rec.history, rec.status)
        tried.append({"scale": scale, "verdict": verdict})
        if verdict == "ok" or attempt == tries:
            break
        scale *= factor
    fields = {f: getattr(candidate.config, f) for f in attack.step_size_fields}
    return ProbeResult(candidate, scale, {"steps": steps, "tried": tried, "scale": scale, "fields": fields})
