"""The KKT / DecoReco step of K runs at once: one vmapped residual and gradient over a stacked state.

:meth:`datarecon.attacks.kkt.KKTAttack.stacked_group` hands :mod:`datarecon.attacks.batched` a
:class:`StackedGroup` for runs with one batch key; the batching driver itself knows no attack.

References:
    Haim et al. (2022) eq. 5 and Buzaglo et al. (2023) (the KKT residual, per run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.func import grad, vmap

from datarecon.attacks import kkt_math
from datarecon.attacks.base import Target, committed_metrics
from datarecon.attacks.optim import stacked_optimizer_step
from datarecon.attacks.priors import PriorInput, add_priors
from datarecon.attacks.runner import OpenRun, StepRequest

__all__ = ["StackedGroup", "kkt_batched_residual_and_grads"]


def kkt_batched_residual_and_grads(forward: kkt_math.ForwardFn, params: Mapping[str, torch.Tensor],
                                   x: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor, *,
                                   objective: kkt_math.KKTObjective
                                   ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """:func:`kkt_math.kkt_residual_and_grads` for K runs at once (one vmap over the run axis).

    Per run k: g_k = ∇_θ[(1/m) Σ_i out_i(x_ki, λ_ki; θ*)], R_k = ‖θ* − g_k‖², hinge_k = Σ_i
    relu(λ_min − λ_ki)², L_k = R_k + w_λ·hinge_k, and the gradients of L_k w.r.t. (x_k, λ_k). The
    runs share θ* and nothing else: since ∂L_j/∂x_k = 0 for j ≠ k, one backward of Σ_k L_k gives
    every run's own gradient (seeded by ∂R_k/∂g_k = −2(θ* − g_k) as in the single-run form).

    Args:
        forward: Φ(x; θ), x (m, C, H, W) → (m, k); must be usable under ``torch.func.vmap``/``grad``
            (plain ops or autograd.Functions with a vmap rule, e.g. ``attacks.surrogate``).
        params: θ* (name → tensor), shared by the runs.
        x: (K, m, C, H, W) candidates; labels: (K, m); lam: (K, m) multipliers.
        objective: the margin (a key of :data:`kkt_math.MARGINS`) and the hinge on λ (λ_min, w_λ;
            unused for signed-λ formulations); its w_box is not read (the caller adds the box prior).

    Returns:
        (``{"loss", "residual", "box" (zeros), "lambda_hinge"}`` as (K,) detached tensors,
        ∂L_k/∂x_k stacked (K, m, C, H, W), ∂L_k/∂λ_k stacked (K, m)).

    References:
        Haim et al. (2022) eq. 5; Buzaglo et al. (2023) (multiclass / regression margins).
    """
    entry = kkt_math.MARGINS.get(objective.margin)
    m = x.shape[1]

    def total(p: dict[str, torch.Tensor], xk: torch.Tensor, lk: torch.Tensor, yk: torch.Tensor) -> torch.Tensor:
        return entry.fn(forward(xk, p), yk, lk).sum() / m

    x = x.detach().requires_grad_(True)
    lam = lam.detach().requires_grad_(True)
    theta = {k: v.detach() for k, v in params.items()}
    g = vmap(grad(total), in_dims=(None, 0, 0, 0))(theta, x, lam, labels)
    terms, gx, gl = kkt_math.seeded_gradients(g, theta, x, lam, objective=objective, run_axis=True)
    terms["box"] = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    return terms, gx, gl



@dataclass
class StackedGroup:
    """Runs with the same objective, optimiser and state layout, held as ONE stacked state.

    Every entry of the runs' states (x, λ, the optimiser's buffers, ``opt.step``) is stacked on a
    leading run axis, and each run's own state dict holds views of its row: the run's checkpoint,
    NaN check, history and result read its row, and the group's step updates all rows in place.
    A run keeps its row for its whole life (finished runs keep theirs, unchanged), so the batched
    arithmetic of a run never depends on which runs step with it.

    Attributes:
        rows: run index (in the driven runs) → row.
        runs: the group's runs, in row order.
        state: the stacked state (name → (K, ...) tensor; ``opt.step`` (K,)).
        labels: (K, m) the runs' labels, as their attacks read them.
    """

    rows: dict[int, int]
    runs: list[OpenRun]
    state: dict[str, torch.Tensor]
    labels: torch.Tensor

    @classmethod
    def stack(cls, runs: Mapping[int, OpenRun]) -> StackedGroup:
        """Stack the runs' states (each run's restored or fresh state is copied into its row) and
        point each run's state at its row."""
        order = sorted(runs)
        members = [runs[k] for k in order]
        state = {key: torch.stack([r.state[key].detach() for r in members]) for key in members[0].state}
        for row, r in enumerate(members):
            for key in state:
                r.state[key] = state[key][row]
        x = state["x"]
        labels = torch.stack([r.attack.labels(r.setup.prior, x.device) for r in members])
        return cls({k: row for row, k in enumerate(order)}, members, state, labels)

    def gradients(self, target: Target) -> tuple[list[dict[str, float]], torch.Tensor, torch.Tensor]:
        """Every row's objective terms and gradients (∂L/∂x (K, m, C, H, W), ∂L/∂λ (K, m)) from one
        vmapped call over the stacked state (:func:`kkt_batched_residual_and_grads`; no state is changed)."""
        first = self.runs[0].attack
        prep = first.prepared(target)
        x, lam = self.state["x"].detach(), self.state["lambda"].detach()
        terms, gx, gl = kkt_batched_residual_and_grads(prep.forward, prep.params, x, self.labels, lam,
                                                       objective=first.kkt_objective(target))
        given = PriorInput(x, *first.bounds(self.runs[0].setup.prior, x.device), run_axis=True, target=target,
                           labels=self.labels, public=self.runs[0].setup.prior.public)
        terms, gx = add_priors(first.config, given, terms, gx)
        values = {k: v.detach().tolist() for k, v in terms.items()}
        return [{k: float(v[j]) for k, v in values.items()} for j in range(len(self.runs))], gx, gl

    def commit(self, target: Target, requests: Sequence[StepRequest], metrics: Sequence[dict[str, float]],
               gx: torch.Tensor, gl: torch.Tensor) -> None:
        """One optimiser step of the requested runs on the stacked state; each request gets its metrics.

        Per run as in :meth:`KKTAttack.update`: its own learning rates and step count, no update when its loss
        or its update is not finite (``update`` NaN). The rule is applied by
        :func:`~datarecon.attacks.optim.stacked_optimizer_step`.
        """
        first = self.runs[0].attack
        lambda_means = self.state["lambda"].mean(dim=1).tolist()  # every run's at once: one host sync
        taken: dict[int, dict[str, float]] = {}
        index: dict[int, int] = {}
        for r in requests:
            row = self.rows[r.index]
            index[row] = r.step
            taken[row] = r.run.attack.residual_metrics(target, r.run.setup.prior, dict(metrics[row]), r.run.state,
                                                       lambda_mean=lambda_means[row])
        rows = sorted(row for row, m in taken.items() if math.isfinite(m["loss"]))
        committed = set(stacked_optimizer_step(
            first.config.optimizer, self.state, {"x": gx, "lambda": gl},
            lrs=[r.attack.learning_rates(index.get(row, 0)) for row, r in enumerate(self.runs)], rows=rows,
            settings=first.config.optimizer_settings()))
        norms_x, norms_l = torch.stack([gx.flatten(1).norm(dim=1), gl.flatten(1).norm(dim=1)]).tolist()
        for r in requests:
            row = self.rows[r.index]
            if row not in rows:  # not finite: no step (NaNStop reads the loss)
                r.metrics = taken[row]
            else:
                norms = {"x": norms_x[row], "lambda": norms_l[row]} if row in committed else None
                r.metrics = committed_metrics(taken[row], norms)
