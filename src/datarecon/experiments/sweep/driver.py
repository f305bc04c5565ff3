"""The sweep driver: expand, skip finished runs, fan out to a backend, retry, index.

Only the driver writes the store index (``index.sqlite``) and the task records (``task.json``);
workers write their own run directories. Re-running the same sweep resumes it: runs whose
``run.json`` says ``complete`` (or ``diverged`` / ``stopped-early``: re-running would repeat them)
are skipped, and unfinished runs continue from their checkpoints.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datarecon.errors import DataReconError
from datarecon.experiments.backends import Backend, Outcome, Task, make_backend
from datarecon.experiments.execution import Execution
from datarecon.experiments.pool import criterion_mode, score_of
from datarecon.experiments.reconstruct import TargetRecord
from datarecon.experiments.sweep.runs import validate_spec
from datarecon.experiments.store import FINISHED, TASK_FILE, Store, row_from_dir
from datarecon.experiments.sweep.config import RunSpec, SweepConfig, expand
from datarecon.experiments.sweep.worker import CLAIM_FILE, execute_task
from datarecon.kernel.engine import LoopState, ProgressBar
from datarecon.kernel.files import RUN_JSON
from datarecon.kernel.outdir import ARTEFACTS, check_out_dir, claim_out_dir, is_empty
from datarecon.kernel.status import Status
from datarecon.models.checkpoint import model_identity, read_model_meta
from datarecon.utils.io import atomic_write_json, config_hash, read_json

FAULTS_ENV = "DATARECON_SWEEP_FAULTS"


@dataclass(frozen=True)
class PlannedRun:
    """A run of the sweep with its key and directory."""

    key: str
    spec: RunSpec
    run_dir: Path


@dataclass
class SweepResult:
    """Summary of one sweep invocation.

    Attributes:
        sweep_id: hash of the sweep config and target model.
        out: the store directory.
        total: runs in the sweep; skipped: already finished before this invocation;
        completed: finished now; failed: recorded as failed after retries;
        retries: extra attempts spent; best_key / best_score: by the selection criterion;
        wall_time_s: of this invocation; backend: backend description.
    """

    sweep_id: str
    out: Path
    total: int
    skipped: int = 0
    completed: int = 0
    failed: int = 0
    retries: int = 0
    best_key: str | None = None
    best_score: float | None = None
    criterion: str = ""
    wall_time_s: float = 0.0
    backend: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def plan(config: SweepConfig, out: str | Path) -> tuple[str, list[PlannedRun]]:
    """The sweep id and its runs (deduplicated by key, expansion order kept; every spec validated)."""
    store = Store(out)
    model_dir = str(Path(config.model_dir).expanduser().resolve())
    try:
        model_id = model_identity(model_dir)
    except DataReconError as exc:  # in the sweep file's words: model_dir, not the --model of reconstruct
        raise type(exc)(f"model_dir of the sweep file: {exc}".replace("pass the model directory",
                                                                         "set model_dir to the model directory")) from None
    meta = read_model_meta(model_dir)
    target = TargetRecord(fine_tuned=isinstance(meta.get("pretrained"), dict),
                          n_train=(meta.get("metrics") or {}).get("n_train"),
                          input_shape=tuple(meta["arch"]["input_shape"]),
                          batch_norm=bool(meta["arch"].get("batch_norm", False)))
    runs: list[PlannedRun] = []
    seen: set[str] = set()
    for spec in expand(config, model_dir=model_dir):
        validate_spec(spec, target)
        key = config_hash(spec.identity(model_id=model_id))
        if key in seen:
            continue
        seen.add(key)
        runs.append(PlannedRun(key=key, spec=spec, run_dir=store.run_dir(key)))
    sweep_id = config_hash({"sweep": config.model_dump(mode="json", exclude={"model_dir"}), "model": model_id})
    return sweep_id, runs


def _faults() -> dict[int, dict[str, int]]:
    """Test-only fault injection: ``DATARECON_SWEEP_FAULTS='{"<run index>": {"attempts": 1, "at_step": 3}}'``."""
    text = os.environ.get(FAULTS_ENV)
    if not text:
        return {}
    return {int(k): v for k, v in json.loads(text).items()}


def check_store_dir(out: Path) -> None:
    """Refuse a ``--out`` that is a file, another datarecon artefact or a non-empty foreign folder
    (a sweep writes a results store, and a rerun into the same store resumes it).

    Raises:
        DataReconError: one line naming the problem.
    """
    check_out_dir(out, kind="store", resume=True)
    kind = ARTEFACTS.get("store")
    if out.is_dir() and not is_empty(out) and not kind.recognises(out):
        foreign = kind.foreign(out)
        held = f" (it holds {foreign[0]!r})" if foreign else ""
        raise DataReconError(f"--out {out} is not a results store{held}; choose a new or empty folder for the sweep")


def read_task(run_dir: Path) -> dict[str, Any] | None:
    """The driver's record ``task.json`` of a run (None when absent or unreadable)."""
    path = run_dir / TASK_FILE
    if not path.is_file():
        return None
    try:
        task = read_json(path)
    except DataReconError:
        return None
    return task if isinstance(task, dict) else None


