"""Progress of the shared loop: a bar on a terminal, plain rate-limited lines in logs, or nothing."""

from __future__ import annotations

import io
import re

import pytest

from datarecon.errors import DataReconError
from datarecon.kernel.engine import (
    Engine,
    LineRate,
    ProgressBar,
    ProgressLines,
    resolve_progress_mode,
    track,
)


class FakeClock:
    """Advances ``dt`` seconds per call."""

    def __init__(self, dt: float) -> None:
        self.t, self.dt = 0.0, dt

    def __call__(self) -> float:
        self.t += self.dt
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("mode, stream, expected", [
    ("auto", io.StringIO(), "lines"), ("auto", Tty(), "bar"), (True, io.StringIO(), "lines"),
    (False, Tty(), "off"), ("lines", Tty(), "lines"), ("bar", io.StringIO(), "bar"), ("off", Tty(), "off"),
], ids=["auto-file", "auto-tty", "true-file", "false", "lines", "bar", "off"])
def test_resolve_progress_mode(mode, stream, expected) -> None:
    assert resolve_progress_mode(mode, stream) == expected


def test_unknown_mode_is_refused_with_the_valid_names() -> None:
    with pytest.raises(DataReconError, match="unknown progress mode 'fancy'; valid modes: auto, bar, lines, off"):
        resolve_progress_mode("fancy")


def test_lines_are_rate_limited_by_time_and_fraction() -> None:
    out = io.StringIO()
    # 1 s per step, lines at most every 5 s and 1%: 1000 steps -> one line per 5 steps at most
    lines = ProgressLines(1000, desc="kkt", keys=("loss",), stream=out, clock=FakeClock(1.0),
                          rate=LineRate(interval_s=5.0, min_fraction=0.01))
    for step in range(1, 1001):
        lines.update(step, {"loss": 1.0 / step, "other": 3.0})
    lines.close(1000, {"loss": 0.001})
    text = out.getvalue()
    assert "\r" not in text
    rows = text.splitlines()
    # every line needs >= 10 steps (1% of 1000) and >= 5 s: at most 100 update lines + the last
    assert 50 <= len(rows) <= 101
    first = rows[0]
    assert re.fullmatch(r"kkt: step 10/1000 \(1%\), 1 step/s, ETA 0:16:\d\d, loss 0\.1", first), first
    assert "other" not in text  # only the requested keys
    assert re.fullmatch(r"kkt: done step 1000/1000 in 0:16:\d\d \([\d.]+ step/s\), loss 0\.001", rows[-1]), rows[-1]


def test_short_runs_write_few_lines() -> None:
    out = io.StringIO()
    lines = ProgressLines(2000, desc="train", stream=out, clock=FakeClock(0.005))  # 10 s for 2000 steps
    for step in range(1, 2001):
        lines.update(step)
    lines.close(2000)
    assert 2 <= len(out.getvalue().splitlines()) <= 3


def test_engine_progress_lines_report_steps_rate_eta_metrics_and_stop_reason() -> None:
    out = io.StringIO()
    bar = ProgressBar(keys=("loss",), desc="attack", mode="auto", stream=out, rate=LineRate(interval_s=0.0, min_fraction=0.25))
    state = Engine(lambda i: {"loss": 10.0 - i}, hooks=[bar]).run(start=2, total=10)
    assert state.step == 10
    rows = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # resumed at step 2 (said first): lines every 25% of the total (>= 3 steps), then the last line
    assert rows[0] == "attack: resumed at step 2/10"
    rows = rows[1:]
    assert [r.split(",")[0] for r in rows[:-1]] == ["attack: step 5/10 (50%)", "attack: step 8/10 (80%)"]
    assert rows[-1].startswith("attack: done step 10/10 in ")
    assert rows[-1].endswith("loss 1")
    assert all("ETA" in r and "step/s" in r for r in rows[:-1])


def test_engine_progress_off_and_disabled_write_nothing() -> None:
    for bar in (ProgressBar(mode="off", stream=Tty()), ProgressBar(mode=False, stream=io.StringIO())):
        Engine(lambda i: {"loss": 1.0}, hooks=[bar]).run(start=0, total=3)
        assert bar.stream.getvalue() == ""


def test_stopped_run_says_so() -> None:
    out = io.StringIO()
    lines = ProgressLines(100, desc="x", stream=out, clock=FakeClock(1.0))
    lines.close(40, reason="diverged (loss = nan)")
    assert out.getvalue().startswith("x: stopped at step 40/100 in ")
    assert "diverged (loss = nan)" in out.getvalue()


def test_track_yields_every_item_in_order_in_every_mode() -> None:
    for mode in ("off", "lines", "bar"):
        out = io.StringIO()
        assert list(track(range(7), desc="chunks", unit="chunk", mode=mode, stream=out, interval_s=0.0)) == list(range(7))
        if mode == "lines":
            assert "\r" not in out.getvalue()
            assert out.getvalue().splitlines()[-1].startswith("chunks: done chunk 7/7 in ")
        if mode == "off":
            assert out.getvalue() == ""


def test_the_fault_hook_signals_after_the_chosen_step_of_the_chosen_loop(monkeypatch) -> None:
    import signal

    from datarecon.kernel import engine as engine_mod
    from datarecon.kernel.engine import FAULT_STEP_ENV, Engine, History

    seen: list[int] = []
    history = History()
    previous = signal.signal(signal.SIGUSR1, lambda *_: seen.append(len(history.rows)))
    try:
        monkeypatch.setattr(engine_mod, "_loops_run", 0)
        monkeypatch.setenv(FAULT_STEP_ENV, "3:USR1:1")
        Engine(lambda i: {"loss": 1.0}, hooks=[History()]).run(start=0, total=5)  # loop 0: not this one
        assert seen == []
        Engine(lambda i: {"loss": 1.0}, hooks=[history]).run(start=0, total=5)  # loop 1: after step 3's row
        assert seen == [3]
    finally:
        signal.signal(signal.SIGUSR1, previous)
