"""The reference models of one evaluation: how many (a fixed K checked before any is trained, or as many as a
time budget allows), trained or reused in its membership folder, and what they record.

``references.count: auto`` trains the first model(s) and times them, then climbs :data:`AUTO_COUNTS` while the
next count's remaining models, at the time per model measured so far, fit the budget; where not even the smallest
fits, one line says what they would cost and what they found elsewhere. A fixed K is refused before any model is
trained when LiRA's and RMIA's per-candidate fits cannot all work with it (:func:`references_needed`: the models'
subsets follow from the seed, so this is known in advance).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datarecon.errors import DataReconError
from datarecon.evaluation.membership import EXPECTED_GAIN
from datarecon.experiments.membership.candidates import Candidates
from datarecon.experiments.membership.case import MembershipCase
from datarecon.experiments.membership.reference_store import (KEPT_ALWAYS, POOL_FILE, ReferencePool,
                                                              finished_references, load_reference_model)
from datarecon.experiments.membership.reference_training import (ReferenceJob, refuse_other_models, subset,
                                                                 train_references, trained_times)
from datarecon.experiments.membership.settings import MembershipSettings, ReferenceSettings, Runtime
from datarecon.experiments.membership.signals import PseudoTargets

__all__ = ["AUTO_COUNTS", "MIN_PSEUDO_REFERENCES", "PSEUDO_TARGETS", "References", "case_references",
           "check_reference_count", "check_reference_folder", "reference_job", "references_needed"]

#: ``references.count: auto`` picks the largest of these counts whose estimated time fits the budget
AUTO_COUNTS = (16, 32, 64, 128, 256)
#: the most reference models :func:`references_needed` tries before it gives up
MAX_NEEDED_SEARCH = 2000
#: the fewest reference models that can take turns as pseudo-targets (one plays the target, two stay references)
MIN_PSEUDO_REFERENCES = 3
#: reference models taken in turn as pseudo-targets to choose the strongest signal (their weights are always kept)
PSEUDO_TARGETS = KEPT_ALWAYS


def _fits(in_count: np.ndarray, models: int) -> bool:
    """Whether LiRA's and RMIA's per-candidate fits are possible: some candidate in two models, some outside two."""
    return bool((in_count >= 2).any()) and bool(((models - in_count) >= 2).any())


def references_needed(classes: torch.Tensor, per_class: int | dict[int, int], *, seed: int, count: int,
                      eligible: np.ndarray | None = None) -> int | None:
    """The fewest reference models, ``count`` or more, whose training subsets (known before any is trained: they
    follow from the seed, :func:`~.reference_training.subset`) let every reference signal be fitted, also with each
    of the first :data:`PSEUDO_TARGETS` left out as a pseudo-target; None beyond :data:`MAX_NEEDED_SEARCH`.

    Raises:
        DataReconError: a task class with fewer eligible pool images than a model trains on.
    """
    n = int(classes.shape[0])
    first: list[np.ndarray] = []  # the models that play the target in turn (only these are left out)
    in_count = np.zeros(n, dtype=np.int64)
    for k in range(max(count, MAX_NEEDED_SEARCH)):
        row = np.zeros(n, dtype=np.int64)
        row[subset(classes, per_class, seed=seed, index=k, eligible=eligible)] = 1
        if k < PSEUDO_TARGETS:
            first.append(row)
        in_count += row
        models = k + 1
        if models < count or not _fits(in_count, models):
            continue
        if models < MIN_PSEUDO_REFERENCES or all(_fits(in_count - row, models - 1) for row in first):
            return models
    return None


def check_reference_count(cand: Candidates, count: int, seed: int) -> None:
    """Refuse, before any reference model is trained, a count K too small for LiRA's and RMIA's fits, naming the
    number needed, and a half-in pool that cannot be half in.

    Raises:
        DataReconError: K too small (with the fewest that suffice), or a class with too few non-members.
    """
    if not count:
        return
    if cand.shortfall:
        raise DataReconError(cand.shortfall)
    needed = references_needed(cand.classes, cand.per_class, seed=seed, count=count, eligible=cand.eligible)
    if needed == count:
        return
    fix = f"pass --references {needed} or more" if needed is not None else f"even {MAX_NEEDED_SEARCH} would not do"
    raise DataReconError(f"--references {count} is too few: LiRA and RMIA fit each candidate from the reference "
                         f"models that did and did not train on it (again with each of the first {PSEUDO_TARGETS} "
                         f"left out, to choose the strongest signal), which {count} models cannot do; {fix}")


@dataclass(frozen=True)
class References:
    """The reference models of an evaluation: their statistics (None when none were trained), the record printed
    and kept, what a choice of the strongest signal on them needs, and why the reference signals are missing."""

    stats: Any
    record: dict[str, Any] | None
    pseudo: PseudoTargets | None
    missing: str


def _pool(cand: Candidates) -> ReferencePool:
    return ReferencePool(x=cand.x, y=cand.y, classes=cand.classes, z_x=cand.z_x, z_y=cand.z_y,
                         eligible=torch.as_tensor(cand.eligible))


def _unchecked_job(case: MembershipCase, folder: Path, settings: ReferenceSettings, key: str) -> ReferenceJob:
    assert case.trainer is not None
    return ReferenceJob(out=folder, trainer=case.trainer, pool_key=key, settings=settings,
                        per_class=case.candidates.per_class)


def check_reference_folder(case: MembershipCase, folder: Path, settings: ReferenceSettings) -> None:
    """Refuse, before anything is written, a membership folder whose reference models this call cannot reuse and
    would replace: models of another pool (other draws or data), or finished models made with other settings
    (:func:`~.reference_training.refuse_other_models`).

    Raises:
        DataReconError: what the folder holds and the ways on.
    """
    key = _pool(case.candidates).fingerprint()
    if (folder / POOL_FILE).is_file() and ReferencePool.load(folder / POOL_FILE).fingerprint() != key:
        raise DataReconError(f"{folder} holds reference models of this model on another pool (other --nonmembers, "
                             "--population or --draw-seed, or other data); pass the same draws again, choose "
                             "another --out, or pass --overwrite to replace them")
    refuse_other_models(_unchecked_job(case, folder, settings, key))


def reference_job(case: MembershipCase, folder: Path, settings: ReferenceSettings) -> ReferenceJob:
    """The reference models' job in ``folder`` (its pool written there, or checked against the one it holds)."""
    pool = _pool(case.candidates)
    key = pool.fingerprint()
    check_reference_folder(case, folder, settings)
    if not (folder / POOL_FILE).is_file():
        pool.save(folder / POOL_FILE)
    return _unchecked_job(case, folder, settings, key)