def next_attempt(task: dict[str, Any] | None) -> int:
    """The attempt index to submit next for an unfinished run, from its record: counts survive a
    driver restart. An attempt still marked ``running`` was cut short by the driver's own death
    (not the run's fault) and is continued under the same index; after a failure the count moves on,
    so a rerun gives a failed run one more attempt."""
    if not task:
        return 0
    try:
        started = int(task.get("attempts") or 0)
    except (TypeError, ValueError):
        return 0
    return max(0, started - 1) if task.get("status") == Status.RUNNING else max(0, started)


def is_finished(run_dir: Path) -> bool:
    path = run_dir / RUN_JSON
    if not path.is_file():
        return False
    try:
        return read_json(path).get("status") in FINISHED
    except DataReconError:
        return False


def run_sweep(config: SweepConfig, out: str | Path, *, execution: Execution = Execution(), progress: bool = True,
              checkpoint_every: int = 100) -> SweepResult:
    """Run (or resume) a sweep into the store ``out``.

    Args:
        config: the sweep.
        out: store directory (created); several sweeps may share one store, one at a time: a sweep
            holds the store's lock (:mod:`datarecon.utils.lock`), and a second one is refused naming it.
        execution: where the runs execute (:class:`~datarecon.experiments.execution.Execution`): the
            backend (``local``, ``ray``); workers = runs in flight (local: processes, default 1 = in the
            driver process; ray: default the cluster's CPU count); the Ray cluster address (None =
            embedded instance); extra backend options (e.g. ``{"num_cpus": 2}`` for embedded Ray); torch
            threads per run in worker processes (default: ``resources.num_cpus``).
        progress: show a bar over runs with the best-so-far selection score.
        checkpoint_every: steps between run checkpoints (bounds the work lost by a crash).

    Returns:
        A :class:`SweepResult`; failed runs are counted there and recorded in the store, not raised.

    Raises:
        DataReconError: a bad sweep or model (nothing written), an unusable ``out``, or a Ray address
            without the ``ray`` backend.
    """
    out = Path(out)
    check_store_dir(out)
    with claim_out_dir(out, kind="store", resume=True) as claim:
        sweep_id, runs = plan(config, out)  # a bad sweep file or model: nothing written
        claim.prepare()
        return _run_sweep(config, out, sweep_id=sweep_id, runs=runs, execution=execution, progress=progress,
                          checkpoint_every=checkpoint_every)


