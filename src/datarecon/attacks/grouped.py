"""K runs coupled by a prior across runs (group consistency): each run its own step, one prior over all.

:mod:`datarecon.attacks.batched` hands a group of runs with one batch key to the attack's
``stacked_group``; every attack's step splits into a gradient (``step_gradients``) and an update
(``update``), so the default is a :class:`CoupledGroup`: every run's own gradient and metrics
(the single-run arithmetic), then the priors that read every run at once (``group``: each run pulled
toward the registered consensus of all), then every stepping run's own update. Nothing else is
shared: each run keeps its state, optimiser, checkpoint and history.

The group is computed at its full size (every row's gradient, finished rows' discarded), so a
round's arithmetic does not depend on which runs step in it. The coupling does depend on the other
runs' candidates, so the runs of a group resume from one step: each keeps its checkpoint before the
latest (:func:`datarecon.kernel.checkpoint.save`'s ``keep_previous``), and a group killed between two
runs' checkpoints of one round (or interrupted in the middle of a round) is first rolled back on disk
to the last step every run can start from (:func:`align_coupled`), then continues bit for bit as the
uninterrupted group. When the group has ended, the previous checkpoints are removed (:func:`end_coupled`).

References:
    Yin et al. (2021) "See through Gradients" (group consistency over restarts run together).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks import priors
from datarecon.errors import CheckpointError
from datarecon.kernel import checkpoint
from datarecon.kernel.files import CHECKPOINT_DIR
from datarecon.kernel.resume import Progress

__all__ = ["CROSS_RUN_PRIORS", "CoupledGroup", "align_coupled", "end_coupled"]

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
        given = priors.PriorInput(x, *first.bounds(prior, x.device), run_axis=True, target=target, labels=labels,
                                     public=prior.public)
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


def _generations(run_dir: Path) -> tuple[Progress | None, Progress | None]:
    """(latest, previous) progress of a run's checkpoints (None where there is none)."""
    folder = run_dir / CHECKPOINT_DIR
    found = [checkpoint.load(folder, kind=checkpoint.Kind.ATTACK, previous=p) for p in (False, True)]
    latest, previous = (None if f is None else Progress.from_meta(f[1], kind=checkpoint.Kind.ATTACK) for f in found)
    return latest, previous


def _common_step(gens: Sequence[tuple[Progress | None, Progress | None]]) -> int:
    """The last step every run of a group can resume from: a step each running run has a checkpoint at (0, the
    fresh start, always), and at which each finished run has one or had already ended."""
    def fits(step: int, latest: Progress | None, previous: Progress | None) -> bool:
        if step == 0 or any(g is not None and g.steps_done == step for g in (latest, previous)):
            return True
        return latest is not None and latest.status.finished and latest.steps_done <= step

    steps = {g.steps_done for pair in gens for g in pair if g is not None} | {0}
    return max(s for s in steps if all(fits(s, *pair) for pair in gens))


def align_coupled(run_dirs: Sequence[str | Path]) -> int:
    """Roll the checkpoints of a coupled group's runs back, on disk, to the last step every run can resume from
    (:func:`_common_step`): a run ahead of it makes its previous checkpoint the latest, or, at step 0, starts
    afresh (its checkpoint removed). A run that had ended at or before that step keeps its end. What is on disk
    is then one consistent state of the group, whatever was killed when.

    Returns:
        The step the group resumes from.

    Raises:
        CheckpointError: a run's checkpoint is unreadable (its own message).
    """
    dirs = [Path(d) for d in run_dirs]
    gens = [_generations(d) for d in dirs]
    step = _common_step(gens)
    for run_dir, (latest, previous) in zip(dirs, gens, strict=True):
        folder = run_dir / CHECKPOINT_DIR
        if latest is None or latest.steps_done == step or (latest.status.finished and latest.steps_done <= step):
            continue
        if previous is not None and previous.steps_done == step:
            checkpoint.promote_previous(folder)
        elif step == 0:
            checkpoint.remove(folder)
        else:  # cannot happen: _common_step chose a step this run has
            raise CheckpointError(f"{folder} has no checkpoint at step {step}; rerun with --overwrite")
    return step


def end_coupled(run_dirs: Sequence[str | Path]) -> None:
    """Remove the previous checkpoints of a coupled group whose runs have all ended: each run directory is then
    an ordinary one."""
    for run_dir in run_dirs:
        checkpoint.drop_previous(Path(run_dir) / CHECKPOINT_DIR)