def _auto_count(case: MembershipCase, folder: Path, settings: ReferenceSettings,
                runtime: Runtime) -> tuple[int | None, dict[str, Any]]:
    """``count: auto``: train the first model(s) (one per worker) and time them, then climb :data:`AUTO_COUNTS`: the
    next count is trained when its remaining models, at the time per model of the models trained last, fit what is
    left of the budget (the models' own training times, as their completion markers record them, on the workers
    given; on a machine whose load changes the estimate follows it, one count at a time); None when even the
    smallest does not fit, with the line that says what the reference models would cost and may gain."""
    workers = max(int(runtime.execution.workers or 1), 1)
    cand = case.candidates
    done = min(workers, AUTO_COUNTS[0])
    t0 = time.perf_counter()
    train_references(reference_job(case, folder, settings.fixed(done)), execution=runtime.execution,
                     device=runtime.device, log=runtime.log, progress=False)
    times = trained_times(folder, range(done)) or [time.perf_counter() - t0]
    first = per_model = float(np.median(times))
    budget = settings.budget_minutes * 60
    count = None
    for k in AUTO_COUNTS:
        k = max(k, references_needed(cand.classes, cand.per_class, seed=settings.seed, count=k,
                                     eligible=cand.eligible) or k)
        if (sum(times) + (k - done) * per_model) / workers > budget:
            break
        train_references(reference_job(case, folder, settings.fixed(k)), execution=runtime.execution,
                         device=runtime.device, log=runtime.log, progress=runtime.progress)
        latest = trained_times(folder, range(done, k))
        times += latest
        per_model = float(np.median(latest)) if latest else per_model
        count, done = k, k
    record = {"mode": "auto", "budget_minutes": settings.budget_minutes, "probe_models": min(workers, AUTO_COUNTS[0]),
              "workers": workers, "seconds_per_model": first, "counts_tried": list(AUTO_COUNTS),
              "wall_time_s": time.perf_counter() - t0}
    if count is not None:
        return count, record
    smallest = AUTO_COUNTS[0]
    minutes = smallest * first / workers / 60
    record["skipped"] = (f"reference attacks (LiRA, RMIA) not run: {smallest} reference models would take about "
                         f"{minutes:.1f} min ({first:.1f} s each, measured on the first {record['probe_models']}, on "
                         f"{workers} worker(s)), more than --budget-minutes {settings.budget_minutes:g}; "
                         f"{EXPECTED_GAIN}; pass --budget-minutes {math.ceil(minutes * 1.2)} or --references "
                         f"{smallest} --out DIR")
    return None, record


