"""K independent attack runs against ONE target, stepped together.

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
  (the attack's :meth:`~datarecon.attacks.base.Attack.stacked_group`): x, λ, the optimiser's buffers and ``opt.step`` with a leading run
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

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import ATTACK_LOOP, AttackerPrior, AttackSetup, Reconstruction, Target
from datarecon.attacks.grouped import align_coupled, end_coupled
from datarecon.attacks.runner import Compute, OpenRun, StepRequest, drive, open_run, step_each, tensor_digest
from datarecon.errors import DataReconError
from datarecon.kernel.engine import LoopOptions
from datarecon.utils.lock import hold

#: How the steps of a batch are computed (see the module docstring).
MODES: tuple[str, ...] = ("batched", "looped")
#: ``auto`` per device kind: on CPU the batched gradient measured slower than the runs one by one
#: (benchmarks/bench_batched_runs.py, docs/PERFORMANCE.md §6.1: 1.13-1.32 of the runs alone), so
#: the runs are looped there; on a GPU batching saves the per-step launches of K − 1 runs (an
#: extrapolation, §6.1). Devices it does not list are batched.
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


__all__ = ["AUTO_MODE", "MODES", "MODE_CHOICES", "BatchMember", "resolve_mode", "run_batched", "stack_groups"]


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


def group_key(run: OpenRun, target: Target) -> tuple[Any, ...] | None:
    """Runs with equal keys share one stacked step (None: the run is stepped alone): the attack's own
    :meth:`~datarecon.attacks.base.Attack.batch_key` with the state's layout and the pixel box."""
    attack, prior = run.attack, run.setup.prior
    key = attack.batch_key(target, prior)
    if key is None:
        return None
    bounds = tensor_digest({"lower": torch.as_tensor(prior.lower), "upper": torch.as_tensor(prior.upper)})
    layout = tuple((name, tuple(t.shape), str(t.dtype), str(t.device)) for name, t in sorted(run.state.items()))
    return (type(attack), key, layout, bounds)


def stack_groups(runs: Sequence[OpenRun | BaseException], target: Target) -> dict[int, Any]:
    """Group the opened runs by :func:`group_key` and stack each group's states (the attack's
    :meth:`~datarecon.attacks.base.Attack.stacked_group`); run index → its group."""
    members: dict[tuple[Any, ...], dict[int, OpenRun]] = {}
    for k, run in enumerate(runs):
        if isinstance(run, OpenRun):
            key = group_key(run, target)
            if key is not None:
                members.setdefault(key, {})[k] = run
    groups = [next(iter(group.values())).attack.stacked_group(group) for group in members.values()]
    return {k: g for g in groups for k in g.rows}


def _compute(target: Target, mode: str, runs: Sequence[OpenRun | BaseException]) -> Compute:
    """A round's step (:func:`~datarecon.attacks.runner.drive`): every request gets its metrics once
    its run's state has been updated.

    ``batched``: each stacked group computes its gradients at its full size (every row, the
    rows that do not step now discarded) before any group commits, so a failure there changes no
    state; then each group commits its step at once (a failure in one group's commit leaves the
    groups committed before it one step ahead, every checkpoint consistent with its step count).
    Runs without a group take their own ``attack.step``. ``looped``: every run its own step.
    """
    group_of = stack_groups(runs, target) if mode == "batched" else {}

    def compute(batch: list[StepRequest]) -> None:
        stepping: dict[int, list[StepRequest]] = {}
        groups: dict[int, Any] = {}
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
    mode = resolve_mode(mode, next(iter(target.params.values())).device if target.params else "cpu")
    if not members:
        raise DataReconError("a batch needs at least one run")
    coupled = [Path(m.out) for m in members if m.out is not None and m.attack.coupled()]
    with ExitStack() as locks:
        held: dict[int, BaseException] = {}
        for k, m in enumerate(members):
            try:
                if m.out is not None:
                    locks.enter_context(hold(m.out))
            except Exception as exc:  # noqa: BLE001 - raised after the other runs (drive)
                held[k] = exc
        if coupled and loop.resume and not held:  # a coupled group resumes from one step (attacks/grouped.py)
            align_coupled(coupled)
        runs: list[OpenRun | BaseException] = []
        for k, m in enumerate(members):
            setup = AttackSetup(target, m.prior, m.x0, m.generator, {"seed": m.seed, **m.record})
            try:
                if k in held:
                    raise held[k]
                runs.append(open_run(m.attack, setup, steps=steps, out=m.out, early_stop=m.early_stop,
                                     loop=loop if k == 0 else replace(loop, progress=False)))
            except Exception as exc:  # noqa: BLE001 - raised after the other runs (drive)
                runs.append(exc)
        results = drive(runs, _compute(target, mode, runs))
        end_coupled(coupled)
        return results
