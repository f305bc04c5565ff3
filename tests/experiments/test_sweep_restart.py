"""A sweep driver restart keeps the store's attempt counts; failures name the sweep's fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datarecon.experiments.execution import Execution
from datarecon.experiments.store import Store
from datarecon.experiments.sweep import SweepConfig, run_sweep
from datarecon.experiments.sweep.driver import next_attempt

from test_sweep_local import train_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("model") / "digits-tiny")


def test_next_attempt_continues_the_count() -> None:
    assert next_attempt(None) == 0
    assert next_attempt({"status": "failed", "attempts": 3}) == 3  # a rerun gives it one more attempt
    assert next_attempt({"status": "running", "attempts": 2}) == 1  # cut short by the driver: same attempt
    assert next_attempt({"status": "running", "attempts": "x"}) == 0


def test_failures_count_across_restarts_and_name_sweep_fields(model_dir: Path, tmp_path: Path) -> None:
    # 10 training images but 8 candidates: the ground-truth init refuses (a user error: not retried)
    cfg = SweepConfig(model_dir=str(model_dir), steps=2, candidates=8, init={"name": "ground-truth"}, max_retries=0)
    out = tmp_path / "store"
    for expected in (1, 2, 3):
        result = run_sweep(cfg, out, execution=Execution(workers=1), progress=False)
        assert result.failed == 1
        (row,) = Store(out).rows()
        assert row["status"] == "failed" and row["attempts"] == expected
    assert "sweep run 0: 8 candidates but 10 ground-truth images; set candidates 10" in row["error"]
    assert "--candidates" not in row["error"] and "init.count" in row["error"]


def test_a_run_finished_but_never_booked_keeps_its_attempt(model_dir: Path, tmp_path: Path) -> None:
    cfg = SweepConfig(model_dir=str(model_dir), steps=2, candidates=4)
    out = tmp_path / "store"
    run_sweep(cfg, out, execution=Execution(workers=1), progress=False)
    (run_dir,) = (p for p in (out / "runs").iterdir() if p.is_dir())
    task = json.loads((run_dir / "task.json").read_text())
    # what a driver killed after the worker finished leaves behind: the task still marked running
    (run_dir / "task.json").write_text(json.dumps({**task, "status": "running", "attempts": 1}))
    again = run_sweep(cfg, out, execution=Execution(workers=1), progress=False)
    assert again.skipped == 1
    (row,) = Store(out).rows()
    assert row["status"] == "complete" and row["attempts"] == 1
    assert json.loads((run_dir / "task.json").read_text())["status"] == "done"
