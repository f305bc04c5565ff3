"""The attack runner: run directory, bit-identical resume, divergence, misuse."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from datarecon.attacks.base import AttackSetup
from datarecon.attacks.init import CandidateSpec, make_init
from datarecon.attacks.kkt import GradNormAttack, GradNormConfig, KKTAttack, KKTConfig
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import load_checkpoint, read_run, run_attack
from datarecon.attacks.loop import Plateau
from datarecon.errors import DataReconError

SHAPE = (1, 4, 4)


def _x0(seed=0, m=6):
    return make_init("gaussian", CandidateSpec(m=m, input_shape=SHAPE),
                     generator=torch.Generator().manual_seed(seed), scale=0.1)


def _run(target, prior, out, *, steps=20, seed=0, hooks=(), resume=False, config=None, early_stop=None):
    attack = KKTAttack(config or KKTConfig(steps=steps, lr_x=0.5, lr_lambda=0.01))
    return run_attack(attack,
                      AttackSetup(target, prior, _x0(seed), torch.Generator().manual_seed(seed), {"seed": seed}),
                      steps=steps, out=out,
                      loop=replace(ATTACK_LOOP, log_every=3, progress=False, checkpoint_every=4, resume=resume, hooks=hooks),
                      early_stop=early_stop)


def test_run_directory_contract(target, prior, tmp_path):
    rec = _run(target, prior, tmp_path / "run")
    tensors, meta = read_run(tmp_path / "run")
    assert set(tensors) >= {"x", "labels", "multipliers", "score_lambda", "score_margin", "score_contribution",
                            "score_uniqueness"}
    assert tensors["x"].shape == (6, *SHAPE) and torch.equal(tensors["x"], rec.x)
    for key in ("model_dir", "method", "config", "seed", "versions", "status", "steps_done", "wall_time_s", "final",
                "selection", "extra"):
        assert key in meta
    assert meta["status"] == "complete" and meta["steps_done"] == 20 and meta["method"] == "kkt"
    assert meta["selection"]["relative_residual"]["better"] == "lower"
    rows = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6, 9, 12, 15, 18, 20]


@pytest.mark.parametrize("kill_at", [6, 9], ids=["kill-at-checkpoint", "kill-between-checkpoints"])
def test_resume_is_bit_identical(kill_after, target, prior, tmp_path, kill_at):
    full = _run(target, prior, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        _run(target, prior, tmp_path / "part", hooks=[kill_after(kill_at)])
    # a hard kill loses what came after the last periodic checkpoint: emulate it by rolling back
    ckpt = load_checkpoint(tmp_path / "part")
    assert ckpt is not None and ckpt[1]["steps_done"] == kill_at
    resumed = _run(target, prior, tmp_path / "part", resume=True)
    assert resumed.steps_done == 20
    assert torch.equal(resumed.x, full.x) and torch.equal(resumed.multipliers, full.multipliers)
    hist = lambda p: (p / "history.jsonl").read_text()  # noqa: E731
    assert hist(tmp_path / "part") == hist(tmp_path / "full")


def test_kill_after_the_last_checkpoint_resumes_to_the_same_files(target, prior, tmp_path):
    """A kill between the final checkpoint and run.json (found by tests/faults at a random point):
    the resumed run writes the very same checkpoint, records and candidates, metrics included."""
    full = _run(target, prior, tmp_path / "full")
    _run(target, prior, tmp_path / "part")
    part = tmp_path / "part"
    (part / "run.json").unlink()  # what the killed process had not written yet
    (part / "candidates.safetensors").unlink()
    resumed = _run(target, prior, part, resume=True)
    assert torch.equal(resumed.x, full.x) and resumed.summary["final"] == full.summary["final"]
    assert (part / "history.jsonl").read_text() == (tmp_path / "full" / "history.jsonl").read_text()
    prog = lambda p: {k: v for k, v in json.loads((p / "checkpoint" / "progress.json").read_text()).items()  # noqa: E731
                      if k != "wall_time_s"}
    assert prog(part) == prog(tmp_path / "full") and prog(part)["metrics"]
    strip = lambda p: {k: v for k, v in json.loads((p / "run.json").read_text()).items()  # noqa: E731
                       if k not in ("wall_time_s", "versions")}
    assert strip(part) == strip(tmp_path / "full")


def test_resume_from_periodic_checkpoint_only(target, prior, tmp_path):
    """Hard kill: only the periodic checkpoint at step 8 survives (no after_run save)."""
    full = _run(target, prior, tmp_path / "full")
    _run(target, prior, tmp_path / "part", steps=8)  # same config except steps: checkpoint at 8
    resumed = _run(target, prior, tmp_path / "part", resume=True, steps=20)
    assert torch.equal(resumed.x, full.x)


def test_resume_with_other_config_is_refused(target, prior, tmp_path):
    _run(target, prior, tmp_path / "run", steps=4)
    with pytest.raises(DataReconError, match="was run with another method/config"):
        _run(target, prior, tmp_path / "run", resume=True, config=KKTConfig(steps=8, lr_x=0.25))


def test_divergence_keeps_last_finite_state(target, prior, tmp_path):
    attack = KKTAttack(KKTConfig(steps=30, lr_x=1e150, lr_lambda=0.0))
    with pytest.warns(RuntimeWarning, match="diverged at step .* lower lr_x, lr_lambda or the surrogate sharpness alpha"):
        rec = run_attack(attack, AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)),
                         out=tmp_path / "run", loop=replace(ATTACK_LOOP, progress=False))
    assert rec.status == "diverged" and rec.steps_done < 30
    assert torch.isfinite(rec.x).all()
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "diverged" and "lr_x" in meta["message"]


def test_early_stop_on_plateau(target, prior, tmp_path):
    rec = _run(target, prior, tmp_path / "run", steps=200,
               early_stop=Plateau("rel_residual", patience=2, rel_tol=0.5))
    assert rec.status == "stopped-early" and rec.steps_done < 200


def test_misuse(target, prior):
    attack = GradNormAttack(GradNormConfig(steps=1))
    g = torch.Generator().manual_seed(0)
    with pytest.raises(DataReconError, match=r"x0 has shape \(6, 1, 2, 2\)"):
        run_attack(attack, AttackSetup(target, prior, torch.zeros(6, 1, 2, 2), g),
                   loop=replace(ATTACK_LOOP, progress=False))
    from datarecon.attacks.base import AttackerPrior

    bad = AttackerPrior(labels=torch.tensor([0, 1]), input_shape=SHAPE)
    with pytest.raises(DataReconError, match="single-output model needs float labels"):
        run_attack(attack, AttackSetup(target, bad, _x0(m=2), g), loop=replace(ATTACK_LOOP, progress=False))


def test_resuming_a_finished_run_keeps_its_checkpoint_metrics(target, prior, tmp_path):
    """A finished run resumed (as a batch does for its runs that had finished before a kill) takes
    no step and rewrites its checkpoint with the same metrics, not an empty set."""
    _run(target, prior, tmp_path / "run")
    before = json.loads((tmp_path / "run" / "checkpoint" / "progress.json").read_text())
    _run(target, prior, tmp_path / "run", resume=True)
    after = json.loads((tmp_path / "run" / "checkpoint" / "progress.json").read_text())
    assert before["metrics"] and after["metrics"] == before["metrics"]
