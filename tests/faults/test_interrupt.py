"""Ctrl-C: exit 130, a line saying how to continue, and continuing that way finishes the run.

Train and reconstruct get SIGINT right after a step drawn from the test's seeded generator (the
engine's test-only step hook: an exact, replayable point); a sweep gets it at a polled moment,
sent to its whole process group as a terminal sends it (its pool workers included)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from faultlib import kill_at, run_faulted, run_ok, start

pytestmark = pytest.mark.slow

TRAIN = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "16", "--no-bias",
         "--init-scale", "1e-2", "--lr", "0.5", "--dtype", "float64", "--no-progress"]
RESUME = "interrupted; rerun the same command with --resume to continue from the last checkpoint"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("interrupt") / "model"
    run_ok(*TRAIN, "--epochs", "100", "--out", str(out))
    return out


def _ctrl_c(args: list[str], ready, rng, *, jitter_s: float = 0.05) -> str:
    """Start the command, press Ctrl-C at a random point; the last line it printed (exit 130)."""
    proc = start(*args, new_session=True)
    err = kill_at(proc, ready, rng, jitter_s=jitter_s, sig=signal.SIGINT, group=True)
    assert proc.returncode == 130, err[-2000:]
    return err.strip().splitlines()[-1] if err.strip() else ""


def _interrupted_at(args: list[str], step: int) -> str:
    """Run until SIGINT right after ``step``; the last line it printed (exit 130)."""
    res = run_faulted(*args, step=step, sig="INT")
    assert res.returncode == 130, res.stderr[-2000:]
    return res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""


def test_train(tmp_path: Path, rng) -> None:
    out = tmp_path / "m"
    args = [*TRAIN, "--epochs", "1000", "--checkpoint-every", "10", "--out", str(out)]
    assert _interrupted_at(args, rng.randrange(10, 990)) == RESUME
    run_ok(*args, "--resume")
    assert json.loads((out / "model.json").read_text())["metrics"]["epochs_done"] == 1000


def test_reconstruct(model: Path, tmp_path: Path, rng) -> None:
    out = tmp_path / "run"
    args = ["reconstruct", "--no-progress", "--model", str(model), "--steps", "1000", "--checkpoint-every", "10",
            "--candidates", "8", "--out", str(out)]
    assert _interrupted_at(args, rng.randrange(10, 990)) == RESUME
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    run_ok(*args, "--resume")
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("workers", ["1", "2"], ids=["in-process", "pool"])
def test_sweep(model: Path, tmp_path: Path, rng, workers: str) -> None:
    (tmp_path / "s.yaml").write_text(f"model_dir: {model}\nsteps: 3000\ncandidates: 8\n"
                                     "search: {grid: {attack.lr_x: [0.01, 0.02]}}\n")
    out = tmp_path / "store"
    args = ["sweep", "--config", str(tmp_path / "s.yaml"), "--out", str(out), "--workers", workers, "--no-progress",
            "--checkpoint-every", "10"]

    def some_run_started() -> bool:
        return any(p.is_file() for p in out.glob("runs/*/checkpoint/progress.json"))

    line = _ctrl_c(args, some_run_started, rng, jitter_s=0.5)
    assert line.startswith("interrupted; rerun the same command to resume the sweep"), line
    res = run_ok(*args)
    assert "2 runs:" in res.stdout and "0 failed" in res.stdout
