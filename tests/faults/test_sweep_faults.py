"""Sweeps under faults: a worker or the driver SIGKILLed at a random point.

A killed worker is retried by the driver, its run resumes from its checkpoint; a killed driver
takes its pool workers with it (they notice and exit), and rerunning the sweep resumes it. Either
way every run directory equals the uninterrupted sweep's, bit for bit, and the store's attempt
counts say what happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from faultlib import alive, assert_same_tree, kill_at, read_json_or_none, run_ok, set_aside, start, wait_for

pytestmark = pytest.mark.slow

TRAIN = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "16", "--no-bias",
         "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "100", "--dtype", "float64", "--no-progress"]
STEPS = 300


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    run_ok(*TRAIN, "--out", str(root / "model"))
    path = root / "sweep.yaml"
    path.write_text(f"model_dir: {root / 'model'}\nsteps: {STEPS}\ncandidates: 8\ndtype: float64\n"
                    "init: {name: gaussian, scale: 0.05}\nattack: {lr_lambda: 0.01, lambda_min: 0.2}\n"
                    "search: {grid: {attack.lr_x: [0.01, 0.02]}}\n")
    return path


def _args(sweep_file: Path, out: Path) -> list[str]:
    return ["sweep", "--config", str(sweep_file), "--out", str(out), "--workers", "2", "--no-progress",
            "--checkpoint-every", "10"]


def _claims(out: Path) -> dict[Path, int]:
    """Run directory -> pid of the worker that claimed it."""
    found = {}
    for claim in (out / "runs").glob("*/.claim") if (out / "runs").is_dir() else []:
        try:
            found[claim.parent] = int(claim.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return found


def _attempts(out: Path) -> list[int]:
    with sqlite3.connect(out / "index.sqlite") as con:
        return sorted(r[0] for r in con.execute("SELECT attempts FROM runs WHERE kind = 'run'"))


def _some_run_at(out: Path, step: int):
    def ready() -> bool:
        for run in _claims(out):
            meta = read_json_or_none(run / "checkpoint" / "progress.json")
            if meta is not None and meta.get("steps_done", 0) >= step:
                return True
        return False
    return ready


def _compare_runs(ref: Path, out: Path) -> None:
    runs = sorted(p.name for p in (ref / "runs").iterdir() if p.is_dir())
    assert sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()) == runs and len(runs) == 2
    for key in runs:  # the driver's records (attempts, pids) differ by design
        assert_same_tree(ref / "runs" / key, out / "runs" / key, skip=("task.json", ".claim"))


def test_killed_worker_is_retried_and_resumes(sweep_file: Path, tmp_path: Path, rng) -> None:
    out = tmp_path / "store"
    run_ok(*_args(sweep_file, out))
    ref = set_aside(out)
    step = rng.randrange(10, int(0.7 * STEPS))
    proc = start(*_args(sweep_file, out))
    wait_for(proc, _some_run_at(out, step))
    time.sleep(rng.uniform(0.0, 0.05))
    victim = next(pid for run, pid in _claims(out).items()
                  if (read_json_or_none(run / "checkpoint" / "progress.json") or {}).get("steps_done", 0) >= step)
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert _attempts(out) == [1, 2]  # the killed run was charged one attempt and retried
    _compare_runs(ref, out)


def test_killed_driver_takes_its_workers_along_and_a_rerun_resumes(sweep_file: Path, tmp_path: Path, rng) -> None:
    out = tmp_path / "store"
    run_ok(*_args(sweep_file, out))
    ref = set_aside(out)
    # on a fast machine both runs may finish between the progress poll and the kill: then the trial
    # says nothing about resuming, and it is tried again, earlier (never more than 5 times)
    for attempt in range(5):
        if out.exists():
            shutil.rmtree(out)
        proc = start(*_args(sweep_file, out))
        kill_at(proc, _some_run_at(out, rng.randrange(10, max(11, int((0.7 / (attempt + 1)) * STEPS)))), rng,
                jitter_s=0.05 / (attempt + 1))
        assert proc.returncode == -9
        workers = list(_claims(out).values())
        assert workers
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers), "pool workers outlived their driver"
        # the killed run is mid-way; the other one is mid-way too, already complete when one worker
        # ran both runs in turn (the second worker was still starting up under load), or claimed and
        # not yet begun (no run.json: its worker was killed between the claim and the run's first write)
        statuses = {r.name: (read_json_or_none(r / "run.json") or {}).get("status") for r in _claims(out)}
        for r in _claims(out):
            if statuses[r.name] is None:
                assert not (r / "run.json").exists(), f"{r / 'run.json'} exists but does not parse"
        assert set(statuses.values()) <= {"running", "complete", None}, statuses
        if "running" in statuses.values():
            break
    else:
        pytest.fail(f"every run had finished before the driver was killed in 5 trials: {statuses}")
    run_ok(*_args(sweep_file, out))
    assert _attempts(out) == [1, 1]  # the driver's death is not charged to the runs
    _compare_runs(ref, out)
