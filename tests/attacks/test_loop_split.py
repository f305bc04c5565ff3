"""The runner's two parts: the optimisation loop writes no files, the run directory owns them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from datarecon.attacks.base import AttackSetup
from datarecon.attacks.init import CandidateSpec, make_init
from datarecon.attacks.kkt import KKTAttack, KKTConfig
from datarecon.attacks.loop import ATTACK_LOOP, AttackLoop
from datarecon.attacks.run_directory import HISTORY, RUN_JSON, RunDirectory, read_run
from datarecon.attacks.runner import run_attack
from datarecon.attacks.loop import Plateau
from datarecon.errors import DataReconError
from datarecon.kernel.engine import BaseHook, EarlyStop, Engine, History, LoopState, NaNStop
from datarecon.kernel.status import Status

SHAPE = (1, 4, 4)


def _x0():
    return make_init("gaussian", CandidateSpec(m=6, input_shape=SHAPE),
                     generator=torch.Generator().manual_seed(0), scale=0.1)


def _attack(steps=12):
    return KKTAttack(KKTConfig(steps=steps, lr_x=0.5, lr_lambda=0.01))


def test_loop_alone_writes_nothing_and_equals_run_attack(target, prior, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    attack = _attack()
    state = attack.init_state(target, prior, x0=_x0(), generator=torch.Generator().manual_seed(0))
    rows = []
    loop = AttackLoop(attack, target, prior, state, sink=rows.append, loop=replace(ATTACK_LOOP, log_every=3, progress=False))
    rec = loop.result(loop.run(start=0, total=12, elapsed_s=0.0))
    assert list(tmp_path.iterdir()) == []
    assert rec.status == Status.COMPLETE and rec.steps_done == 12 and rows == rec.history
    ref = run_attack(_attack(), AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)), steps=12,
                     out=tmp_path / "run", loop=replace(ATTACK_LOOP, log_every=3, progress=False))
    assert torch.equal(rec.x, ref.x) and torch.equal(rec.multipliers, ref.multipliers)
    assert rec.history == ref.history and rec.summary["final"] == ref.summary["final"]
    history = [json.loads(line) for line in (tmp_path / "run" / HISTORY).read_text().splitlines()]
    assert history == ref.history


def test_loop_reports_early_stop_and_divergence_without_files(target, prior):
    attack = _attack(200)
    state = attack.init_state(target, prior, x0=_x0(), generator=torch.Generator().manual_seed(0))
    loop = AttackLoop(attack, target, prior, state, early_stop=Plateau("rel_residual", patience=5, rel_tol=0.5),
                      loop=replace(ATTACK_LOOP, progress=False))
    assert loop.run_loop.status(LoopState(total=200)) == Status.RUNNING
    ls = loop.run(start=0, total=200, elapsed_s=0.0)
    rec = loop.result(ls)
    assert rec.status == Status.STOPPED_EARLY and rec.steps_done < 200
    progress = loop.run_loop.progress(ls, key="k", record={}, history=False)
    assert progress.status == Status.STOPPED_EARLY and progress.stop_state[0] and progress.history is None
    bad = KKTAttack(KKTConfig(steps=30, lr_x=1e30, lr_lambda=1e30))
    state = bad.init_state(target, prior, x0=_x0(), generator=torch.Generator().manual_seed(0))
    loop = AttackLoop(bad, target, prior, state, loop=replace(ATTACK_LOOP, progress=False))
    rec = loop.result(loop.run(start=0, total=30, elapsed_s=0.0))
    assert rec.status == Status.DIVERGED and "diverged" in rec.summary["message"]
    assert all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


def test_run_directory_round_trip_and_refusal(target, prior, tmp_path):
    run_attack(_attack(), AttackSetup(target, prior, _x0(), torch.Generator().manual_seed(0)), steps=12,
               out=tmp_path / "run", loop=replace(ATTACK_LOOP, log_every=3, progress=False, checkpoint_every=4))
    _, meta = read_run(tmp_path / "run")
    d = RunDirectory(tmp_path / "run", {"model_dir": meta["model_dir"]})
    ckpt = d.store(key=meta["resume_key"], chash=meta["config_hash"]).load()
    assert ckpt is not None and ckpt[1].steps_done == 12 and ckpt[1].status == Status.COMPLETE
    assert [r["step"] for r in d.history(upto=6)] == [3, 6]
    with pytest.raises(DataReconError, match="another model, initialisation, seed or prior"):
        d.store(key="other", chash=meta["config_hash"]).load()
    with pytest.raises(DataReconError, match="another method/config"):
        d.store(key=meta["resume_key"], chash="other").load()
    assert RunDirectory(tmp_path / "empty", {}).store(key="k", chash="c").load() is None
    fresh = RunDirectory(tmp_path / "fresh", {"method": "kkt"})
    fresh.begin([{"step": 3, "loss": 1.0}], steps_done=3, wall_time_s=0.5)
    fresh.append_history({"step": 6, "loss": 0.5})
    assert json.loads((tmp_path / "fresh" / RUN_JSON).read_text()) == {
        "method": "kkt", "status": "running", "steps_done": 3, "wall_time_s": 0.5}
    assert [json.loads(line)["step"] for line in (tmp_path / "fresh" / HISTORY).read_text().splitlines()] == [3, 6]


class _Seen(BaseHook):
    """Records the (step, metrics, stop reason) a progress display placed here would read."""

    def __init__(self) -> None:
        self.seen = []

    def after_step(self, state):
        self.seen.append((state.step, dict(state.metrics), state.stop_reason))


def test_attack_hook_order_is_equivalent_to_progress_first(target, prior):
    """The attack loop's progress display runs after the history, NaN stop and early stop (it ran first
    before the loops shared one order): they only read the metrics, so the display sees the same
    metrics, and the rows, stop reason and state are the same."""
    attack = _attack(200)
    state = attack.init_state(target, prior, x0=_x0(), generator=torch.Generator().manual_seed(0))
    before, plateau = _Seen(), Plateau("rel_residual", patience=5, rel_tol=0.5)
    history = History(every=3)
    hooks = [before, history, NaNStop(), EarlyStop(plateau, reason="stopped early: residual plateau")]
    old = Engine(lambda i: attack.step(target, prior, state, i), hooks=hooks).run(start=0, total=200)
    after = _Seen()
    loop = AttackLoop(_attack(200), target, prior,
                      _attack(200).init_state(target, prior, x0=_x0(), generator=torch.Generator().manual_seed(0)),
                      early_stop=Plateau("rel_residual", patience=5, rel_tol=0.5),
                      loop=replace(ATTACK_LOOP, log_every=3, progress=False, hooks=(after,)))
    new = loop.run(start=0, total=200, elapsed_s=0.0)
    assert [(s, m) for s, m, _ in before.seen] == [(s, m) for s, m, _ in after.seen]
    assert old.step < 200 and (old.step, old.stop_reason, old.metrics) == (new.step, new.stop_reason, new.metrics)
    assert history.rows == loop.history and torch.equal(state["x"], loop.state["x"])
