"""Step sizes that fit the target, chosen attacker-side: a short probe before the run.

An attack's step sizes (``lr_x``, the multipliers' ``lr_lambda``) are set for one scale of target;
on another (an ascended MLP, a ResNet with batch norm) the same numbers can diverge within a few
steps. Before a run, the probe takes ``steps`` steps of the attack in memory from the run's own
start (x₀, a copy of its generator) at a ``scale`` on every step-size field the attack declares
(:attr:`~datarecon.attacks.base.Attack.step_size_fields`) and reads only the attack's own objective.
A setting *fails* when a step's loss is not finite, the attack stops as diverged, or the objective
grows beyond :data:`GROWTH` times its first value; otherwise it is ``ok`` and its *residual* is the
largest objective over the last :data:`WINDOW_FRACTION` of the probe (an oscillating setting scores
its peaks).

The rule (a search up to the largest stable step, the attack's objective deciding):

1. scale 1 (the configured step sizes); if it is ok the run is left alone, bit for bit;
2. coarse: the scale times ``factor`` (0.1) while it fails, up to ``tries`` (4) times;
3. fine: between the last failing scale s_f and the first ok one s_o, ``refine`` (3) bisections in log
   scale (the next probe at √(s_f·s_o), replacing s_o when ok, else s_f), which brackets the edge of
   stability within a factor ``(1/factor) ** (1 / 2**refine)`` (10^(1/8) ≈ 1.33);
4. polish: while the ok scale with the smallest residual is not the largest ok scale, up to ``polish`` (2)
   probes at √(best · the next larger ok scale) (the residual's minimum often lies inside the stable range:
   near the edge a run oscillates, far below it it crawls);
5. the run takes the ok scale with the smallest residual (the larger scale on a tie), so a setting just
   under the edge that oscillates loses to a smaller one that made more progress.

Cost: at most ``1 + tries + refine + polish`` probes (10 by default) of ``steps`` steps, in memory, only
when scale 1 fails. The run then starts afresh with the chosen step sizes (its config, hence its resume key,
holds them, and a resumed run probes again to the same choice) and run.json records every scale tried
with its verdict and residual. Nothing but the attack's objective enters the choice.
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

__all__ = ["ProbeResult", "chosen_scale", "probe_step_sizes", "probe_trial", "residual", "scaled"]

#: the probe's loop: no history beyond what it reads, no progress, no checkpoint
_PROBE_LOOP = LoopOptions(log_every=1, progress=False, checkpoint_every=0)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe chose.

    Attributes:
        attack: the attack with the step sizes that passed (the input attack when none had to change).
        scale: the factor applied to every step-size field (1: unchanged).
        record: run.json's ``step_probe``: steps, the scales tried with each one's verdict and residual, the
            chosen scale, the fields at it and the rule's constants.
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


def residual(history: list[dict[str, float]]) -> float:
    """The largest objective over the last :data:`WINDOW_FRACTION` of a probe's ``history`` (at least its last
    step): what an ok setting reached, its oscillation counted."""
    losses = [row.get("loss", float("nan")) for row in history]
    window = max(1, math.ceil(len(losses) * WINDOW_FRACTION))
    return max(losses[-window:])


#: the objective may rise to this multiple of its first value during the probe (momentum overshoots, the
#: multipliers' first moves) and pass: beyond it the run is on its way to a non-finite loss
GROWTH = 1e3

#: the share of the probe's last steps whose largest objective is an ok setting's residual
WINDOW_FRACTION = 0.2

#: coarse factor, coarse tries, log-scale bisections and residual polish probes of the rule (module docstring)
FACTOR, TRIES, REFINE, POLISH = 0.1, 4, 3, 2


def probe_trial(attack: Attack, setup: AttackSetup, *, steps: int, scale: float) -> dict[str, Any]:
    """One probe of ``steps`` steps of ``attack`` with its step sizes times ``scale`` from a copy of ``setup``'s
    start: ``{"scale", "verdict", "residual"}`` (residual None unless ok)."""
    generator = torch.Generator(device=setup.generator.device).set_state(setup.generator.get_state())
    probe = replace(setup, x0=setup.x0.clone(), generator=generator)
    with warnings.catch_warnings(), uncounted_loops():  # a diverging probe is the probe working, not news
        warnings.simplefilter("ignore", RuntimeWarning)
        rec = run_attack(scaled(attack, scale), probe, steps=steps, out=None, loop=_PROBE_LOOP)
    verdict = _verdict(rec.history, rec.status)
    return {"scale": scale, "verdict": verdict, "residual": residual(rec.history) if verdict == "ok" else None}


def chosen_scale(tried: list[dict[str, Any]]) -> float:
    """The ok scale of ``tried`` with the smallest residual (the larger on a tie); the last scale tried when
    none is ok."""
    ok = [t for t in tried if t["verdict"] == "ok"]
    if not ok:
        return float(tried[-1]["scale"])
    return float(min(ok, key=lambda t: (t["residual"], -t["scale"]))["scale"])


def _polished(tried: list[dict[str, Any]], probe: Any, *, polish: int) -> None:
    """Step 4 of the rule: up to ``polish`` probes (``probe(scale)`` → a trial) at √(best · next larger ok scale),
    appended to ``tried``, while the ok scale with the smallest residual has a larger ok neighbour."""
    for _ in range(polish):
        best = chosen_scale(tried)
        above = [t["scale"] for t in tried if t["verdict"] == "ok" and t["scale"] > best]
        if not above:
            return
        tried.append(probe(math.sqrt(best * min(above))))


def probe_step_sizes(attack: Attack, setup: AttackSetup, *, steps: int, factor: float = FACTOR,
                     tries: int = TRIES, refine: int = REFINE, polish: int = POLISH) -> ProbeResult:
    """The step sizes a run of ``attack`` from ``setup`` starts with (the rule of the module docstring).

    Args:
        attack: the configured attack; setup: the run's target, prior, x₀ and generator (the
            generator is copied: the run draws the same numbers it would without the probe).
        steps: probe length (0: no probe, the attack unchanged); factor: 0 < factor < 1 (coarse);
        tries: coarse tries ≥ 0; refine: log-scale bisections ≥ 0 after the first ok coarse scale;
        polish: probes ≥ 0 toward a smaller residual inside the stable range.

    Returns:
        :class:`ProbeResult` (the last scale tried when none passed: the run then shows the divergence
        itself, with the record saying so).
    """
    if steps <= 0 or not attack.step_size_fields:
        return ProbeResult(attack, 1.0, {})
    tried = [probe_trial(attack, setup, steps=steps, scale=1.0)]
    while tried[-1]["verdict"] != "ok" and len(tried) <= tries:
        tried.append(probe_trial(attack, setup, steps=steps, scale=tried[-1]["scale"] * factor))
    if len(tried) > 1 and tried[-1]["verdict"] == "ok":
        failing, ok = tried[-2]["scale"], tried[-1]["scale"]
        for _ in range(refine):
            trial = probe_trial(attack, setup, steps=steps, scale=math.sqrt(failing * ok))
            tried.append(trial)
            failing, ok = (failing, trial["scale"]) if trial["verdict"] == "ok" else (trial["scale"], ok)
        _polished(tried, lambda scale: probe_trial(attack, setup, steps=steps, scale=scale), polish=polish)
    scale = chosen_scale(tried)
    candidate = scaled(attack, scale)
    fields = {f: getattr(candidate.config, f) for f in attack.step_size_fields}
    rule = {"factor": factor, "tries": tries, "refine": refine, "polish": polish, "growth": GROWTH,
            "window": WINDOW_FRACTION}
    return ProbeResult(candidate, scale, {"steps": steps, "tried": tried, "scale": scale, "fields": fields,
                                          "rule": rule})