def _in_counts(inside: torch.Tensor, eligible: np.ndarray) -> dict[str, float]:
    """How many reference models each candidate of the half-in pool is IN for: mean, min, max, and the count K."""
    counts = inside[:, torch.as_tensor(eligible)].to(torch.float64).sum(0)
    return {"mean": float(counts.mean()), "min": float(counts.min()), "max": float(counts.max()),
            "models": int(inside.shape[0]), "candidates": int(eligible.sum())}


def case_references(case: MembershipCase, settings: MembershipSettings, folder: Path | None,
                    runtime: Runtime) -> References:
    """Train (or reuse) the reference models in ``folder``: ``settings.references.count`` of them, or with ``auto``
    as many as the budget allows; their statistics, record and what the choice on pseudo-targets needs."""
    ref = settings.references
    if ref.count == 0:
        return References(None, None, None, "not run: no reference models (--references K or auto)")
    if case.trainer is None:
        return References(None, None, None, f"not run: {case.no_trainer}")
    if case.candidates.shortfall:
        return References(None, None, None, f"not run: {case.candidates.shortfall}")
    assert folder is not None
    auto = None
    count = ref.count
    if ref.auto:
        before = set(finished_references(folder))  # what an earlier call left (the budget's climb trains the rest)
        count, auto = _auto_count(case, folder, ref, runtime)
        if count is None:
            return References(None, {"count": 0, "auto": auto}, None, auto["skipped"])
    stats = train_references(reference_job(case, folder, ref.fixed(count)), execution=runtime.execution,
                             device=runtime.device, log=runtime.log, progress=runtime.progress)
    if ref.auto:  # the climb trained them in this call, before the call above found them all finished
        stats = replace(stats, trained=stats.count - len(before & set(range(stats.count))))
    return References(stats, _record(case, ref, stats, auto),
                      _pseudo_targets(case, settings, stats, folder), "")


def _record(case: MembershipCase, ref: ReferenceSettings, stats: Any, auto: dict[str, Any] | None) -> dict[str, Any]:
    """What the result records of the reference models: how many, trained or reused, their pool and IN counts."""
    cand = case.candidates
    assert case.trainer is not None
    counts = _in_counts(stats.inside, cand.eligible)
    return {"count": stats.count, "trained": stats.trained, "reused": stats.count - stats.trained,
            "wall_time_s": stats.wall_time_s, "per_class": {str(k): v for k, v in cand.per_class.items()},
            "pool": int(cand.x.shape[0]), "half_in": int(cand.eligible.sum()), "seed": ref.seed,
            "pool_fingerprint": _pool(cand).fingerprint(), "in_models": counts, "auto": auto,
            "recipe": case.trainer.label,
            "note": (f"{stats.count} reference models trained with {case.trainer.label}, each on half of the "
                     f"{int(cand.eligible.sum())} candidates of the half-in pool (the members and as many "
                     f"non-members of each class): each of them is IN for {counts['mean']:.1f} of the "
                     f"{stats.count} models on average (min {counts['min']:.0f}, max {counts['max']:.0f}); the other "
                     f"{int((~cand.eligible).sum())} non-members are OUT for all of them")}


def _pseudo_targets(case: MembershipCase, settings: MembershipSettings, stats: Any, folder: Path) -> PseudoTargets:
    """What the choice of the strongest signal on the reference models needs (they play the target in turn)."""
    cand, trainer = case.candidates, case.trainer
    assert trainer is not None
    return PseudoTargets(refs=stats, attacks=settings.attacks, signals=(), pool_x=cand.x, pool_y=cand.y,
                         loss=trainer.loss, eligible=cand.eligible,
                         model_of=lambda r: load_reference_model(folder, r, trainer))
