"""K independent attack runs against ONE target, stepped together (issue 12 item 4, issue 13 item 5).

Each run keeps everything a run executed alone has: its own x₀, λ₀ and generator, its own
optimiser buffers, its own early stop, NaN stop, checkpoint, ``history.jsonl`` and ``run.json``.
Each run is opened as :func:`datarecon.attacks.runner.run_attack` opens a single run, and the K
runs go through the one attack loop (:func:`datarecon.attacks.runner.drive`, no threads), so every
run directory, checkpoint and resume rule is the single-run one: a batch killed and resumed
continues each run from its own checkpoint, and a run directory written in a batch can be resumed
alone. The only shared thing is the step: every round, the loop asks for one step of every run
still going and computes those steps together:

* ``batched`` (:data:`MODES`): runs whose objective, optimiser and state layout are the same (an
  attack's ``batch_key``: the KKT / DecoReco formulation, surrogate, α, λ_min, prior weights,
  dtype; the optimiser and its settings; the state's names and shapes) are ONE stacked state
  (:class:`StackedGroup`): x, λ, the optimiser's buffers and ``opt.step`` with a leading run
  axis, each run's state holding views of its row. The group's gradients come from one vmapped
  computation over the stack (:func:`kkt_batched_residual_and_grads`) and its update from one call
  of the update rule (:func:`datarecon.attacks.optim.stacked_optimizer_step`: each run its own
  learning rates, step count and NaN check, element for element the single run's update). Runs
  without a ``batch_key`` (gradnorm, bilevel, the compiled KKT step) are stepped one by one.
* ``looped``: every run takes its own ``attack.step`` in turn (exactly the single-run arithmetic).

A run that stops (early stop, divergence, its last step) leaves the loop and keeps its row, unchanged;
the others go on. A group is always computed at its full size (the rows that do not step are
discarded), so a run's arithmetic never depends on which runs step with it and a batch resumed from
checkpoints taken at different steps continues bit for bit as the uninterrupted one.

References:
    Haim et al. (2022) eq. 5 and Buzaglo et al. (2023) (the KKT residual, per run);
    Runkel et al. (2024) §4.5 (the 25 landscape runs that share a target).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior, AttackSetup, Reconstruction, Target
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.optim import stacked_optimizer_step
from datarecon.attacks.runner import Compute, OpenRun, StepRequest, drive, open_run, step_each
from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions

#: How the steps of a batch are computed (see the module docstring).
MODES: tuple[str, ...] = ("batched", "looped")
#: ``auto`` per device kind: on CPU the batched gradient measured slower than the runs one by one
#: (benchmarks/bench_batched_runs.py, docs/PERFORMANCE.md §8.1: 1.13-1.32 of the runs alone), so
#: the runs are looped there; on a GPU batching saves the per-step launches of K − 1 runs (an
#: extrapolation, §8.1). Devices it does not list are batched.
AUTO_MODE: dict[str, str] = {"cpu": "looped", "cuda": "batched"}
#: What a caller may ask for: a mode of :data:`MODES`, or ``auto`` (:func:`resolve_mode`).
MODE_CHOICES: tuple[str, ...] = ("auto", *MODES)


def resolve_mode(mode: str, device: str | torch.device) -> str:
    """The mode of :data:`MODES` that ``mode`` (a key of :data:`MODE_CHOICES`) names on ``device``.

    Raises:
        DataReconError: an unknown mode.
    """
    if mode not in MODE_CHOICES:
        raise DataReconError(f"unknown batch mode {mode!r}; valid modes: {', '.join(MODE_CHOICES)}")
    if mode != "auto":
        return mode
    return AUTO_MODE.get(str(device).split(":", 1)[0], "batched")


__all__ = ["AUTO_MODE", "MODES", "MODE_CHOICES", "BatchMember", "StackedGroup", "kkt_batched_residual_and_grads",
           "resolve_mode", "run_batched", "stack_groups"]


# ---------------------------------------------------------------------------------------------
# math (pure)


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
    from torch.func import grad, vmap

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


# ---------------------------------------------------------------------------------------------
# the runs


@dataclass(frozen=True)
class BatchMember:
    """One run of a batch: what :func:`datarecon.attacks.runner.run_attack` takes for a single run.

    Attributes:
        attack: the run's attack (its own config: learning rates may differ between runs).
        prior: labels (m,) and pixel box; runs share a batched step only with the same m and box.
        x0: (m, C, H, W) initial candidates.
        generator: the run's own randomness (λ₀); its state is checkpointed with the run.
        out: the run directory, or None to write nothing.
        seed: recorded in run.json.
        early_stop: the run's own attacker-side stop criterion (or None).
        record: extra run.json fields (e.g. the mixture weights of a landscape point).
    """

    attack: Any
    prior: AttackerPrior
    x0: torch.Tensor
    generator: torch.Generator
    out: str | Path | None = None
    seed: int | None = None
    early_stop: Callable[[dict[str, float]], bool] | None = None
    record: Mapping[str, Any] = field(default_factory=dict)


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
                                                       objective=first.objective(target))
        lo, hi = first.bounds(self.runs[0].setup.prior, x.device)
        box, box_grad = kkt_math.box_value_and_grad(x, lo, hi, run_axis=True)
        weight = first.config.box_weight
        terms["box"], terms["loss"] = box, terms["loss"] + weight * box
        if weight:
            gx = gx.add_(box_grad, alpha=weight)
        values = {k: v.detach().tolist() for k, v in terms.items()}
        return [{k: float(v[j]) for k, v in values.items()} for j in range(len(self.runs))], gx, gl

    def commit(self, target: Target, requests: Sequence[StepRequest], metrics: Sequence[dict[str, float]],
               gx: torch.Tensor, gl: torch.Tensor) -> None:
        """One optimiser step of the requested runs on the stacked state; each request gets its metrics.

        Per run as in :meth:`KKTAttack.apply_gradients`: its own learning rates and step count, no
        update when its loss or its update is not finite (``update`` NaN). The rule is applied by
        :func:`~datarecon.attacks.optim.stacked_optimizer_step`.
        """
        from datarecon.attacks.kkt import committed_metrics

        first = self.runs[0].attack
        lambda_means = self.state["lambda"].mean(dim=1).tolist()  # every run's at once: one host sync
        taken: dict[int, dict[str, float]] = {}
        for r in requests:
            row = self.rows[r.index]
            taken[row] = r.run.attack.step_metrics(target, r.run.state, dict(metrics[row]), prior=r.run.setup.prior,
                                                   lambda_mean=lambda_means[row])
        rows = sorted(row for row, m in taken.items() if math.isfinite(m["loss"]))
        committed = set(stacked_optimizer_step(
            first.config.optimizer, self.state, {"x": gx, "lambda": gl},
            lrs=[r.attack.learning_rates() for r in self.runs], rows=rows, settings=first.config.optimizer_settings()))
        norms_x, norms_l = torch.stack([gx.flatten(1).norm(dim=1), gl.flatten(1).norm(dim=1)]).tolist()
        for r in requests:
            row = self.rows[r.index]
            if row not in rows:  # not finite: no step (NaNStop reads the loss)
                r.metrics = taken[row]
            else:
                norms = {"x": norms_x[row], "lambda": norms_l[row]} if row in committed else None
                r.metrics = committed_metrics(taken[row], norms)


def _group_key(run: OpenRun, target: Target) -> tuple[Any, ...] | None:
    """Runs with equal keys form one :class:`StackedGroup` (None: the run is stepped alone)."""
    attack, prior = run.attack, run.setup.prior
    key_fn = getattr(attack, "batch_key", None)
    key = key_fn(target) if key_fn is not None else None
    batchable = getattr(attack, "batchable", None)
    if key is None or (batchable is not None and not batchable(prior)):
        return None
    from datarecon.attacks.runner import tensor_digest

    bounds = tensor_digest({"lower": torch.as_tensor(prior.lower), "upper": torch.as_tensor(prior.upper)})
    layout = tuple((name, tuple(t.shape), str(t.dtype), str(t.device)) for name, t in sorted(run.state.items()))
    c = attack.config
    return (type(attack), key, c.optimizer, c.optimizer_settings(), layout, bounds)


def stack_groups(runs: Sequence[OpenRun | BaseException], target: Target) -> dict[int, StackedGroup]:
    """Group the opened runs by :func:`_group_key` and stack each group's states; run index → its group."""
    members: dict[tuple[Any, ...], dict[int, OpenRun]] = {}
    for k, run in enumerate(runs):
        if isinstance(run, OpenRun):
            key = _group_key(run, target)
            if key is not None:
                members.setdefault(key, {})[k] = run
    groups = [StackedGroup.stack(group) for group in members.values()]
    return {k: g for g in groups for k in g.rows}


