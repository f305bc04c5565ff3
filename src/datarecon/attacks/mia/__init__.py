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
scores. Each :class:`SignalDef` computes its own score from a :class:`TargetView` or a
:class:`ReferenceView` (:func:`target_signals` and :func:`reference_signals` run every registered one),
so a signal of an installed package (entry-point group :data:`SIGNAL_PLUGINS`) is measured, tabled
and chosen from like a built-in one. Ground truth (who is a member) enters only
:mod:`datarecon.evaluation.membership`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from datarecon.attacks.mia.reference import VARIANCE_PRIOR, lira_offline, lira_online, rmia
from datarecon.attacks.mia.statistics import ExampleStatistics, gradient_norms
from datarecon.errors import DataReconError
from datarecon.registry import Registry

__all__ = ["MIASettings", "ReferenceView", "SIGNALS", "SIGNAL_PLUGINS", "SignalDef", "TargetView",
           "reference_signals", "signal_kinds", "target_signals"]


@dataclass(frozen=True)
class TargetView:
    """What a black-box or white-box signal reads of a model on N labelled candidates.

    Attributes:
        model: the network; params: its parameters by name (white-box); x: (N, ...) the candidates as model inputs;
            y: (N,) labels; loss: the training loss (a ``LOSSES`` name or a callable).
        stats: the model's :class:`~datarecon.attacks.mia.statistics.ExampleStatistics` on them (computed once).
    """

    model: nn.Module
    params: Mapping[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    loss: Any
    stats: ExampleStatistics


@dataclass(frozen=True)
class ReferenceView:
    """What a reference signal reads: the target's statistics on the N candidates and K reference models'.

    Attributes:
        target: the target's statistics on the candidates; population_loss: (M,) its loss on the population
            samples (RMIA's z).
        refs: the reference models' ``confidence``, ``loss`` and ``inside`` (K, N) and ``population_loss`` (K, M)
            (:class:`datarecon.experiments.references.ReferenceStatistics`).
        settings: the reference attacks' settings.
    """

    target: ExampleStatistics
    population_loss: torch.Tensor
    refs: Any
    settings: MIASettings


@dataclass(frozen=True)
class SignalDef:
    """A membership signal: what it needs and how it scores (higher = more likely a member).

    Attributes:
        kind: ``black-box`` (outputs), ``white-box`` (weights and gradients) or ``reference`` (needs
            reference models).
        doc: one line: what the score is.
        score: ``score(view) -> (N,)`` float64 scores, given a :class:`TargetView` (black-box, white-box) or a
            :class:`ReferenceView` (reference); None: computed by the evaluation itself from what only it holds
            (the ``subspace`` signal needs the first dense layer's analysis).
        online: it needs reference models that trained on the candidate (IN models): it is measured on the
            candidates the reference models train on, half of them IN each (LiRA's design), and not for images
            outside them.
        population: it needs population samples (RMIA's z): not measured without them.
    """

    kind: Literal["black-box", "white-box", "reference"]
    doc: str
    score: Callable[[Any], torch.Tensor] | None = None
    online: bool = False
    population: bool = False


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


def _rmia(view: ReferenceView, *, online: bool) -> torch.Tensor:
    r, s = view.refs, view.settings
    return rmia(-view.target.loss, -r.loss, r.inside, -view.population_loss, -r.population_loss, online=online,
                a=s.rmia_a, gamma=s.rmia_gamma)


SIGNALS: Registry[SignalDef] = Registry("membership signal")
SIGNALS.register("loss", SignalDef("black-box", "minus the training loss of the example (loss threshold)",
                                   score=lambda v: -v.stats.loss))
SIGNALS.register("confidence", SignalDef("black-box", "logit-scaled confidence log(p / (1 - p)) of its label",
                                         score=lambda v: v.stats.confidence))
SIGNALS.register("gradient-norm", SignalDef("white-box", "minus the norm of the loss gradient in the weights",
                                            score=lambda v: -gradient_norms(v.model, v.params, v.x, v.y,
                                                                            loss=v.loss)))
SIGNALS.register("subspace", SignalDef("white-box", "minus its distance to the first dense layer's training subspace"))
SIGNALS.register("lira-offline", SignalDef(
    "reference", "LiRA: standardised confidence against the models that did not train on it",
    score=lambda v: lira_offline(v.target.confidence, v.refs.confidence, v.refs.inside,
                                 variance_prior=v.settings.variance_prior)))
SIGNALS.register("lira-online", SignalDef(
    "reference", "LiRA: likelihood ratio of its confidence, models that trained on it against those that did not",
    score=lambda v: lira_online(v.target.confidence, v.refs.confidence, v.refs.inside,
                                variance_prior=v.settings.variance_prior), online=True))
SIGNALS.register("rmia", SignalDef("reference", "RMIA: fraction of population samples it beats in the likelihood "
                                                "ratio (offline reference average)",
                                   score=lambda v: _rmia(v, online=False), population=True))
SIGNALS.register("rmia-online", SignalDef("reference", "RMIA with the reference average over models that did and "
                                                       "did not train on it",
                                          score=lambda v: _rmia(v, online=True), online=True, population=True))

#: the entry-point group of membership-signal plug-ins: ``name = "package.module:SIGNAL"`` (a :class:`SignalDef`)
SIGNAL_PLUGINS = "datarecon.membership_signals"


def _plugin_signal(name: str, obj: object) -> str:
    """Why an entry point's object cannot be the membership signal ``name`` ("" when it can)."""
    if not isinstance(obj, SignalDef):
        return f"{obj!r} is not a datarecon.attacks.mia.SignalDef"
    return "" if obj.score is not None else "its SignalDef has no score function"


SIGNALS.use_entry_points(SIGNAL_PLUGINS, check=_plugin_signal)


def signal_kinds() -> dict[str, str]:
    """Signal name → kind, in registry order."""
    return {name: SIGNALS.get(name).kind for name in SIGNALS.names()}


def target_signals(view: TargetView, *, kinds: tuple[str, ...] = ("black-box", "white-box")) -> dict[str, torch.Tensor]:
    """Every registered signal of the given kinds that scores itself, on the candidates of ``view``.

    Returns:
        name → (N,) float64 scores, in registry order.
    """
    out = {}
    for name in SIGNALS.ordered():
        sig = SIGNALS.get(name)
        if sig.kind in kinds and sig.score is not None:
            out[name] = _scores(name, sig.score(view), len(view.y))
    return out


def _scores(name: str, scores: Any, n: int) -> torch.Tensor:
    """A signal's scores as (N,) float64 on the CPU, or one line naming the signal when they are not one number per
    candidate (a plug-in's score function may return anything)."""
    if not isinstance(scores, torch.Tensor) or scores.numel() != n:
        what = f"{tuple(scores.shape)} scores" if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise DataReconError(f"membership signal {name!r} returned {what} for {n} candidates; its score function must "
                             "return a tensor of one score per candidate")
    return scores.to(torch.float64).reshape(-1).cpu()


def reference_signals(target: ExampleStatistics, target_population_loss: torch.Tensor, refs: object,
                      settings: MIASettings = MIASettings(), *, online: bool = True) -> dict[str, torch.Tensor]:
    """Every registered reference signal of the target's statistics against K reference models.

    Args:
        target: the target's statistics on the N pool candidates.
        target_population_loss: (M,) the target's per-example loss on the population samples (log p = −ℓ).
        refs: the reference models' statistics (``confidence``, ``loss``, ``inside`` (K, N) and
            ``population_loss`` (K, M); :class:`datarecon.experiments.references.ReferenceStatistics`).
        settings: LiRA's variance prior, RMIA's a and γ.
        online: also the signals that need IN models (False: only those that read the models that did not train
            on a candidate, e.g. for images outside the reference models' pool).

    Returns:
        name → (N,) float64 scores (``lira-offline``, ``lira-online``, ``rmia``, ``rmia-online`` and any plug-in's);
        without population samples (M = 0) not those that need them.
    """
    view = ReferenceView(target=target, population_loss=target_population_loss, refs=refs, settings=settings)
    out = {}
    has_population = target_population_loss.numel() > 0
    for name in SIGNALS.ordered():
        sig = SIGNALS.get(name)
        if (sig.kind == "reference" and sig.score is not None and (online or not sig.online)
                and (has_population or not sig.population)):
            out[name] = _scores(name, sig.score(view), int(target.confidence.numel()))
    return out