@dataclass
class _Driver:
    """The driver's state during one sweep invocation: it alone writes the index and the task records.

    Attributes:
        config: the sweep.
        out: the store directory.
        sweep_id: the sweep's id (:func:`plan`).
        store: the store's index.
        result: the summary being filled in.
        mode: ``min`` | ``max``, the direction of the selection criterion ``result.criterion``.
        execution: where the runs execute (its ``threads`` go into each task).
        checkpoint_every: steps between run checkpoints.
        attempts: run key → the attempt index to submit next (unfinished runs).
        faults: test-only fault injection per run index (:func:`_faults`).
    """

    config: SweepConfig
    out: Path
    sweep_id: str
    store: Store
    result: SweepResult
    mode: str
    execution: Execution
    checkpoint_every: int
    attempts: dict[str, int] = field(default_factory=dict)
    faults: dict[int, dict[str, int]] = field(default_factory=dict)

    def better(self, a: float, b: float | None) -> bool:
        return b is None or (a < b if self.mode == "min" else a > b)

    def note_best(self, key: str, res: dict[str, Any] | None) -> None:
        s = score_of(res, self.result.criterion)
        if s is not None and self.better(s, self.result.best_score):
            self.result.best_score, self.result.best_key = s, key

    def record(self, r: PlannedRun, *, status: str, attempt: int, error: str | None = None) -> None:
        """Write the run's ``task.json``."""
        # attempts = attempts started so far (this one included); cumulative over driver restarts
        atomic_write_json(r.run_dir / TASK_FILE, {
            "key": r.key, "sweep_id": self.sweep_id, "status": status, "attempts": attempt + 1, "error": error,
            "spec": r.spec.model_dump(mode="json"), "updated": time.time()})

    def skip_finished(self, runs: list[PlannedRun]) -> deque[PlannedRun]:
        """Count and index the runs finished before this invocation; the others, with their next attempt."""
        todo: deque[PlannedRun] = deque()
        finished_rows = []
        for r in runs:
            task = read_task(r.run_dir)
            if is_finished(r.run_dir):
                self.result.skipped += 1
                if task is not None and task.get("status") == Status.RUNNING:  # finished, never booked
                    atomic_write_json(r.run_dir / TASK_FILE, {**task, "status": "done"})
                row = row_from_dir(r.run_dir, root=self.out)
                if row is not None:
                    finished_rows.append(row)
                    self.note_best(r.key, row)
            else:
                self.attempts[r.key] = next_attempt(task)
                todo.append(r)
        self.store.upsert_runs(finished_rows)
        return todo

    def submit(self, be: Backend, r: PlannedRun, attempt: int) -> None:
        """Record attempt ``attempt`` of run ``r`` as running and hand it to the backend."""
        config = self.config
        payload = {"key": r.key, "spec": r.spec.model_dump(mode="json"), "run_dir": str(r.run_dir),
                   "attempt": attempt, "claim_file": str(r.run_dir / CLAIM_FILE),
                   "num_threads": None if getattr(be, "in_process", False) else (
                       self.execution.threads or max(1, int(config.resources.num_cpus))),
                   "checkpoint_every": self.checkpoint_every}
        if r.spec.index in self.faults:
            payload["fault"] = self.faults[r.spec.index]
        r.run_dir.mkdir(parents=True, exist_ok=True)
        self.record(r, status=Status.RUNNING, attempt=attempt)
        be.submit(Task(key=r.key, payload=payload, attempt=attempt, num_cpus=config.resources.num_cpus,
                       num_gpus=config.resources.num_gpus))

    def handle(self, be: Backend, oc: Outcome, r: PlannedRun) -> None:
        """Book an outcome: index a finished run, resubmit a crashed one, or record it as failed."""
        attempt = oc.task.attempt
        if oc.ok:
            self.record(r, status="done", attempt=attempt)
            self.result.completed += 1
            self.note_best(r.key, oc.result)
        elif not oc.charged:
            self.submit(be, r, attempt)  # collateral interruption: same attempt again
            return
        elif oc.retryable and attempt < self.config.max_retries:
            self.attempts[r.key] = attempt + 1
            self.result.retries += 1
            self.submit(be, r, attempt + 1)
            return
        else:
            self.record(r, status="failed", attempt=attempt, error=oc.error)
            self.result.failed += 1
            self.result.failures[r.key] = oc.error or "failed"
        row = row_from_dir(r.run_dir, root=self.out)
        if row is not None:
            self.store.upsert_runs([row])


def _advance(bar: ProgressBar, state: LoopState, result: SweepResult) -> None:
    """One more run booked: a step of the progress bar with the failures and the best score so far."""
    state.step += 1
    state.metrics = {"failed": float(result.failed)}
    if result.best_score is not None:
        state.metrics[f"best {result.criterion}"] = float(result.best_score)
    bar.after_step(state)


def _run_sweep(config: SweepConfig, out: Path, *, sweep_id: str, runs: list[PlannedRun], execution: Execution,
               progress: bool, checkpoint_every: int) -> SweepResult:
    """The body of :func:`run_sweep` once the store is claimed (locked) and prepared."""
    t0 = time.perf_counter()
    store = Store(out)
    criterion = config.selection.criterion
    mode = criterion_mode(criterion, config.selection.mode)
    store.add_sweep(sweep_id, name=config.name, config=config.model_dump(mode="json"), keys=[r.key for r in runs])
    result = SweepResult(sweep_id=sweep_id, out=out, total=len(runs), criterion=criterion)
    driver = _Driver(config=config, out=out, sweep_id=sweep_id, store=store, result=result, mode=mode,
                     execution=execution, checkpoint_every=checkpoint_every)
    todo = driver.skip_finished(runs)
    driver.faults = _faults()
    opts = execution.backend_options()
    by_key = {r.key: r for r in runs}

    # the one progress mechanism of every loop (a bar on a terminal, plain lines in a log), one step per run
    bar = ProgressBar(keys=(f"best {criterion}", "failed"), desc="sweep", unit="run", mode=progress)
    state = LoopState(step=result.skipped, total=len(runs))
    bar.before_run(state)
    with make_backend(execution.backend, execute_task, workers=execution.workers, **opts) as be:
        result.backend = be.describe()
        while todo or be.in_flight:
            while todo and be.in_flight < be.capacity:
                r = todo.popleft()
                driver.submit(be, r, driver.attempts.get(r.key, 0))
            for oc in be.wait():
                driver.handle(be, oc, by_key[oc.task.key])
                if oc.ok or result.failures.get(oc.task.key):
                    _advance(bar, state, result)
    bar.after_run(state)
    result.wall_time_s = time.perf_counter() - t0
    return result
