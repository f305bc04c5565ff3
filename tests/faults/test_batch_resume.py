"""Issue 25 item 15: ``reconstruct --runs K`` resumed after a kill or Ctrl-C that lands between two
runs' checkpoints continues bit for bit as the uninterrupted batch, and Ctrl-C or SIGTERM ends it
with the line saying how to continue (never SIGABRT).

The runs of a batch checkpoint one after the other, so such a fault leaves runs at different steps
(70/70/60 below). The resumed batch then steps the runs in other company than the uninterrupted
one; vmapped kernels differ in the last bits between batch sizes (run 2 differed by 6e-8 here, float32,
MNIST, m = 17), so each run now keeps a fixed position in a batch of fixed size. The faults are placed
deterministically: by rebuilding the checkpoints a kill leaves, and with the test-only hook
``DATARECON_FAULT_AFTER_CHECKPOINT`` (the signal right after a given run's checkpoint).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from faultlib import assert_same_tree, command, env, run_ok, set_aside

pytestmark = pytest.mark.slow

TRAIN = ["train", "--dataset", "mnist", "--task", "odd-even", "--n-per-class", "10", "--hidden", "100", "--no-bias",
         "--init-scale", "1e-3", "--lr", "0.5", "--epochs", "200", "--no-progress"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, list[str], Path]:
    """A model, the batch's command line (without --steps) and the uninterrupted batch of 100 steps."""
    root = tmp_path_factory.mktemp("batch")
    run_ok(*TRAIN, "--out", str(root / "model"))
    args = ["reconstruct", "--model", str(root / "model"), "--runs", "3", "--batch-mode", "batched", "--candidates",
            "17", "--checkpoint-every", "10", "--no-progress", "--out", str(root / "runs")]
    run_ok(*args, "--steps", "100")
    return root, args, set_aside(root / "runs")


def test_resume_from_checkpoints_at_different_steps_is_bit_identical(reference) -> None:
    root, args, ref = reference
    out = root / "runs"
    run_ok(*args, "--steps", "60")
    shutil.copytree(out / "run2" / "checkpoint", root / "run2-at-60")
    run_ok(*args, "--steps", "70", "--resume")
    shutil.rmtree(out / "run2" / "checkpoint")  # what a kill right after run1's checkpoint at 70 leaves:
    shutil.copytree(root / "run2-at-60", out / "run2" / "checkpoint")  # runs at 70, 70 and 60
    run_ok(*args, "--steps", "100", "--resume")
    assert assert_same_tree(ref, out) > 10
    shutil.rmtree(out)


def _faulted(args: list[str], at: str) -> subprocess.CompletedProcess:
    # SIGINT back to its default: a shell without job control starts background jobs with it ignored
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=600,
                          env={**env(), "DATARECON_FAULT_AFTER_CHECKPOINT": at},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("at, code, word", [("run0:40:INT", 130, "interrupted"), ("run1:70:INT", 130, "interrupted"),
                                            ("run2:30:TERM", 143, "terminated"), ("run1:50:KILL", -9, None)],
                         ids=["ctrl-c-after-run0", "ctrl-c-after-run1", "sigterm", "sigkill"])
def test_a_fault_between_two_checkpoints_resumes_bit_identically(reference, at: str, code: int, word) -> None:
    root, args, ref = reference
    out = root / "runs"
    res = _faulted([*args, "--steps", "100"], at)
    assert res.returncode == code, res.stderr[-2000:]  # 130 / 143, never SIGABRT (-6)
    if word is not None:
        assert res.stderr.strip().splitlines()[-1] == (
            f"{word}; rerun the same command with --resume to continue from the last checkpoint")
    run_ok(*args, "--steps", "100", "--resume")
    assert assert_same_tree(ref, out) > 10
    shutil.rmtree(out)
