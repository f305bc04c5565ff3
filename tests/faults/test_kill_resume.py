"""SIGKILL at a random step, then resume: the artefacts equal an uninterrupted run's, bit for bit.

Train, the KKT attack, the bilevel attack and a paper reproduction are killed (SIGKILL, as the OOM
killer or a lost node would) right after a step drawn from the test's seeded generator, by the
test-only step hook of the engine (``DATARECON_FAULT_AT_STEP``): the point is exact and replays
with the seed, whatever the machine's load. They are rerun with ``--resume`` and the result is
compared file by file with an uninterrupted run written to the same paths (``faultlib.assert_same_tree``).
A membership evaluation is killed between two reference models (as soon as one's completion marker is written)
and inside one; called again once finished it changes no byte.
Kills at arbitrary moments (inside a write) are the business of ``adversarial_trials.py`` and the
atomic-write tests.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from faultlib import LOCK, assert_same_tree, kill_at, read_json_or_none, run_faulted, run_ok, set_aside, start

pytestmark = pytest.mark.slow

TRAIN = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "10", "--hidden", "16", "--no-bias",
         "--init-scale", "1e-2", "--lr", "0.5", "--epochs", "1000", "--checkpoint-every", "10", "--dtype", "float64",
         "--no-progress"]
KKT = ["reconstruct", "--no-progress", "--steps", "200", "--checkpoint-every", "10", "--candidates", "8",
       "--init-scale", "0.05", "--lr-x", "0.01", "--lr-lambda", "0.01", "--lambda-min", "0.2"]
AFFINE = ["train", "--dataset", "digits", "--task", "odd-even", "--n-per-class", "5", "--arch", "affine",
          "--loss", "logistic", "--weight-decay", "1e-2", "--optimizer", "lbfgs", "--lr", "1", "--epochs", "30",
          "--dtype", "float64", "--no-progress"]
BILEVEL = ["reconstruct", "--no-progress", "--method", "bilevel", "--hessian", "cg", "--steps", "40",
           "--checkpoint-every", "2", "--candidates", "4", "--init", "uniform"]
REPRODUCTION = """\
datasets:
  - dataset: digits
    task: odd-even
    runs:
      - {init_scale: 0.01, lr_x: 0.05, lambda_min: 0.4, alpha: 20}
      - {init_scale: 0.01, lr_x: 0.05, lambda_min: 0.4, alpha: 20, seed: 1}
n_per_class: 4
n_heldout_per_class: 4
target:
  arch: {name: mlp, hidden: [16], bias: false, init_scale: 1.0e-2}
  epochs: 200
  kkt_score: false
attack: {steps: 400, dtype: float64}
keep: 1
evaluation: {n_floor_noise: 20, grid_max: 8}
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "model"
    run_ok(*TRAIN, "--epochs", "100", "--out", str(out))
    return out


@pytest.fixture(scope="module")
def affine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "affine"
    run_ok(*AFFINE, "--out", str(out))
    return out


@pytest.mark.parametrize("batches, epochs", [([], 1000), (["--batch-size", "7", "--epochs", "300"], 300)],
                         ids=["full-batch", "mini-batch"])
def test_train(batches: list[str], epochs: int, tmp_path: Path, rng) -> None:
    out = tmp_path / "m"
    args = [*TRAIN, *batches, "--out", str(out)]
    run_ok(*args)
    ref = set_aside(out)
    epoch = rng.randrange(10, epochs - 10)
    proc = run_faulted(*args, step=epoch)
    assert proc.returncode == -9 and not (out / "model.json").exists()
    assert json.loads((out / "checkpoint" / "progress.json").read_text())["steps_done"] == epoch // 10 * 10
    run_ok(*args, "--resume")
    assert assert_same_tree(ref, out) >= 5


@pytest.mark.parametrize("method", ["kkt", "bilevel"])
def test_attack(method: str, model: Path, affine: Path, tmp_path: Path, rng) -> None:
    out = tmp_path / "run"
    args = [*KKT, "--model", str(model)] if method == "kkt" else [*BILEVEL, "--model", str(affine)]
    args += ["--out", str(out)]
    run_ok(*args)
    ref = set_aside(out)
    total = 200 if method == "kkt" else 40
    step = rng.randrange(2, int(0.7 * total))
    proc = run_faulted(*args, step=step)
    assert proc.returncode == -9 and json.loads((out / "run.json").read_text())["status"] == "running"
    run_ok(*args, "--resume")
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert assert_same_tree(ref, out) >= 4


def test_reproduction(tmp_path: Path, rng) -> None:
    (tmp_path / "c.yaml").write_text(REPRODUCTION)
    out = tmp_path / "rep"
    args = ["reproduce", "haim2022", "--scale", "smoke", "--config", str(tmp_path / "c.yaml"), "--threads", "1",
            "--out", str(out)]
    run_ok(*args)
    ref = set_aside(out)
    # a random point: in the first or the second attack, at a random step
    j = rng.randrange(2)
    run = out / "runs" / "digits" / f"run{j}" / "run"
    step = rng.randrange(20, 300)
    proc = run_faulted(*args, step=step, loop=1 + j)  # loop 0 trains the target, then run0, run1
    assert proc.returncode == -9 and not (out / "report.html").exists()
    assert json.loads((run / "run.json").read_text())["status"] == "running"
    run_ok(*args, "--resume")
    assert read_json_or_none(out / "tables" / "DONE.json") is not None
    assert assert_same_tree(ref, out) >= 20


