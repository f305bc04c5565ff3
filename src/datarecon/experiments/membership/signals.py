"""Every membership signal of an evaluation's candidates, each scored by its own registry entry.

The registry (:data:`datarecon.attacks.mia.SIGNALS`) declares what each signal needs; this module only gathers
those inputs (:class:`~datarecon.attacks.mia.SignalView`: the target's statistics and weights, its first dense
layer's subspace where that layer reads the images, the reference models' statistics and the population's loss)
and lets :func:`~datarecon.attacks.mia.measure_signals` score every signal whose needs are met, saying for each
other one which need is missing. The same holds for a reference model playing the target
(:func:`pseudo_scores`), whose subspace is analysed as the target's was (:func:`reference_analysis`), so a new
signal is one registry entry: it is scored, tabled, chosen from and ranked without a line here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from datarecon.attacks.knowledge import KnowledgeSettings
from datarecon.attacks.mia import SIGNALS, MIASettings, SignalView, measure_signals
from datarecon.attacks.mia.statistics import ExampleStatistics, example_statistics
from datarecon.attacks.subspace import analyse
from datarecon.experiments.membership.case import MembershipCase
from datarecon.experiments.membership.trainers import reference_config
from datarecon.models.spec import build_model, first_layer_init_std

__all__ = ["FEW_IN_MODELS", "PseudoTargets", "SignalScores", "case_signals", "pseudo_scores", "reference_analysis"]

#: the online signals are flagged when the candidates of the half-in pool are IN for fewer models than this on average
FEW_IN_MODELS = 8
#: why the population signals are missing where the reference models are there
NO_POPULATION = "not measured: it needs population samples, and none were given"


@dataclass(frozen=True)
class SignalScores:
    """Every signal's score of N candidates (higher = member), where each is measured, and the signals that do not
    apply.

    Attributes:
        scores: name → (N,) float64 numpy array (values outside the signal's scope are not read).
        not_applicable: name → why (e.g. ``subspace`` on a CNN, the reference signals without references).
        scope: name → (N,) bool, the candidates the signal is measured on (absent: all of them); the online signals
            are measured on the half-in pool.
        notes: name → a caveat printed beside its line (e.g. few IN models).
    """

    scores: dict[str, np.ndarray]
    not_applicable: dict[str, str]
    scope: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)

    def where(self, name: str, n: int) -> np.ndarray:
        """(N,) bool: the candidates ``name`` is measured on."""
        return self.scope.get(name, np.ones(n, dtype=bool))


def case_signals(case: MembershipCase, attacks: MIASettings, refs: Any, *, missing: str = "",
                 mean_in: float = 0.0) -> SignalScores:
    """Every registered signal of the case's candidates whose needs are met, each with the candidates it is measured
    on (an online signal: the half-in pool, flagged below :data:`FEW_IN_MODELS` IN models per candidate).

    Args:
        case: the model and its candidates.
        attacks: the reference attacks' settings.
        refs: the reference models' statistics
            (:class:`~datarecon.experiments.membership.reference_store.ReferenceStatistics`), or None.
        missing: why there are no reference models (said of the reference signals).
        mean_in: how many reference models each candidate of the half-in pool is IN for, on average.
    """
    setup, cand = case.setup, case.candidates
    target = setup.target
    x = setup.inputs(cand.x)
    stats = example_statistics(target.model, x, cand.y, loss=target.loss, params=target.params)
    z = None
    if refs is not None:
        z = example_statistics(target.model, setup.inputs(cand.z_x), cand.z_y, loss=target.loss, params=target.params)
    view = SignalView(model=target.model, params=target.params, x=x, y=cand.y, loss=target.loss, stats=stats,
                      analysis=setup.subspace, refs=refs, population_loss=None if z is None else z.loss,
                      settings=attacks)
    measured, absent = measure_signals(view, why={"subspace": setup.subspace_note(), "references": missing,
                                                  "in-models": missing, "population": NO_POPULATION})
    scores = {k: v.numpy() for k, v in measured.items()}
    scope, notes = {}, {}
    for name in scores:
        if SIGNALS.get(name).online:
            scope[name] = cand.eligible
            if mean_in < FEW_IN_MODELS:
                notes[name] = (f"few IN models: each candidate is IN for {mean_in:.1f} reference models on "
                               f"average (fewer than {FEW_IN_MODELS}), so its IN Gaussian leans on the pooled "
                               "variance; more --references")
    return SignalScores(scores=scores, not_applicable=absent, scope=scope, notes=notes)


@dataclass(frozen=True)
class PseudoTargets:
    """What :func:`~datarecon.experiments.membership.choice.pseudo_target_choice` needs: the reference models and
    how the target's signals were made.

    Attributes:
        refs: the K reference models' statistics (``confidence``, ``loss``, ``inside``, ``population_loss``,
            ``select``; :class:`~datarecon.experiments.membership.reference_store.ReferenceStatistics`).
        attacks: the reference attacks' settings.
        signals: the names of the target's signals (only these compete).
        pool_x: (N, ...) the pool images, as the reference models take them after their own input shift;
            pool_y: (N,) their labels; loss: the training loss.
        eligible: (N,) bool, the half-in pool (where the online signals are measured).
        model_of: ``r -> (model, input shift)`` of reference model r (kept for the first pseudo-targets).
        analysis_of: ``(model, params, dtype, r) -> analysis``: the first dense layer's subspace of reference
            model r as the target's was made (its knowledge, :func:`reference_analysis`); None: the signals that
            need it are not measured on the pseudo-targets and do not compete.
    """

    refs: Any
    attacks: MIASettings
    signals: tuple[str, ...]
    pool_x: torch.Tensor
    pool_y: torch.Tensor
    loss: Any
    eligible: np.ndarray
    model_of: Callable[[int], tuple[torch.nn.Module, torch.Tensor]]
    analysis_of: Callable[..., Any] | None = None


def pseudo_scores(p: PseudoTargets, r: int) -> dict[str, np.ndarray]:
    """Every competing signal whose needs are met with reference model ``r`` as the target and the others as its
    references."""
    refs = p.refs
    stats = ExampleStatistics(loss=refs.loss[r], probability=torch.exp(-refs.loss[r]), confidence=refs.confidence[r])
    model, shift = p.model_of(r)
    dtype = next(model.parameters()).dtype
    x = (p.pool_x - shift).to(dtype)
    params = {k: v.detach() for k, v in model.named_parameters()}
    wanted = set(p.signals)
    analysis = None
    if p.analysis_of is not None and any("subspace" in SIGNALS.get(k).requires for k in wanted):
        analysis = p.analysis_of(model, params, dtype, r)
    others = refs.select([k for k in range(refs.count) if k != r])
    view = SignalView(model=model, params=params, x=x, y=p.pool_y, loss=p.loss, stats=stats, analysis=analysis,
                      refs=others, population_loss=refs.population_loss[r], settings=p.attacks)
    scores, _ = measure_signals(view, only=wanted)
    return {k: v.numpy() for k, v in scores.items()}


def reference_analysis(config: Any, knowledge: KnowledgeSettings, seed: int) -> Callable[..., Any]:
    """``(model, params, dtype, r) -> analysis``: the first dense layer's subspace of reference model r as the
    attacker analysed the target's: with its n, and with θ_init when the attacker knows the target's (for its own
    model that is the initialisation it drew)."""
    arch = config.arch_spec()

    def analysis(model: torch.nn.Module, params: dict[str, torch.Tensor], dtype: torch.dtype, r: int) -> Any:
        known = None
        if knowledge.known_init is not None:
            init_seed = reference_config(config, seed=seed, index=r, device="cpu").seed
            init = build_model(arch, generator=torch.Generator().manual_seed(init_seed), dtype=dtype)
            known = {k: v.detach() for k, v in init.named_parameters()}
        return analyse(model, params, known_init=known, n=knowledge.n, fit_coefficient=config.weight_decay > 0,
                       init_std=None if known is not None else first_layer_init_std(arch),
                       generator=torch.Generator().manual_seed(0))

    return analysis
