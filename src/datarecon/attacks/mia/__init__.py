"""Membership inference: is an example in the target's training set? The attacker's side.

Signals (:data:`SIGNALS`, higher = more likely a member), by what the attacker needs:

* black-box: ``loss`` (−ℓ, the loss threshold of Yeom et al. 2018), ``confidence`` (LiRA's
  logit-scaled confidence φ without references);
* white-box: ``gradient-norm`` (−‖∇_θ ℓ‖ per example), ``subspace`` (the first dense layer's training
  subspace, :mod:`datarecon.attacks.subspace`; only where that layer reads the images);
* reference models: ``lira-offline``, ``lira-online`` (Carlini et al. 2022), ``rmia`` and
  ``rmia-online`` (Zarifzadeh et al. 2024), from K models the attacker trains with the target's recipe
  (:mod:`.reference`).

:mod:`.statistics` turns a model into per-example statistics; :mod:`.reference` the reference attacks'
scores; :func:`reference_signals` the four reference signals at once. Ground truth (who is a member)
enters only :mod:`datarecon.evaluation.membership`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.attacks.mia.reference import VARIANCE_PRIOR, lira_offline, lira_online, rmia
from datarecon.attacks.mia.statistics import ExampleStatistics
from datarecon.registry import Registry

__all__ = ["MIASettings", "SIGNALS", "SignalDef", "reference_signals", "signal_kinds"]


@dataclass(frozen=True)
class SignalDef:
    """A membership signal.

    Attributes:
        kind: ``black-box`` (outputs), ``white-box`` (weights and gradients) or ``reference`` (needs
            reference models).
        doc: one line: what the score is.
    """

    kind: Literal["black-box", "white-box", "reference"]
    doc: str


SIGNALS: Registry[SignalDef] = Registry("membership signal")
SIGNALS.register("loss", SignalDef("black-box", "minus the training loss of the example (loss threshold)"))
SIGNALS.register("confidence", SignalDef("black-box", "logit-scaled confidence log(p / (1 - p)) of its label"))
SIGNALS.register("gradient-norm", SignalDef("white-box", "minus the norm of the loss gradient in the weights"))
SIGNALS.register("subspace", SignalDef("white-box", "minus its distance to the first dense layer's training subspace"))
SIGNALS.register("lira-offline", SignalDef("reference", "LiRA: standardised confidence against the models "
                                                        "that did not train on it"))
SIGNALS.register("lira-online", SignalDef("reference", "LiRA: likelihood ratio of its confidence, models that "
                                                       "trained on it against those that did not"))
SIGNALS.register("rmia", SignalDef("reference", "RMIA: fraction of population samples it beats in the likelihood "
                                                "ratio (offline reference average)"))
SIGNALS.register("rmia-online", SignalDef("reference", "RMIA with the reference average over models that did and "
                                                       "did not train on it"))


def signal_kinds() -> dict[str, str]:
    """Signal name → kind, in registry order."""
    return {name: SIGNALS.get(name).kind for name in SIGNALS.names()}


class MIASettings(BaseModel):
    """Settings of the reference attacks.

    Attributes:
        variance_prior: LiRA: weight, in models, of the variance pooled over all candidates in each
            candidate's variance (0: per candidate only)
        rmia_a: RMIA's offline correction a of the reference average, in [0, 1]
        rmia_gamma: RMIA's likelihood-ratio threshold gamma against each population sample
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    variance_prior: float = Field(default=VARIANCE_PRIOR, ge=0)
    rmia_a: float = Field(default=0.3, ge=0, le=1)
    rmia_gamma: float = Field(default=1.0, gt=0)


def reference_signals(target: ExampleStatistics, target_population_loss: torch.Tensor, refs: object,
                      settings: MIASettings = MIASettings()) -> dict[str, torch.Tensor]:
    """The four reference signals of the target's statistics against K reference models.

    Args:
        target: the target's statistics on the N pool candidates.
        target_population_loss: (M,) the target's per-example loss on the population samples (log p = −ℓ).
        refs: the reference models' statistics (``confidence``, ``loss``, ``inside`` (K, N) and
            ``population_loss`` (K, M); :class:`datarecon.experiments.references.ReferenceStatistics`).
        settings: LiRA's variance prior, RMIA's a and γ.

    Returns:
        ``{"lira-offline", "lira-online", "rmia", "rmia-online"}`` → (N,) float64 scores.
    """
    inside = refs.inside  # type: ignore[attr-defined]
    conf, logp = refs.confidence, -refs.loss  # type: ignore[attr-defined]
    zlogp = -refs.population_loss  # type: ignore[attr-defined]
    vp = settings.variance_prior
    common = {"a": settings.rmia_a, "gamma": settings.rmia_gamma}
    return {
        "lira-offline": lira_offline(target.confidence, conf, inside, variance_prior=vp),
        "lira-online": lira_online(target.confidence, conf, inside, variance_prior=vp),
        "rmia": rmia(-target.loss, logp, inside, -target_population_loss, zlogp, online=False, **common),
        "rmia-online": rmia(-target.loss, logp, inside, -target_population_loss, zlogp, online=True, **common),
    }