def test_reproduction_killed_while_training(tmp_path: Path, rng) -> None:
    """A kill inside a target's training (a reproduction checkpoints it every 5% of its epochs): the
    rerun with --resume continues that training from its checkpoint and ends with the same files."""
    (tmp_path / "c.yaml").write_text(REPRODUCTION.replace("epochs: 200", "epochs: 4000"))
    out = tmp_path / "rep"
    args = ["reproduce", "haim2022", "--scale", "smoke", "--config", str(tmp_path / "c.yaml"), "--threads", "1",
            "--out", str(out)]
    run_ok(*args)
    ref = set_aside(out)
    model = out / "models" / "digits"
    epoch = rng.randrange(200, 3000)
    proc = run_faulted(*args, step=epoch)
    assert proc.returncode == -9 and not (model / "DONE.json").exists()
    res = run_ok(*args, "--resume")
    assert "train: resumed at epoch " in res.stderr, res.stderr[-2000:]
    assert assert_same_tree(ref, out) >= 20


MEMBERSHIP = ["membership", "--evaluate", "--references", "3", "--no-progress", "--threads", "1"]


def _membership_result(folder: Path) -> dict:
    """``membership.json`` without what says how the call ran (its wall times, the models trained or reused)."""
    record = json.loads((folder / "membership.json").read_text())
    record.pop("wall_time_s", None)
    for key in ("reused", "trained", "wall_time_s"):
        record["references"].pop(key, None)
    return record


def test_a_finished_membership_folder_called_again_changes_no_byte(model: Path, tmp_path: Path) -> None:
    """The same membership command into its finished folder: it finds the evaluation done (membership.json records
    it, every reference model's marker is there), trains nothing, rewrites nothing and prints what it printed."""
    out = tmp_path / "mem"
    args = [*MEMBERSHIP, "--model", str(model), "--out", str(out)]
    first = run_ok(*args)
    before = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != LOCK}
    again = run_ok(*args)
    assert {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != LOCK} == before
    printed = [line for line in first.stdout.splitlines() if "reference models trained in" not in line
               and not line.startswith("training 3 reference models")]
    assert again.stdout.splitlines() == printed


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_membership_killed_between_two_reference_models(model: Path, tmp_path: Path, rng, sig) -> None:
    """Killed (SIGKILL, or Ctrl-C to its process group) as soon as reference model k's completion marker is written,
    then the same command again: models 0..k are kept (not trained again), the others trained, and every file equals
    an uninterrupted call's, membership.json included but for the models trained and reused."""
    out = tmp_path / "mem"
    args = [*MEMBERSHIP, "--model", str(model), "--out", str(out)]
    run_ok(*args)
    ref = set_aside(out)
    k = rng.randrange(0, 2)
    proc = start(*args, new_session=True)
    kill_at(proc, lambda: (out / "references" / f"ref-{k:05d}" / "DONE.json").is_file(), rng, jitter_s=0.0, sig=sig,
            group=True)
    assert proc.returncode in (-9, 130, -2), proc.returncode
    assert not (out / "membership.json").exists()
    kept = {d.name for d in (out / "references").iterdir() if (d / "DONE.json").is_file()}
    assert f"ref-{k:05d}" in kept and len(kept) < 3, kept
    again = run_ok(*args)
    assert f"training {3 - len(kept)} reference models ({len(kept)} kept from an earlier call)" in again.stdout
    assert assert_same_tree(ref, out, skip=("membership.json",)) >= 12
    got = json.loads((out / "membership.json").read_text())["references"]
    assert (got["reused"], got["trained"]) == (len(kept), 3 - len(kept))
    assert _membership_result(out) == _membership_result(ref)


def test_membership_killed_while_training_a_reference_model(model: Path, tmp_path: Path, rng) -> None:
    """SIGKILL inside the training of one of the K reference models (the k-th training loop of the call:
    the target is given, nothing else trains), then the same command again: the finished models are
    kept, the one in flight is trained afresh, and every file equals an uninterrupted call's."""
    out = tmp_path / "mem"
    args = ["membership", "--model", str(model), "--evaluate", "--references", "3", "--out", str(out),
            "--no-progress", "--threads", "1"]
    run_ok(*args)
    ref = set_aside(out)
    loop, step = rng.randrange(0, 3), rng.randrange(1, 99)
    proc = run_faulted(*args, step=step, loop=loop)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not (out / "membership.json").exists()
    run_ok(*args)
    assert assert_same_tree(ref, out, skip=("membership.json",)) >= 5
    # membership.json too, but for what the second call did: it reused the models finished before the kill
    want, got = (json.loads((d / "membership.json").read_text()) for d in (ref, out))
    assert (got["references"]["reused"], got["references"]["trained"]) == (loop, 3 - loop)
    for record in (want, got):
        record.pop("wall_time_s", None)
        for key in ("reused", "trained", "wall_time_s"):
            record["references"].pop(key, None)
    assert got == want