def _compute(target: Target, mode: str, runs: Sequence[OpenRun | BaseException]) -> Compute:
    """A round's step (:func:`~datarecon.attacks.runner.drive`): every request gets its metrics once
    its run's state has been updated.

    ``batched``: each :class:`StackedGroup` computes its gradients at its full size (every row, the
    rows that do not step now discarded) before any group commits, so a failure there changes no
    state; then each group commits its step at once (a failure in one group's commit leaves the
    groups committed before it one step ahead, every checkpoint consistent with its step count).
    Runs without a group take their own ``attack.step``. ``looped``: every run its own step.
    """
    group_of = stack_groups(runs, target) if mode == "batched" else {}

    def compute(batch: list[StepRequest]) -> None:
        stepping: dict[int, list[StepRequest]] = {}
        groups: dict[int, StackedGroup] = {}
        single: list[StepRequest] = []
        for r in batch:
            group = group_of.get(r.index)
            if group is None:
                single.append(r)
            else:
                groups[id(group)] = group
                stepping.setdefault(id(group), []).append(r)
        results = {gid: group.gradients(target) for gid, group in groups.items()}
        for gid, group in groups.items():
            group.commit(target, stepping[gid], *results[gid])
        step_each(single)

    return compute


def run_batched(members: Sequence[BatchMember], target: Target, *, mode: str = "batched", steps: int | None = None,
                loop: LoopOptions = ATTACK_LOOP) -> list[Reconstruction]:
    """Run K attacks against one target with their steps computed together; one result per run.

    Every run is opened as :func:`~datarecon.attacks.runner.run_attack` opens one (the member's own
    attack, prior, x₀, generator, run directory, seed, early stop and record) and the K runs go
    through the single-run loop (:func:`~datarecon.attacks.runner.drive`) together, so each run's
    directory, history, checkpoint and resume are those of a single run (module docstring).

    Args:
        members: the K runs (K ≥ 1).
        target: the attacked model, shared by the runs.
        mode: ``batched`` (one vmapped gradient and one update per group of runs with the same
            objective), ``looped`` (each run's own step in turn; see :data:`MODES`) or ``auto``
            (:func:`resolve_mode` on the device of the target's parameters).
        steps: total steps of every run (default: each attack's ``config.steps``).
        loop: as in run_attack, for every run (``resume``: every run continues from its own
            checkpoint where it has one); the progress display is the first run's (the others run
            in step with it).

    Returns:
        The :class:`Reconstruction` of each run, in the order of ``members``.

    Raises:
        DataReconError: an unknown mode or no runs; any error of a run (the first one is re-raised
            after the other runs have finished or stopped).
    """
    from contextlib import ExitStack

    from datarecon.utils.lock import hold

    mode = resolve_mode(mode, next(iter(target.params.values())).device if target.params else "cpu")
    if not members:
        raise DataReconError("a batch needs at least one run")
    with ExitStack() as locks:
        runs: list[OpenRun | BaseException] = []
        for k, m in enumerate(members):
            setup = AttackSetup(target, m.prior, m.x0, m.generator, {"seed": m.seed, **m.record})
            try:
                if m.out is not None:
                    locks.enter_context(hold(m.out))
                runs.append(open_run(m.attack, setup, steps=steps, out=m.out, early_stop=m.early_stop,
                                     loop=loop if k == 0 else replace(loop, progress=False)))
            except Exception as exc:  # noqa: BLE001 - raised after the other runs (drive)
                runs.append(exc)
        return drive(runs, _compute(target, mode, runs))
