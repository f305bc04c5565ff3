"""K independent attack runs against ONE target, stepped together (issue 12 item 4, issue 13 item 5).

Each run keeps everything a run executed alone has: its own x₀, λ₀ and generator, its own
optimiser buffers, its own early stop, NaN stop, checkpoint, ``history.jsonl`` and ``run.json``.
Each run is driven by the ordinary :func:`datarecon.attacks.runner.run_attack` (one thread per run,
so every run directory, checkpoint and resume rule is the single-run one: a batch killed and
resumed continues each run from its own checkpoint, and a run directory written in a batch can be
resumed alone). The only shared thing is the step: a barrier waits until every run that is still
going has asked for its next step, then computes those steps together:

* ``batched`` (:data:`MODES`): runs whose objective is the same (an attack's ``batch_key``: the
  KKT / DecoReco formulation, surrogate, α, λ_min, prior weights, dtype) get their gradients from
  one vmapped computation over a run axis (:func:`kkt_batched_residual_and_grads`); each run then
  commits its own optimiser step (``KKTAttack.apply_gradients``: its learning rates, its NaN
  check). Runs without a ``batch_key`` (gradnorm, bilevel, the compiled KKT step) are stepped one
  by one.
* ``looped``: every run takes its own ``attack.step`` in turn (exactly the single-run arithmetic).

A run that stops (early stop, divergence, its last step) leaves the barrier; the others go on
with a smaller batch. The batch at every step is therefore the set of runs still going, sorted by
run index, so a resumed batch recomputes the same batches as an uninterrupted one.

References:
    Haim et al. (2022) eq. 5 and Buzaglo et al. (2023) (the KKT residual, per run);
    Runkel et al. (2024) §4.5 (the 25 landscape runs that share a target).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks import kkt_math
from datarecon.attacks.base import AttackerPrior, Reconstruction, Target
from datarecon.errors import DataReconError

#: How the steps of a batch are computed (see the module docstring).
MODES: tuple[str, ...] = ("batched", "looped")

__all__ = ["MODES", "BatchMember", "kkt_batched_residual_and_grads", "run_batched"]


# ---------------------------------------------------------------------------------------------
# math (pure)


def kkt_batched_residual_and_grads(forward: kkt_math.ForwardFn, params: Mapping[str, torch.Tensor],
                                   x: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor, *, margin: str,
                                   lambda_min: float, lambda_min_weight: float
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
        margin: a key of :data:`kkt_math.MARGINS`.
        lambda_min, lambda_min_weight: the hinge on λ (unused for signed-λ formulations).

    Returns:
        (``{"loss", "residual", "box" (zeros), "lambda_hinge"}`` as (K,) detached tensors,
        ∂L_k/∂x_k stacked (K, m, C, H, W), ∂L_k/∂λ_k stacked (K, m)).

    References:
        Haim et al. (2022) eq. 5; Buzaglo et al. (2023) (multiclass / regression margins).
    """
    from torch.func import grad, vmap

    entry = kkt_math.MARGINS.get(margin)
    m = x.shape[1]

    def total(p: dict[str, torch.Tensor], xk: torch.Tensor, lk: torch.Tensor, yk: torch.Tensor) -> torch.Tensor:
        return entry.fn(forward(xk, p), yk, lk).sum() / m

    x = x.detach().requires_grad_(True)
    lam = lam.detach().requires_grad_(True)
    theta = {k: v.detach() for k, v in params.items()}
    g = vmap(grad(total), in_dims=(None, 0, 0, 0))(theta, x, lam, labels)
    terms, gx, gl = kkt_math.seeded_gradients(g, theta, x, lam, margin=margin, lambda_min=lambda_min,
                                               lambda_min_weight=lambda_min_weight, run_axis=True)
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
class _Request:
    index: int
    member: BatchMember
    state: dict[str, torch.Tensor]
    step: int
    metrics: dict[str, float] | None = None
    done: bool = False
    failed: bool = False


class _Aborted(RuntimeError):
    """Raised in every run of a batch whose shared step failed (the cause is re-raised by run_batched)."""


