"""The one resumable loop (kernel.run_loop.RunLoop): hook order, status rule, checkpoint, key check (its resume:
tests/kernel/test_resume.py)."""

from __future__ import annotations

import math

import pytest

from datarecon.errors import CheckpointError
from datarecon.kernel.engine import (BaseHook, Checkpoint, EarlyStop, History, LoopOptions, LoopState, NaNStop,
                                     ProgressBar)
from datarecon.kernel.resume import Progress
from datarecon.kernel.run_loop import Display, RunLoop, check_key
from datarecon.kernel.status import Status


class Record(BaseHook):
    """Appends its name to a shared log at every step (the hooks' order)."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def after_step(self, state: LoopState) -> None:
        self.log.append(self.name)


def _steps(values):
    return lambda i: {"loss": values[i]}


def test_hook_order_and_history():
    log: list[str] = []
    loop = RunLoop(_steps([3.0, 2.0, 1.0, 0.5]), display=Display("t", keys=("loss",)),
                   options=LoopOptions(log_every=2, hooks=(Record("extra", log),)),
                   stops=(Record("stop", log),), prepare=(Record("prepare", log),))
    loop.saver = Checkpoint(lambda s: log.append(f"save{s.step}"), every=3)
    hooks = loop.hooks()
    kinds = [type(h).__name__ for h in hooks]
    assert kinds == ["Record", "NaNStop", "History", "_StopRule", "ProgressBar", "Checkpoint", "Record"]
    state = loop.run(start=0, total=4)
    assert log[:3] == ["prepare", "stop", "extra"] and "save3" in log and log[-1] == "save4"
    assert [r["step"] for r in loop.history.rows] == [2, 4]
    assert loop.status(state) == Status.COMPLETE


def test_restored_rows_and_sink():
    sunk: list[dict] = []
    loop = RunLoop(_steps([1.0] * 6), display=Display("t"), sink=sunk.append)
    loop.restore(Progress(resume_key="k", steps_done=2, total=4, status=Status.RUNNING,
                          history=[{"step": 1, "loss": 1.0}, {"step": 2, "loss": 1.0}]))
    loop.run(start=2, total=4)
    assert [r["step"] for r in loop.history.rows] == [1, 2, 3, 4] and [r["step"] for r in sunk] == [3, 4]


def test_status_rule():
    diverging = RunLoop(_steps([1.0, math.nan, 1.0]), display=Display("t"), watch=("loss",),
                        stops=(EarlyStop(lambda m: m["loss"] != 1.0, reason="rule"),))
    state = diverging.run(start=0, total=3)
    # the stop rule runs after the NaN stop: its reason replaces the NaN stop's, the status stays diverged
    assert state.step == 2 and state.stop_reason == "rule"
    assert diverging.diverged and diverging.status(state) == Status.DIVERGED
    stopping = RunLoop(_steps([3.0, 2.0, 1.0]), display=Display("t"),
                       stops=(EarlyStop(lambda m: m["loss"] < 2.5, reason="plateau"),))
    state = stopping.run(start=0, total=3)
    assert state.stop_reason == "plateau" and stopping.stopped_early
    assert stopping.status(state) == Status.STOPPED_EARLY
    for status in (Status.STOPPED_EARLY, Status.DIVERGED):  # how a run had ended before its resume
        resumed = RunLoop(_steps([1.0]), display=Display("t"))
        resumed.restore(Progress(resume_key="k", steps_done=2, total=2, status=status, stop_reason="completed"))
        assert resumed.status(LoopState(step=2, total=2, stop_reason="completed")) == status
    fresh = RunLoop(_steps([1.0]), display=Display("t"))
    assert fresh.status(LoopState(step=1, total=3)) == Status.RUNNING
    assert fresh.status(LoopState(step=3, total=3)) == Status.COMPLETE  # ended by an error after its last step
    assert fresh.status(LoopState(step=2, total=3, stop_reason="completed")) == Status.COMPLETE
    assert fresh.status(LoopState(step=2, total=3, stop_reason="zero training error")) == Status.STOPPED_EARLY


class Busy:
    in_update = True


def test_checkpoint_skips_final_save_mid_update():
    saved: list[int] = []
    hook = Checkpoint(lambda s: saved.append(s.step), every=2, stepper=Busy())
    hook.after_run(LoopState(step=3, total=5))
    Checkpoint(lambda s: saved.append(s.step), every=2).after_run(LoopState(step=4, total=5))
    assert saved == [4]


def test_progress_display_settings():
    loop = RunLoop(_steps([1.0]), display=Display("train", keys=("loss", "acc"), labels={"acc": "accuracy"},
                                                  unit="epoch", every=3), options=LoopOptions(progress="off"))
    (bar,) = [h for h in loop.hooks() if isinstance(h, ProgressBar)]
    assert (bar.desc, bar.keys, bar.labels, bar.unit, bar.every, bar.mode) == (
        "train", ["loss", "acc"], {"acc": "accuracy"}, "epoch", 3, "off")
    assert isinstance(loop.history, History) and isinstance(loop.nan_stop, NaNStop)


def test_check_key():
    check_key({"tag": "a"}, "tag", "a", refuse=lambda found: CheckpointError(f"{found}"))
    with pytest.raises(CheckpointError, match="^b$"):
        check_key({"tag": "b"}, "tag", "a", refuse=lambda found: CheckpointError(f"{found}"))
    with pytest.raises(CheckpointError, match="None"):
        check_key({}, "tag", "a", refuse=lambda found: CheckpointError(f"{found}"))
