"""K independent attack runs against ONE target, stepped together (issue 12 item 4, issue 13 item 5).

Each run keeps everything a run executed alone has: its own x₀, λ₀ and generator, its own
optimiser buffers, its own early stop, NaN stop, checkpoint, ``history.jsonl`` and ``run.json``.
Each run is opened as :func:`datarecon.attacks.runner.run_attack` opens a single run, and the K
runs go through the one attack loop (:func:`datarecon.attacks.runner.drive`, no threads), so every
run directory, checkpoint and resume rule is the single-run one: a batch killed and resumed
continues each run from its own checkpoint, and a run directory written in a batch can be resumed
alone. The only shared thing is the step: every round, the loop asks for one step of every run
still going and computes those steps together:

* ``batched`` (:data:`MODES`): runs whose objective is the same (an attack's ``batch_key``: the
  KKT / DecoReco formulation, surrogate, α, λ_min, prior weights, dtype) get their gradients from
  one vmapped computation over a run axis (:func:`kkt_batched_residual_and_grads`); each run then
  commits its own optimiser step (``KKTAttack.apply_gradients``: its learning rates, its NaN
  check). Runs without a ``batch_key`` (gradnorm, bilevel, the compiled KKT step) are stepped one
  by one.
* ``looped``: every run takes its own ``attack.step`` in turn (exactly the single-run arithmetic).

A run that stops (early stop, divergence, its last step) leaves the loop; the others go on
with a smaller batch. The batch at every step is therefore the set of runs still going, sorted by
run index, so a resumed batch recomputes the same batches as an uninterrupted one.

References:
    Haim et al. (2022) eq. 5 and Buzaglo et al. (2023) (the KKT residual, per run);
    Runkel et al. (2024) §4.5 (the 25 landscape runs that share a target).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior, AttackSetup, Reconstruction, Target
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import Compute, OpenRun, StepRequest, drive, open_run, step_each
from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions

#: How the steps of a batch are computed (see the module docstring).
MODES: tuple[str, ...] = ("batched", "looped")

__all__ = ["MODES", "BatchMember", "kkt_batched_residual_and_grads", "run_batched"]


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


def _group_key(member: BatchMember, target: Target, state: Mapping[str, torch.Tensor]) -> tuple[Any, ...] | None:
    key_fn = getattr(member.attack, "batch_key", None)
    key = key_fn(target) if key_fn is not None else None
    batchable = getattr(member.attack, "batchable", None)
    if key is None or (batchable is not None and not batchable(member.prior)):
        return None
    from datarecon.attacks.runner import tensor_digest

    bounds = tensor_digest({"lower": torch.as_tensor(member.prior.lower), "upper": torch.as_tensor(member.prior.upper)})
    return (type(member.attack), key, tuple(state["x"].shape), bounds)


def _batched_kkt_gradients(target: Target, requests: Sequence[StepRequest], slots: Mapping[int, int] | None = None
                           ) -> list[tuple[StepRequest, dict[str, float], torch.Tensor, torch.Tensor]]:
    """Gradients of a group of KKT-family runs from one vmapped call (no state is changed here).

    ``slots`` (run index → position) fixes the batch layout: every run of the group always takes its
    own position in a batch of the group's full size, and the positions of runs that are not stepping
    now (finished, or ahead after a resume) are filled with a copy of a stepping run, whose results
    are discarded. A run's arithmetic then never depends on which other runs step with it (vmapped
    kernels differ in the last bits between batch sizes), so a batch resumed from checkpoints taken
    at different steps continues bit for bit as the uninterrupted one.
    """
    first = requests[0].run.attack
    prep = first.prepared(target)
    c = first.config
    positions = [slots[r.index] for r in requests] if slots is not None else list(range(len(requests)))
    layout: list[StepRequest] = [requests[0]] * (max(len(slots), len(requests)) if slots is not None else len(requests))
    for pos, r in zip(positions, requests, strict=True):
        layout[pos] = r
    x = torch.stack([r.run.state["x"].detach() for r in layout])
    lam = torch.stack([r.run.state["lambda"].detach() for r in layout])
    labels = torch.stack([r.run.attack.labels(r.run.setup.prior, x.device) for r in layout])
    terms, gx, gl = kkt_batched_residual_and_grads(prep.forward, prep.params, x, labels, lam,
                                                   objective=first.objective(target))
    lo, hi = first.bounds(requests[0].run.setup.prior, x.device)
    box, box_grad = kkt_math.box_value_and_grad(x.detach(), lo, hi, run_axis=True)
    terms["box"], terms["loss"] = box, terms["loss"] + c.box_weight * box
    if c.box_weight:
        gx = gx.add_(box_grad, alpha=c.box_weight)
    values = {k: v.detach().tolist() for k, v in terms.items()}
    return [(r, {k: float(v[j]) for k, v in values.items()}, gx[j], gl[j]) for j, r in zip(positions, requests)]


def _slots(members: Sequence[BatchMember], target: Target, mode: str
           ) -> tuple[dict[int, tuple[Any, ...] | None], dict[tuple[Any, ...], dict[int, int]]]:
    """Each run's group key (None: stepped alone) and, per group, each member's fixed batch position."""
    keys: dict[int, tuple[Any, ...] | None] = {
        k: _group_key(m, target, {"x": m.x0}) if mode == "batched" else None for k, m in enumerate(members)}
    slots: dict[tuple[Any, ...], dict[int, int]] = {}
    for k, key in keys.items():
        if key is not None:
            group = slots.setdefault(key, {})
            group[k] = len(group)
    return keys, slots


def _compute(target: Target, mode: str, members: Sequence[BatchMember]) -> Compute:
    """A round's step (:func:`~datarecon.attacks.runner.drive`): every request gets its metrics once
    its run's state has been updated.

    Batched groups compute all their gradients before any run commits, so a failure there changes
    no state; a run whose step was committed before a failure keeps it (its request has metrics),
    so every run's checkpoint stays consistent with its step count. A group is always computed at
    its full size, each run at its own position (:func:`_batched_kkt_gradients`).
    """

    keys, slots = _slots(members, target, mode)  # per run: fixed for its whole life

    def compute(batch: list[StepRequest]) -> None:
        groups: dict[tuple[Any, ...], list[StepRequest]] = {}
        single: list[StepRequest] = []
        for r in batch:
            key = keys[r.index]
            (single if key is None else groups.setdefault(key, [])).append(r)
        updates = [u for key, requests in groups.items() for u in _batched_kkt_gradients(target, requests, slots[key])]
        for r, metrics, gx, gl in sorted(updates, key=lambda u: u[0].index):
            r.metrics = r.run.attack.apply_gradients(target, r.run.state, metrics, gx, gl, prior=r.run.setup.prior)
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
        mode: ``batched`` (one vmapped gradient per group of runs with the same objective) or
            ``looped`` (each run's own step in turn); see :data:`MODES`.
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

    if mode not in MODES:
        raise DataReconError(f"unknown batch mode {mode!r}; valid modes: {', '.join(MODES)}")
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
        return drive(runs, _compute(target, mode, members))
