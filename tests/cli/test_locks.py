"""Issue 25 item 13: one process at a time writes an output folder or a results store.

A real ``datarecon`` process holds the folder (a long attack, a sweep); a second command on the same
folder is refused at once with one line naming the holder's pid, and nothing of the first is
touched. A lock left by a killed process is stale and does not block the rerun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datarecon.cli.main import main

LOCK = ".datarecon-lock"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("locks") / "model"
    assert main(["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--hidden", "16",
                 "--no-bias", "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "30", "--dtype", "float64",
                 "--no-progress", "--out", str(out)]) == 0
    return out


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "datarecon.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_for(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() - t0 < timeout, "the holder did not start"
        time.sleep(0.02)


def _holds(folder: Path, proc: subprocess.Popen):
    def ready() -> bool:
        try:
            return json.loads((folder / LOCK).read_text()).get("pid") == proc.pid and \
                (folder / "checkpoint" / "progress.json").is_file()
        except (OSError, ValueError):
            return False
    return ready


def _refused(argv: list[str], pid: int, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"is in use by another datarecon process (pid {pid}," in err, err
    return err


def _files(folder: Path) -> set[str]:
    """The files of ``folder`` (not the temporary files the running command is writing and renaming)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".tmp"))}


def test_a_running_attack_holds_its_folder_and_a_killed_one_does_not(model: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = ["reconstruct", "--model", str(model), "--steps", "1000000", "--candidates", "8", "--checkpoint-every",
            "10", "--no-progress", "--out", str(out)]
    proc = _start(*args)
    try:
        _wait_for(proc, _holds(out, proc))
        err = _refused(args, proc.pid, capsys)  # the same command twice
        assert "wait for it to finish or stop it, then rerun" in err and "`datarecon reconstruct" in err
        _refused([*args, "--resume"], proc.pid, capsys)  # a double --resume
        _refused([*args, "--overwrite"], proc.pid, capsys)  # --overwrite while it runs: nothing deleted
        # evaluating it while it runs names the holder (it said "finish it with `... --resume`", which the
        # holder's lock would refuse)
        err = _refused(["evaluate", "--no-progress", str(out)], proc.pid, capsys)
        assert "--resume" not in err and err.startswith(f"error: run directory {out.resolve()} is in use")
        assert (out / "run.json").is_file() and (out / "checkpoint" / "state.safetensors").is_file()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    stale = json.loads((out / LOCK).read_text())
    assert stale["pid"] == proc.pid  # the killed process's lock file is left behind ...
    finite = [a if a != "1000000" else "20" for a in args]
    assert main(["reconstruct", *finite[1:], "--overwrite"]) == 0  # ... and does not block anyone
    assert not (out / LOCK).exists()  # released (and removed) when the command ends


def test_two_experiments_in_one_folder(tmp_path: Path, capsys) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("train: {data: {dataset: digits, task: odd-even, n_per_class: 5}, arch: {name: mlp, hidden: [16], "
                    "bias: false}, epochs: 200000, checkpoint_every: 10, dtype: float64}\n"
                    "attack: {attack: {method: kkt, steps: 5}}\n")
    out = tmp_path / "exp"
    proc = _start("run", str(path), "--out", str(out), "--no-progress")
    try:
        _wait_for(proc, lambda: (out / "model" / "checkpoint" / "progress.json").is_file())
        before = _files(out)
        _refused(["run", str(path), "--out", str(out), "--no-progress"], proc.pid, capsys)
        _refused(["run", str(path), "--out", str(out), "--overwrite", "--no-progress"], proc.pid, capsys)
        after = _files(out)
        assert before <= after  # nothing of the running experiment was deleted
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)


def test_two_sweeps_on_one_store(model: Path, tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"model_dir: {model}\nsteps: 1000000\ncandidates: 8\n")
    other = tmp_path / "t.yaml"
    other.write_text(f"model_dir: {model}\nsteps: 5\ncandidates: 8\n")
    store = tmp_path / "store"
    proc = _start("sweep", "--config", str(sweep), "--out", str(store), "--no-progress", "--checkpoint-every", "10")
    try:
        _wait_for(proc, lambda: any(store.glob("runs/*/checkpoint/progress.json")))
        err = _refused(["sweep", "--config", str(other), "--out", str(store), "--no-progress"], proc.pid, capsys)
        assert err.startswith(f"error: results store {store.resolve()} is in use")
        _refused(["store", "rebuild", str(store)], proc.pid, capsys)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert main(["sweep", "--config", str(other), "--out", str(store), "--no-progress"]) == 0  # stale: taken over
