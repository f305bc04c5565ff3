"""The one resume protocol (kernel.resume, RunLoop.resume / keep / run_resumed): a resumable stepper checkpointed
into a store resumes bit for bit, a finished run (complete, stopped early, diverged) resumed writes nothing and
reports its recorded end, the one metadata schema and the two vocabularies before it, the coupled group's previous
checkpoint, and the one reading of a resumable folder (folder_state)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from datarecon.errors import CheckpointError
from datarecon.kernel import checkpoint
from datarecon.kernel.engine import BaseHook, EarlyStop, LoopOptions, LoopState
from datarecon.kernel.resume import SCHEMA, Progress, Start, Store, folder_state, recorded_progress
from datarecon.kernel.run_loop import Display, RunLoop
from datarecon.kernel.status import Status

TRAIN, ATTACK = checkpoint.Kind.TRAIN, checkpoint.Kind.ATTACK


class Walker:
    """A resumable stepper: x ← x·0.9 + noise from its own generator; its record counts the steps."""

    def __init__(self) -> None:
        self.x = torch.zeros(3, dtype=torch.float64)
        self.g = torch.Generator().manual_seed(0)
        self.calls = 0
        self.in_update = False

    def __call__(self, i: int) -> dict[str, float]:
        self.x = self.x * 0.9 + torch.randn(3, generator=self.g, dtype=torch.float64)
        self.calls += 1
        return {"loss": float(self.x.abs().sum()) if i != 99 else math.nan}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"x": self.x, "gen": self.g.get_state()}

    def state_record(self) -> dict:
        return {"calls": self.calls}

    def load_state(self, tensors, record) -> None:
        self.x, self.calls = tensors["x"].clone(), record["calls"]
        self.g.set_state(tensors["gen"])


class Below:
    """A stop rule with memory: stops once the loss fell below ``level`` twice."""

    def __init__(self, level: float) -> None:
        self.level, self.seen = level, 0

    def __call__(self, metrics) -> bool:
        self.seen += metrics["loss"] < self.level
        return self.seen >= 2

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state) -> None:
        self.seen = state["seen"]


class Kill(BaseHook):
    def __init__(self, at: int) -> None:
        self.at = at

    def after_step(self, state: LoopState) -> None:
        if state.step == self.at:
            raise KeyboardInterrupt


def _run(store: Store | None, *, total: int, resume: bool = False, hooks=(), level: float | None = None):
    walker = Walker()
    stops = (EarlyStop(Below(level), reason="below"),) if level is not None else ()
    loop = RunLoop(walker, display=Display("t"), options=LoopOptions(progress="off", hooks=tuple(hooks)), stops=stops)
    start = loop.resume(store, walker, enabled=resume)
    state = loop.run_resumed(start, store, walker, total=total, every=4)
    return walker, loop, state, start


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_killed_loop_resumes_bit_identically_and_records_the_schema(tmp_path: Path) -> None:
    full, full_loop, full_state, _ = _run(None, total=20)
    store = Store(tmp_path / "ck", key="k", kind=TRAIN)
    with pytest.raises(KeyboardInterrupt):
        _run(store, total=20, hooks=(Kill(10),))
    meta = json.loads((tmp_path / "ck" / checkpoint.PROGRESS_FILE).read_text())
    assert meta["schema"] == SCHEMA and (meta["steps_done"], meta["total"], meta["status"]) == (10, 20, "running")
    assert set(meta) == {"schema", "resume_key", "steps_done", "total", "status", "stop_reason", "wall_time_s",
                         "metrics", "stop_state", "history", "stepper"}
    walker, loop, state, start = _run(store, total=20, resume=True)
    assert start.step == 10 and walker.calls == 20 and torch.equal(walker.x, full.x)
    assert loop.history.rows == full_loop.history.rows and loop.status(state) == Status.COMPLETE
    assert Progress.from_meta(checkpoint.load(tmp_path / "ck", kind=TRAIN)[1], kind=TRAIN).status == Status.COMPLETE


def test_another_key_is_refused(tmp_path: Path) -> None:
    _run(Store(tmp_path / "ck", key="a", kind=TRAIN), total=5)
    with pytest.raises(CheckpointError, match=r"another configuration \(hash a != b\)"):
        _run(Store(tmp_path / "ck", key="b", kind=TRAIN), total=5, resume=True)


@pytest.mark.parametrize("ending", ["complete", "stopped-early", "diverged"])
def test_a_finished_run_resumed_writes_nothing_and_reports_its_recorded_end(tmp_path: Path, ending: str) -> None:
    store = Store(tmp_path / "ck", key="k", kind=ATTACK)
    total, level = (100, None) if ending == "diverged" else (30, 3.0 if ending == "stopped-early" else None)
    first, first_loop, first_state, _ = _run(store, total=total, level=level)
    assert first_loop.status(first_state) == ending
    before = _files(tmp_path)
    walker, loop, state, start = _run(store, total=total, resume=True, level=level)
    assert _files(tmp_path) == before and walker.calls == first.calls  # no step, no byte
    assert start.finished(total) and loop.status(state) == ending
    assert (state.step, state.total, state.stop_reason, state.wall_time_s) == (
        first_state.step, first_state.total, first_state.stop_reason, first_state.wall_time_s)


def test_a_complete_attack_asked_for_more_steps_continues(tmp_path: Path) -> None:
    full, *_ = _run(None, total=12)
    store = Store(tmp_path / "ck", key="k", kind=ATTACK)
    _run(store, total=8)
    walker, _, state, start = _run(store, total=12, resume=True)
    assert not start.finished(12) and state.step == 12 and torch.equal(walker.x, full.x)


def test_stop_rule_memory_is_checkpointed(tmp_path: Path) -> None:
    full, _, full_state, _ = _run(None, total=60, level=2.2)
    store = Store(tmp_path / "ck", key="k", kind=ATTACK)
    with pytest.raises(KeyboardInterrupt):
        _run(store, total=60, level=2.2, hooks=(Kill(full_state.step - 1),))
    assert json.loads((tmp_path / "ck" / checkpoint.PROGRESS_FILE).read_text())["stop_state"] == [{"seen": 1}]
    walker, _, state, _ = _run(store, total=60, level=2.2, resume=True)
    assert state.step == full_state.step and state.stop_reason == "below" and torch.equal(walker.x, full.x)


def test_the_vocabularies_before_the_schema_are_read() -> None:
    training = {"tag": "t", "epoch": 7, "finished": True, "status": "stopped", "stop_reason": "zero training error",
                "wall_time_s": 1.5, "history": [{"step": 5}], "last_margin": 0.25, "opt_scalars": {"k": 1}}
    p = Progress.from_meta(training, kind=TRAIN)
    assert (p.resume_key, p.steps_done, p.total, p.status, p.stop_state, p.stepper, p.history) == (
        "t", 7, None, Status.STOPPED_EARLY, ({"last_margin": 0.25},), {"opt_scalars": {"k": 1}}, [{"step": 5}])
    assert Progress.from_meta({"tag": "t", "epoch": 3, "finished": True}, kind=TRAIN).status == Status.COMPLETE
    attack = {"config_hash": "c", "method": "kkt", "resume_key": "r", "steps_done": 30, "total": 30,
              "status": "running", "stop_reason": "completed", "metrics": {"loss": None}, "early_stop": {"best": 1}}
    p = Progress.from_meta(attack, kind=ATTACK)
    assert (p.resume_key, p.status, p.stop_state, p.stepper) == (
        "r", Status.COMPLETE, ({"best": 1},), {"config_hash": "c", "method": "kkt"})  # a complete run said running
    assert math.isnan(p.metrics["loss"]) and p.finished(30) and not p.finished(40)
    interrupted = {**attack, "stop_reason": ""}
    assert Progress.from_meta(interrupted, kind=ATTACK).status == Status.RUNNING
    with pytest.raises(CheckpointError, match="progress record is damaged"):
        Progress.from_meta({"schema": SCHEMA, "steps_done": "x", "status": "running"}, kind=ATTACK)


def test_a_coupled_runs_previous_checkpoint(tmp_path: Path) -> None:
    t = {"w": torch.arange(3.0)}
    for step in (10, 20):
        checkpoint.save(tmp_path, t, {"step": step}, kind=ATTACK, keep_previous=True)
    assert checkpoint.load(tmp_path, kind=ATTACK)[1] == {"step": 20}
    assert checkpoint.load(tmp_path, kind=ATTACK, previous=True)[1] == {"step": 10}
    checkpoint.promote_previous(tmp_path)  # rolled back: the previous is the latest, and the readable copy follows
    assert checkpoint.load(tmp_path, kind=ATTACK)[1] == {"step": 10} and not checkpoint.has_previous(tmp_path)
    assert json.loads((tmp_path / checkpoint.PROGRESS_FILE).read_text()) == {"step": 10}
    checkpoint.save(tmp_path, t, {"step": 20}, kind=ATTACK, keep_previous=True)
    checkpoint.drop_previous(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.PROGRESS_FILE, checkpoint.STATE_FILE]


def test_folder_state_is_the_one_reading_of_a_resumable_folder(tmp_path: Path) -> None:
    assert not folder_state(tmp_path / "none").present
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "running", "resume_key": "r"}))
    state = folder_state(run)
    assert state.present and state.checkpoint and not state.finished and state.record["resume_key"] == "r"
    (run / "run.json").write_text(json.dumps({"status": "stopped-early", "resume_key": "r"}))
    assert folder_state(run, key={"resume_key": "r"}).finished and not folder_state(run, key={"resume_key": "s"}).finished
    piece = tmp_path / "piece"
    piece.mkdir()
    (piece / "DONE.json").write_text(json.dumps({"hash": "h"}))  # a marker: finished by being there
    assert folder_state(piece, record="DONE.json", key={"hash": "h"}).finished
    (piece / "DONE.json").write_text("{broken")
    assert not folder_state(piece, record="DONE.json", key={"hash": "h"}).finished
    assert recorded_progress(run / "checkpoint", kind=ATTACK) is None and Start().step == 0
