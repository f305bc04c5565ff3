"""Resuming a run that had ended changes no byte, and a coupled group resumes bit for bit from any kill.

The same command is run again with ``--resume`` once it has finished: a training (full batch), a training with
margin ascent to convergence (stopped early by its rule), DP-SGD, an attack, an attack stopped early by its
plateau, ``--runs K`` pooled, a coupled group (``--group-weight``) and a run that diverged after its retries. Every
file of its folder keeps its bytes (the lock file, which names the process holding the folder, aside), and the
command prints what it printed the first time. Before the one resume protocol an early-stopped run resumed
rewrote its checkpoint (stop reason "completed", total 300 -> 6) and a run diverged after ``--retry-diverged 2`` was
refused as "run with another method/config".

Then the kills: a coupled group of three runs (the group prior reads every run's candidates) killed right after
one run's checkpoint of a round (SIGKILL, SIGINT or SIGTERM, a seeded random run and round), or inside a round
(``DATARECON_FAULT_AT_STEP``), resumes into the files of the uninterrupted group; and a training killed inside its
margin ascent resumes into the uninterrupted model directory.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from faultlib import LOCK, assert_same_tree, command, env, run_faulted, run_ok, set_aside

pytestmark = pytest.mark.slow

Q = ["--no-progress", "--threads", "1"]
TRAIN = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--arch", "mlp", "--hidden", "20",
         "--no-bias", "--loss", "logistic", "--dtype", "float64", *Q]
ASCENT = [*TRAIN, "--init-scale", "1e-3", "--lr", "0.01", "--schedule", "loss-normalised", "--max-lr-factor", "1e9",
          "--epochs", "50", "--margin-ascent-steps", "200", "--margin-ascent-rtol", "0.01", "--margin-ascent-window",
          "20", "--checkpoint-every", "10"]
GROUP = ["reconstruct", *Q, "--method", "kkt", "--steps", "40", "--runs", "3", "--group-weight", "0.1",
         "--checkpoint-every", "5"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unchanged") / "mlp"
    run_ok(*TRAIN, "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "100", "--out", str(out))
    return out


def _bytes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK}


def _output(args: list[str]) -> tuple[int, str, str]:
    res = subprocess.run(command(*args), capture_output=True, text=True, timeout=600, env=env())
    return res.returncode, res.stdout, res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""


CASES = {
    "training": lambda m: [*TRAIN, "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "60"],
    "margin-ascent": lambda m: ASCENT,
    "dp-sgd": lambda m: [*TRAIN, "--lr", "0.5", "--epochs", "20", "--dp-noise", "1.0", "--dp-clip", "1.0",
                         "--dp-batch-size", "4"],
    "attack": lambda m: ["reconstruct", *Q, "--model", str(m), "--method", "kkt", "--steps", "30"],
    "early-stopped-attack": lambda m: ["reconstruct", *Q, "--model", str(m), "--method", "kkt", "--steps", "300",
                                       "--early-stop-patience", "5", "--early-stop-tol", "0.5"],
    "pooled-runs": lambda m: ["reconstruct", *Q, "--model", str(m), "--method", "kkt", "--steps", "20", "--runs", "2",
                              "--seed", "3"],
    "coupled-runs": lambda m: [*GROUP, "--model", str(m), "--steps", "10"],
    "diverged-after-retries": lambda m: ["reconstruct", *Q, "--model", str(m), "--method", "kkt", "--steps", "50",
                                         "--lr-x", "1e8", "--lr-lambda", "1e6", "--step-probe", "0",
                                         "--retry-diverged", "2"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_resuming_a_finished_run_changes_no_byte(case: str, model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [*CASES[case](model), "--out", str(out)]
    first = _output(args)
    assert (first[0] == 0) == (case != "diverged-after-retries"), first
    before = _bytes(out)
    again = _output([*args, "--resume"])
    assert _bytes(out) == before
    assert again == first  # the same exit, the same lines (a diverged run: the same error line)
    if case == "early-stopped-attack":
        assert "stopped-early after" in first[1]


@pytest.fixture(scope="module")
def group(model: Path, tmp_path_factory) -> tuple[Path, list[str], Path]:
    """The coupled group's command line and its uninterrupted folder."""
    root = tmp_path_factory.mktemp("group")
    args = [*GROUP, "--model", str(model), "--out", str(root / "runs")]
    run_ok(*args)
    return root, args, set_aside(root / "runs")


@pytest.mark.parametrize("sig", ["KILL", "INT", "TERM"])
def test_a_coupled_group_killed_between_two_runs_checkpoints_resumes_bit_identically(group, sig: str, rng) -> None:
    root, args, ref = group
    out = root / "runs"
    at = f"run{rng.randrange(2)}:{5 * rng.randrange(1, 8)}:{sig}"  # run 0 or 1: the runs after it lag a round
    res = subprocess.run(command(*args), capture_output=True, text=True, timeout=600,
                         env={**env(), "DATARECON_FAULT_AFTER_CHECKPOINT": at})
    assert res.returncode in (-9, 130, 143), (at, res.stderr[-2000:])
    run_ok(*args, "--resume")
    assert assert_same_tree(ref, out) > 10, at
    shutil.rmtree(out)


def test_a_coupled_group_killed_inside_a_round_resumes_bit_identically(group, rng) -> None:
    root, args, ref = group
    out = root / "runs"
    step, loop = rng.randrange(6, 39), rng.randrange(3)  # after that run's step: the others are a step behind
    proc = run_faulted(*args, step=step, loop=loop, sig="INT")
    assert proc.returncode == 130, proc.stderr[-2000:]
    run_ok(*args, "--resume")
    assert assert_same_tree(ref, out) > 10, (step, loop)
    shutil.rmtree(out)


def test_a_training_killed_in_its_margin_ascent_resumes_bit_identically(tmp_path: Path, rng) -> None:
    out = tmp_path / "m"
    args = [*ASCENT, "--out", str(out)]
    run_ok(*args)
    ref = set_aside(out)
    proc = run_faulted(*args, step=rng.randrange(11, 39), loop=1)  # loop 0: the epochs, loop 1: the ascent
    assert proc.returncode == -9 and not (out / "model.json").exists()
    run_ok(*args, "--resume")
    assert assert_same_tree(ref, out) >= 6
