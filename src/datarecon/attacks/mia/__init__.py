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
scores. Every signal is one registry entry (:class:`SignalDef`): what it needs (:data:`NEEDS`: the
target's outputs, its weights, the first dense layer's subspace, reference models, reference models that
trained on the candidate, population samples), how it scores from a :class:`SignalView` that holds
those inputs, and its rank in the rule fixed in advance (:func:`ranked`). :func:`measure_signals` scores
every registered signal whose needs a view meets and says, for each other one, which need is missing, so
a signal of an installed package (entry-point group :data:`SIGNAL_PLUGINS`) is measured, tabled, ranked
and chosen from like a built-in one. Ground truth (who is a member) enters only
:mod:`datarecon.evaluation.membership`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from datarecon.attacks.mia.reference import VARIANCE_PRIOR, lira_offline, lira_online, rmia
from datarecon.attacks.mia.statistics import ExampleStatistics, gradient_norms
from datarecon.attacks.subspace import subspace_scores
from datarecon.errors import DataReconError
from datarecon.registry import Registry

__all__ = ["DEFAULT_RANK", "KIND_NEEDS", "MIASettings", "NEEDS", "SIGNALS", "SIGNAL_PLUGINS", "SignalDef",
           "SignalView", "measure_signals", "ranked", "signal_kinds"]

#: what a signal may need, each in words (the vocabulary of :attr:`SignalDef.needs`)
NEEDS: dict[str, str] = {
    "outputs": "the target's outputs on the candidates",
    "weights": "the target's weights (gradients in them)",
    "subspace": "the first dense layer's training subspace, where that layer reads the inputs",
    "references": "reference models trained with the target's recipe",
    "in-models": "reference models that trained on the candidate (LiRA's half-in pool)",
    "population": "population samples (RMIA's z)",
}
#: what every signal of a kind needs (a signal's own ``needs`` add to these)
KIND_NEEDS: dict[str, tuple[str, ...]] = {"black-box": ("outputs",), "white-box": ("outputs", "weights"),
                                          "reference": ("outputs", "references")}
#: the rank of a signal that declares none (a plug-in's): after every built-in one, ties broken by name
DEFAULT_RANK = 100