class _StepBarrier:
    """Collects one step request from every run still going, then computes them together.

    Its lock is also the right to run: a run's thread holds it (:meth:`turn`) all the time except
    while it waits for a step, so the runs never execute at the same time (a model called with
    ``functional_call`` from two threads at once would see the other thread's parameters).
    """

    def __init__(self, live: int, compute: Callable[[list[_Request]], None]) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._live = live
        self._pending: list[_Request] = []
        self._compute = compute
        self.error: BaseException | None = None

    def turn(self) -> threading.Condition:
        """``with barrier.turn():`` runs the block holding the right to run (released while waiting)."""
        return self._cond

    def submit(self, request: _Request) -> dict[str, float]:
        with self._cond:
            self._pending.append(request)
            self._flush()
            while not request.done:
                self._cond.wait()
        if request.failed or request.metrics is None:
            raise _Aborted("the batched step failed")
        return request.metrics

    def abort(self, exc: BaseException) -> None:
        """Fail every later step (the caller was interrupted): the runs save their checkpoints and end."""
        with self._cond:
            if self.error is None:
                self.error = exc
            self._cond.notify_all()

    def leave(self) -> None:
        with self._cond:
            self._live -= 1
            self._flush()

    def _flush(self) -> None:  # lock held
        if not self._pending or len(self._pending) < self._live:
            return
        batch = sorted(self._pending, key=lambda r: r.index)
        self._pending = []
        try:
            if self.error is not None:
                raise _Aborted("an earlier batched step failed")
            self._compute(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to run_batched, which re-raises it
            if self.error is None:
                self.error = exc
            for r in batch:
                r.failed = r.metrics is None  # a run whose update was committed keeps its step
        for r in batch:
            r.done = True
        self._cond.notify_all()


class _MemberAttack:
    """The run's attack as run_attack sees it: everything delegated except ``step``, which waits
    for the batch (so name, config, resume hash and key, init and finish are the single run's)."""

    def __init__(self, index: int, member: BatchMember, barrier: _StepBarrier) -> None:
        self._index, self._member, self._barrier = index, member, barrier

    def __getattr__(self, name: str) -> Any:
        return getattr(self._member.attack, name)

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        return self._barrier.submit(_Request(self._index, self._member, state, index))


def _group_key(member: BatchMember, target: Target, state: Mapping[str, torch.Tensor]) -> tuple[Any, ...] | None:
    key_fn = getattr(member.attack, "batch_key", None)
    key = key_fn(target) if key_fn is not None else None
    batchable = getattr(member.attack, "batchable", None)
    if key is None or (batchable is not None and not batchable(member.prior)):
        return None
    from datarecon.attacks.runner import tensor_digest

    bounds = tensor_digest({"lower": torch.as_tensor(member.prior.lower), "upper": torch.as_tensor(member.prior.upper)})
    return (type(member.attack), key, tuple(state["x"].shape), bounds)


def _batched_kkt_gradients(target: Target, requests: Sequence[_Request], slots: Mapping[int, int] | None = None
                           ) -> list[tuple[_Request, dict[str, float], torch.Tensor, torch.Tensor]]:
    """Gradients of a group of KKT-family runs from one vmapped call (no state is changed here).

    ``slots`` (run index → position) fixes the batch layout: every run of the group always takes its
    own position in a batch of the group's full size, and the positions of runs that are not stepping
    now (finished, or ahead after a resume) are filled with a copy of a stepping run, whose results
    are discarded. A run's arithmetic then never depends on which other runs step with it (vmapped
    kernels differ in the last bits between batch sizes), so a batch resumed from checkpoints taken
    at different steps continues bit for bit as the uninterrupted one.
    """
    first = requests[0].member.attack
    prep = first.prepared(target)
    c = first.config
    positions = [slots[r.index] for r in requests] if slots is not None else list(range(len(requests)))
    layout: list[_Request] = [requests[0]] * (max(len(slots), len(requests)) if slots is not None else len(requests))
    for pos, r in zip(positions, requests, strict=True):
        layout[pos] = r
    x = torch.stack([r.state["x"].detach() for r in layout])
    lam = torch.stack([r.state["lambda"].detach() for r in layout])
    labels = torch.stack([r.member.attack.labels(r.member.prior, x.device) for r in layout])
    terms, gx, gl = kkt_batched_residual_and_grads(
        prep.forward, prep.params, x, labels, lam, margin=first.formulation(target), lambda_min=c.lambda_min,
        lambda_min_weight=c.lambda_min_weight)
    lo, hi = first.bounds(requests[0].member.prior, x.device)
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


def _compute(target: Target, mode: str, members: Sequence[BatchMember]) -> Callable[[list[_Request]], None]:
    """The barrier's step: every request gets its metrics once its run's state has been updated.

    Batched groups compute all their gradients before any run commits, so a failure there changes
    no state; a run whose step was committed before a failure keeps it (its request succeeds), so
    every run's checkpoint stays consistent with its step count. A group is always computed at its
    full size, each run at its own position (:func:`_batched_kkt_gradients`).
    """

    keys, slots = _slots(members, target, mode)  # per run: fixed for its whole life

    def compute(batch: list[_Request]) -> None:
        groups: dict[tuple[Any, ...], list[_Request]] = {}
        single: list[_Request] = []
        for r in batch:
            key = keys[r.index]
            (single if key is None else groups.setdefault(key, [])).append(r)
        updates = [u for key, requests in groups.items() for u in _batched_kkt_gradients(target, requests, slots[key])]
        for r, metrics, gx, gl in sorted(updates, key=lambda u: u[0].index):
            r.metrics = r.member.attack.apply_gradients(target, r.state, metrics, gx, gl, prior=r.member.prior)
        for r in single:
            r.metrics = r.member.attack.step(target, r.member.prior, r.state, r.step)

    return compute


def _stop(barrier: _StepBarrier, threads: Sequence[threading.Thread], exc: BaseException) -> None:
    """Abort the batch and wait for every started run to checkpoint and end (a second Ctrl-C waits too)."""
    barrier.abort(exc)
    for t in threads:  # runs that never started (the interrupt came while starting them) leave the barrier
        if t.ident is None:
            barrier.leave()
    for t in threads:
        while t.is_alive():
            try:
                t.join()
            except KeyboardInterrupt:  # the runs are already stopping; leaving now would lose their checkpoints
                continue


def run_batched(members: Sequence[BatchMember], target: Target, *, mode: str = "batched", steps: int | None = None,
                checkpoint_every: int = 100, resume: bool = False, progress: bool = True,
                log_every: int = 10) -> list[Reconstruction]:
    """Run K attacks against one target with their steps computed together; one result per run.

    Every run is :func:`~datarecon.attacks.runner.run_attack` with the member's own attack, prior,
    x₀, generator, run directory, seed, early stop and record, so each run's directory, history,
    checkpoint and resume are those of a single run (module docstring).

    Args:
        members: the K runs (K ≥ 1).
        target: the attacked model, shared by the runs.
        mode: ``batched`` (one vmapped gradient per group of runs with the same objective) or
            ``looped`` (each run's own step in turn); see :data:`MODES`.
        steps: total steps of every run (default: each attack's ``config.steps``).
        checkpoint_every, log_every: as in run_attack, for every run.
        resume: every run continues from its own checkpoint where it has one.
        progress: progress of the first run (the others run in step with it).

    Returns:
        The :class:`Reconstruction` of each run, in the order of ``members``.

    Raises:
        DataReconError: an unknown mode or no runs; any error of a run (the first one is re-raised
            after the other runs have finished or stopped).
    """
    from datarecon.attacks.runner import run_attack

    if mode not in MODES:
        raise DataReconError(f"unknown batch mode {mode!r}; valid modes: {', '.join(MODES)}")
    if not members:
        raise DataReconError("a batch needs at least one run")
    barrier = _StepBarrier(len(members), _compute(target, mode, members))
    results: list[Reconstruction | None] = [None] * len(members)
    errors: list[BaseException | None] = [None] * len(members)

    threads_per_op = torch.get_num_threads()  # intra-op threads are per OS thread: use the caller's

    def work(k: int) -> None:
        m = members[k]
        torch.set_num_threads(threads_per_op)
        with barrier.turn():
            try:
                results[k] = run_attack(_MemberAttack(k, m, barrier), target, m.prior, x0=m.x0,
                                        generator=m.generator, steps=steps, out=m.out,
                                        checkpoint_every=checkpoint_every, resume=resume,
                                        progress=progress and k == 0, log_every=log_every, seed=m.seed,
                                        early_stop=m.early_stop, record=dict(m.record))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread below
                errors[k] = exc
            finally:
                barrier.leave()

    # not daemon threads: the interpreter never shuts down under a run that is still writing (a
    # daemon thread writing its progress or checkpoint during finalisation aborts the process)
    threads = [threading.Thread(target=work, args=(k,), name=f"datarecon-run-{k}") for k in range(len(members))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException as exc:  # e.g. Ctrl-C: let the runs checkpoint and stop instead of running on
        _stop(barrier, threads, exc)
        raise
    if barrier.error is not None:
        raise barrier.error
    for exc in errors:
        if exc is not None:
            raise exc
    return [r for r in results if r is not None]
