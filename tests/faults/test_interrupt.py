"""Ctrl-C (SIGINT to the process group, as a terminal sends it) at a random point: exit 130, a line
saying how to continue, and continuing that way finishes the run."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from faultlib import kill_at, progress_at_least, run_ok, start

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


def test_train(tmp_path: Path, rng) -> None:
    out = tmp_path / "m"
    # the rest of the run after the random point is long enough (under load too) that Ctrl-C lands before the end
    args = [*TRAIN, "--epochs", "4000", "--checkpoint-every", "10", "--out", str(out)]
    epoch = rng.randrange(10, 1000)
    assert _ctrl_c(args, progress_at_least(out / "checkpoint" / "progress.json", "epoch", epoch), rng) == RESUME
    run_ok(*args, "--resume")
    assert json.loads((out / "model.json").read_text())["metrics"]["epochs_done"] == 4000


def test_reconstruct(model: Path, tmp_path: Path, rng) -> None:
    out = tmp_path / "run"
    args = ["reconstruct", "--no-progress", "--model", str(model), "--steps", "3000", "--checkpoint-every", "10",
            "--candidates", "8", "--out", str(out)]
    step = rng.randrange(10, 1000)
    assert _ctrl_c(args, progress_at_least(out / "checkpoint" / "progress.json", "steps_done", step), rng) == RESUME
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