@dataclass(frozen=True)
class SignalView:
    """Everything a signal may read of a model on N labelled candidates; a signal reads only what its needs name.

    Attributes:
        model: the network; params: its parameters by name (``weights``); x: (N, ...) the candidates as model
            inputs; y: (N,) labels; loss: the training loss (a ``LOSSES`` name or a callable).
        stats: the model's :class:`~datarecon.attacks.mia.statistics.ExampleStatistics` on them (``outputs``).
        analysis: the :class:`~datarecon.attacks.subspace.SubspaceAnalysis` of its first dense layer where that
            layer reads the inputs, else None (``subspace``).
        refs: K reference models' ``confidence``, ``loss`` and ``inside`` (K, N) and ``population_loss`` (K, M)
            (:class:`datarecon.experiments.membership.reference_store.ReferenceStatistics`), or None
            (``references``; ``in-models`` where some model trained on some candidate).
        population_loss: (M,) the model's loss on the population samples (RMIA's z), or None (``population``
            where M > 0).
        settings: the reference attacks' settings.
    """

    model: nn.Module
    params: Mapping[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    loss: Any
    stats: ExampleStatistics
    analysis: Any = None
    refs: Any = None
    population_loss: torch.Tensor | None = None
    settings: MIASettings | None = None

    def available(self) -> dict[str, bool]:
        """Each need of :data:`NEEDS`: whether this view meets it."""
        refs = self.refs is not None
        return {"outputs": True, "weights": True, "subspace": self.analysis is not None, "references": refs,
                "in-models": refs and bool(self.refs.inside.any()),
                "population": self.population_loss is not None and self.population_loss.numel() > 0}


@dataclass(frozen=True)
class SignalDef:
    """A membership signal: what it needs, how it scores (higher = more likely a member) and its rank.

    Attributes:
        kind: ``black-box`` (outputs), ``white-box`` (weights and gradients) or ``reference`` (needs
            reference models); what it needs at least (:data:`KIND_NEEDS`).
        doc: one line: what the score is.
        score: ``score(view) -> (N,)`` scores from a :class:`SignalView` (read only what the signal needs); a
            plug-in without one is not registered.
        needs: what it needs beyond its kind's (names of :data:`NEEDS`): ``subspace``, ``in-models`` (it is then
            measured on the candidates the reference models train on, half of them IN each, LiRA's design, and
            not for images outside them), ``population``.
        rank: its place in the rule fixed in advance, which picks the strongest signal where nothing is measured
            to choose on and breaks ties of the choice (lower first; ties by name): the strongest attacks of the
            literature first.
    """

    kind: Literal["black-box", "white-box", "reference"]
    doc: str
    score: Callable[[SignalView], torch.Tensor] | None = None
    needs: tuple[str, ...] = ()
    rank: int = DEFAULT_RANK

    def __post_init__(self) -> None:
        unknown = [n for n in self.needs if n not in NEEDS]
        if self.kind not in KIND_NEEDS or unknown:
            what = f"kind {self.kind!r}" if self.kind not in KIND_NEEDS else f"needs {unknown}"
            raise DataReconError(f"a SignalDef with {what}: kinds are {', '.join(KIND_NEEDS)}; needs are "
                                 f"{', '.join(NEEDS)}")

    @property
    def requires(self) -> tuple[str, ...]:
        """Everything it needs: its kind's needs, then its own."""
        return tuple(dict.fromkeys(KIND_NEEDS[self.kind] + tuple(self.needs)))

    @property
    def online(self) -> bool:
        """Whether it needs IN models (measured on the half-in pool only)."""
        return "in-models" in self.requires

    @property
    def population(self) -> bool:
        """Whether it needs population samples."""
        return "population" in self.requires


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


def _settings(view: SignalView) -> MIASettings:
    return view.settings if view.settings is not None else MIASettings()


def _lira(view: SignalView, *, online: bool) -> torch.Tensor:
    r, prior = view.refs, _settings(view).variance_prior
    fit = lira_online if online else lira_offline
    return fit(view.stats.confidence, r.confidence, r.inside, variance_prior=prior)


def _rmia(view: SignalView, *, online: bool) -> torch.Tensor:
    r, s = view.refs, _settings(view)
    return rmia(-view.stats.loss, -r.loss, r.inside, -view.population_loss, -r.population_loss, online=online,
                a=s.rmia_a, gamma=s.rmia_gamma)


def _subspace(view: SignalView) -> torch.Tensor:
    return subspace_scores(view.model, view.params, view.analysis, view.x)


SIGNALS: Registry[SignalDef] = Registry("membership signal")
SIGNALS.register("loss", SignalDef("black-box", "minus the training loss of the example (loss threshold)",
                                   score=lambda v: -v.stats.loss, rank=5))
SIGNALS.register("confidence", SignalDef("black-box", "logit-scaled confidence log(p / (1 - p)) of its label",
                                         score=lambda v: v.stats.confidence, rank=6))
SIGNALS.register("gradient-norm", SignalDef("white-box", "minus the norm of the loss gradient in the weights",
                                            score=lambda v: -gradient_norms(v.model, v.params, v.x, v.y,
                                                                            loss=v.loss), rank=7))
SIGNALS.register("subspace", SignalDef("white-box", "minus its distance to the first dense layer's training subspace",
                                       score=_subspace, needs=("subspace",), rank=4))
SIGNALS.register("lira-offline", SignalDef(
    "reference", "LiRA: standardised confidence against the models that did not train on it",
    score=lambda v: _lira(v, online=False), rank=3))
SIGNALS.register("lira-online", SignalDef(
    "reference", "LiRA: likelihood ratio of its confidence, models that trained on it against those that did not",
    score=lambda v: _lira(v, online=True), needs=("in-models",), rank=0))
SIGNALS.register("rmia", SignalDef("reference", "RMIA: fraction of population samples it beats in the likelihood "
                                                "ratio (offline reference average)",
                                   score=lambda v: _rmia(v, online=False), needs=("population",), rank=2))
SIGNALS.register("rmia-online", SignalDef("reference", "RMIA with the reference average over models that did and "
                                                       "did not train on it",
                                          score=lambda v: _rmia(v, online=True), needs=("in-models", "population"),
                                          rank=1))

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


def ranked(names: Iterable[str]) -> list[str]:
    """Signal names in the order of the rule fixed in advance: by each signal's declared rank, ties by name.

    Raises:
        DataReconError: a name that is not a registered signal.
    """
    return sorted(names, key=lambda k: (SIGNALS.get(k).rank, k))


def measure_signals(view: SignalView, *, why: Mapping[str, str] | None = None,
                    only: Collection[str] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every registered signal whose needs ``view`` meets, each scored by its own entry, in registry order.

    Args:
        view: what the signals may read.
        why: need → why the view does not meet it (said of the signals that need it; default: the need in
            words, :data:`NEEDS`).
        only: measure only these signals (None: all).

    Returns:
        (name → (N,) float64 scores on the CPU, name → why it is not measured: its first unmet need).

    Raises:
        DataReconError: a signal whose score is not one number per candidate, or that has no score function.
    """
    have, why = view.available(), dict(why or {})
    scores: dict[str, torch.Tensor] = {}
    missing: dict[str, str] = {}
    for name in SIGNALS.ordered():
        if only is not None and name not in only:
            continue
        sig = SIGNALS.get(name)
        lacking = [n for n in sig.requires if not have[n]]
        if lacking:
            missing[name] = why.get(lacking[0]) or f"not measured: it needs {NEEDS[lacking[0]]}"
        elif sig.score is None:
            raise DataReconError(f"membership signal {name!r} has no score function; give its SignalDef a score")
        else:
            scores[name] = _scores(name, sig.score(view), len(view.y))
    return scores, missing


def _scores(name: str, scores: Any, n: int) -> torch.Tensor:
    """A signal's scores as (N,) float64 on the CPU, or one line naming the signal when they are not one number per
    candidate (a plug-in's score function may return anything)."""
    if not isinstance(scores, torch.Tensor) or scores.numel() != n:
        what = f"{tuple(scores.shape)} scores" if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise DataReconError(f"membership signal {name!r} returned {what} for {n} candidates; its score function must "
                             "return a tensor of one score per candidate")
    return scores.to(torch.float64).reshape(-1).cpu()
