"""K runs coupled by a prior across runs (group consistency): each run its own step, one prior over all.

:mod:`datarecon.attacks.batched` hands a group of runs with one batch key to the attack's
``stacked_group``; every attack's step splits into a gradient (``step_gradients``) and an update
(``update``), so the default is a :class:`CoupledGroup`: every run's own gradient and metrics
(the single-run arithmetic), then the priors that read every run at once (``group``: each run pulled
toward the registered consensus of all), then every stepping run's own update. Nothing else is
shared: each run keeps its state, optimiser, checkpoint and history.

The group is computed at its full size (every row's gradient, finished rows' discarded), so a
round's arithmetic does not depend on which runs step in it. The coupling does depend on the other
runs' candidates: a batch killed between two runs' checkpoints of one round resumes each run from
its own checkpoint, and the rounds it replays see the others one checkpoint apart (docs/RELIABILITY.md).

References:
    Yin et al. (2021) "See through Gradients" (group consistency over restarts run together).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from datarecon.attacks import priors

__all__ = ["CROSS_RUN_PRIORS", "CoupledGroup"]

#: priors that read every run of a group at once (applied by :class:`CoupledGroup`, not by a run's own step)
CROSS_RUN_PRIORS = ("group",)


@dataclass
class CoupledGroup:
    """Runs coupled by the cross-run priors.

    Attributes:
        rows: run index (in the driven runs) → row.
        runs: the group's opened runs (:class:`datarecon.attacks.runner.OpenRun`), in row order.
    """

    rows: dict[int, int]
    runs: list[Any]

    @classmethod
    def of(cls, runs: Mapping[int, Any]) -> CoupledGroup:
        order = sorted(runs)
        return cls({k: row for row, k in enumerate(order)}, [runs[k] for k in order])

    def gradients(self, target: Any) -> tuple[list[Any]]:
        """Every row's :class:`~datarecon.attacks.base.Gradients`: its own (``attack.step_gradients``) plus the
        cross-run priors (their values in its terms, their gradients in its gradient in x)."""
        rows = [r.attack.step_gradients(target, r.setup.prior, r.state) for r in self.runs]
        metrics = [g.terms for g in rows]
        grads = [g.grads for g in rows]
        first, prior = self.runs[0].attack, self.runs[0].setup.prior
        x = torch.stack([r.state["x"].detach() for r in self.runs])
        labels = torch.stack([r.attack.labels(r.setup.prior, x.device) for r in self.runs])
        loss = torch.tensor([m["loss"] for m in metrics], dtype=x.dtype, device=x.device)
        gx = torch.stack([g["x"] for g in grads])
        skip = tuple(n for n in priors.PRIORS.ordered() if n not in CROSS_RUN_PRIORS)
        given = priors.PriorInput(x, *first.bounds(prior, x.device), run_axis=True, target=target, labels=labels)
        terms, gx = priors.add_priors(first.config, given, {"loss": loss}, gx, skip=skip)
        values = {k: v.tolist() for k, v in terms.items()}
        for j, (m, g) in enumerate(zip(metrics, grads, strict=True)):
            m.update({k: float(v[j]) for k, v in values.items()})
            g["x"] = gx[j]
        return (rows,)

    def commit(self, target: Any, requests: Sequence[Any], rows: Sequence[Any]) -> None:
        """Each requested run's own update (``attack.update``) of its row's gradients."""
        for r in requests:
            g = rows[self.rows[r.index]]
            g = replace(g, terms=dict(g.terms))
            r.metrics = r.run.attack.update(target, r.run.setup.prior, r.run.state, g, r.step)
