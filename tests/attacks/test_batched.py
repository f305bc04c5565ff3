"""Batched runs against one target: each run equals the same run executed alone (float64)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from datarecon.attacks import kkt_math, priors
from datarecon.attacks.base import AttackerPrior, AttackSetup
from datarecon.attacks.batched import BatchMember, run_batched
from datarecon.attacks.kkt_batched import kkt_batched_residual_and_grads
from datarecon.attacks.init import CandidateSpec, make_init
from datarecon.attacks.kkt import DecoRecoAttack, DecoRecoConfig, GradNormAttack, GradNormConfig, KKTAttack, KKTConfig
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import load_checkpoint, run_attack
from datarecon.attacks.loop import Plateau
from datarecon.errors import DataReconError

SHAPE = (1, 4, 4)


def _x0(seed: int, m: int = 6, scale: float = 0.1) -> torch.Tensor:
    return make_init("gaussian", CandidateSpec(m=m, input_shape=SHAPE),
                     generator=torch.Generator().manual_seed(seed), scale=scale)


@pytest.mark.parametrize("margin,k", [("binary", 1), ("multiclass", 3), ("regression", 1)])
def test_batched_gradients_equal_the_single_run_form(make_target, margin, k):
    """Per run: the same residual, hinge and gradients as kkt_math's single-run function (float64)."""
    from torch.func import functional_call

    from datarecon.attacks.surrogate import make_surrogate

    target = make_target(k=k, seed=1)
    model = make_surrogate("sigmoid-surrogate", target.model, alpha=20.0)

    def fwd(x, p):
        return functional_call(model, dict(p), (x,))

    g = torch.Generator().manual_seed(3)
    K, m = 4, 6
    x = torch.randn(K, m, *SHAPE, generator=g, dtype=torch.float64)
    lam = torch.rand(K, m, generator=g, dtype=torch.float64)
    labels = (torch.randint(0, k, (K, m), generator=g) if margin == "multiclass"
              else torch.randint(0, 2, (K, m), generator=g).double() * 2 - 1)
    objective = kkt_math.KKTObjective(margin=margin, lambda_min=0.45, lambda_min_weight=5.0, box_weight=0.0)
    terms, gx, gl = kkt_batched_residual_and_grads(fwd, target.params, x, labels, lam, objective=objective)
    box, box_grad = priors.box_value_and_grad(x.clone(), -0.5, 0.5, run_axis=True)
    for j in range(K):
        ref, rx, rl = kkt_math.kkt_residual_and_grads(
            fwd, target.params, x[j], labels[j], lam[j], objective=objective)
        for name in ("loss", "residual", "lambda_hinge"):
            torch.testing.assert_close(terms[name][j], ref[name], rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(gx[j], rx, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(gl[j], rl, rtol=1e-12, atol=1e-14)
        rb, rbg = priors.box_value_and_grad(x[j].clone(), -0.5, 0.5)
        torch.testing.assert_close(box[j], rb, rtol=0, atol=0)
        torch.testing.assert_close(box_grad[j], rbg, rtol=0, atol=0)


def _members(target, prior, out, *, configs, seeds, early=None, cls=DecoRecoAttack):
    return [BatchMember(attack=cls(c), prior=prior, x0=_x0(s), generator=torch.Generator().manual_seed(s),
                        out=None if out is None else out / f"run{j}", seed=s,
                        early_stop=early() if early is not None and j == 0 else None)
            for j, (c, s) in enumerate(zip(configs, seeds, strict=True))]


def _alone(target, prior, member, out, *, steps=None, resume=False, log_every=10, checkpoint_every=100):
    return run_attack(member.attack, AttackSetup(target, prior, member.x0, member.generator, {"seed": member.seed}),
                      steps=steps, out=out,
                      loop=replace(ATTACK_LOOP, log_every=log_every, progress=False, checkpoint_every=checkpoint_every, resume=resume),
                      early_stop=member.early_stop)


def _history(path):
    return [json.loads(line) for line in (path / "history.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["batched", "looped"])
def test_batch_equals_the_runs_alone_at_default_settings(target, prior, tmp_path, mode):
    """DecoReco at its defaults (1000 steps) in float64; run 0 stops early on its own plateau and
    run 2 (lr_x 1e150) diverges while run 1 goes on to the end."""
    base = DecoRecoConfig(dtype="float64")
    configs = [base, base, base.model_copy(update={"lr_x": 1e150})]
    seeds = [0, 1, 2]

    def early():
        return Plateau("rel_residual", patience=20, rel_tol=1e-3)

    with pytest.warns(RuntimeWarning, match="diverged"):
        batch = run_batched(_members(target, prior, tmp_path / "batch", configs=configs, seeds=seeds, early=early),
                            target, mode=mode, loop=replace(ATTACK_LOOP, progress=False))
    alone = []
    with pytest.warns(RuntimeWarning, match="diverged"):
        for j, mem in enumerate(_members(target, prior, None, configs=configs, seeds=seeds, early=early)):
            alone.append(_alone(target, prior, mem, tmp_path / f"alone{j}"))
    assert [r.status for r in batch] == ["stopped-early", "complete", "diverged"]
    assert [r.status for r in batch] == [r.status for r in alone]
    assert [r.steps_done for r in batch] == [r.steps_done for r in alone]
    assert batch[0].steps_done < 1000 and batch[1].steps_done == 1000 and batch[2].steps_done < 10
    exact = mode == "looped"  # looped: the single-run arithmetic itself
    for j, (b, a) in enumerate(zip(batch, alone, strict=True)):
        if exact:
            assert torch.equal(b.x, a.x) and torch.equal(b.multipliers, a.multipliers)
        else:
            torch.testing.assert_close(b.x, a.x, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(b.multipliers, a.multipliers, rtol=1e-12, atol=1e-12)
        hb, ha = _history(tmp_path / "batch" / f"run{j}"), _history(tmp_path / f"alone{j}")
        assert [r["step"] for r in hb] == [r["step"] for r in ha]
        for rb, ra in zip(hb, ha, strict=True):
            assert rb.keys() == ra.keys()
            for key in ("loss", "residual", "rel_residual", "box", "lambda_hinge"):
                if ra[key] is None:
                    assert rb[key] is None
                else:
                    assert rb[key] == pytest.approx(ra[key], rel=1e-12, abs=1e-15)
        meta_b = json.loads((tmp_path / "batch" / f"run{j}" / "run.json").read_text())
        meta_a = json.loads((tmp_path / f"alone{j}" / "run.json").read_text())
        for key in ("method", "config", "config_hash", "resume_key", "status", "steps_done", "seed", "stop_reason"):
            assert meta_b[key] == meta_a[key], key


def test_runs_with_other_objectives_share_the_barrier(target, prior, tmp_path):
    """A KKT run with another λ_min and a gradnorm run (no batched form) step beside a DecoReco pair."""
    cfgs = [DecoRecoConfig(dtype="float64", steps=40), DecoRecoConfig(dtype="float64", steps=40),
            DecoRecoConfig(dtype="float64", steps=40, lambda_min=0.3)]
    members = _members(target, prior, None, configs=cfgs, seeds=[0, 1, 2])
    grad = GradNormAttack(GradNormConfig(dtype="float64", steps=40, lr_x=0.05))
    members.append(BatchMember(attack=grad, prior=prior, x0=_x0(3), generator=torch.Generator().manual_seed(3)))
    batch = run_batched(members, target, loop=replace(ATTACK_LOOP, progress=False))
    fresh = _members(target, prior, None, configs=cfgs, seeds=[0, 1, 2])
    fresh.append(BatchMember(attack=GradNormAttack(grad.config), prior=prior, x0=_x0(3),
                             generator=torch.Generator().manual_seed(3)))
    for b, mem in zip(batch, fresh, strict=True):
        a = _alone(target, prior, mem, None)
        torch.testing.assert_close(b.x, a.x, rtol=1e-12, atol=1e-12)


def test_killed_batch_resumes_bit_identically(target, prior, tmp_path):
    """Only the periodic checkpoints survive a hard kill; the resumed batch ends bit for bit where an
    uninterrupted batch ends (every run directory, history included)."""
    cfg = DecoRecoConfig(dtype="float64", steps=60)

    def batch(out, *, steps, resume=False):
        return run_batched(_members(target, prior, out, configs=[cfg] * 3, seeds=[0, 1, 2]), target, steps=steps,
                           loop=replace(ATTACK_LOOP, log_every=4, progress=False, checkpoint_every=8, resume=resume))

    full = batch(tmp_path / "full", steps=60)
    batch(tmp_path / "part", steps=24)  # the state a kill after step 24 leaves (periodic checkpoint)
    assert all(load_checkpoint(tmp_path / "part" / f"run{j}")[1]["steps_done"] == 24 for j in range(3))
    resumed = batch(tmp_path / "part", steps=60, resume=True)
    for j, (r, f) in enumerate(zip(resumed, full, strict=True)):
        assert r.steps_done == 60 and torch.equal(r.x, f.x) and torch.equal(r.multipliers, f.multipliers)
        hist = lambda p: (p / f"run{j}" / "history.jsonl").read_text()  # noqa: E731
        assert hist(tmp_path / "part") == hist(tmp_path / "full")


@pytest.mark.parametrize("where,crash,done", [("gradients", 21, [10, 10, 10]), ("commit", 22, [11, 11, 10])])
def test_a_failed_step_leaves_consistent_checkpoints_and_the_batch_resumes(target, prior, tmp_path, monkeypatch,
                                                                           where, crash, done):
    """Two stacked groups (runs 0 and 1; run 2 with another λ_min) and a crash inside the shared step
    of round 11: in the gradients (computed for both groups before either commits: nothing is
    committed) or in group 2's commit (group 1 has committed its step 11). Every run's checkpoint
    matches its step count and the resumed batch, its runs at different steps, ends bit for bit
    where an uninterrupted one ends (each run keeps its row of its group's stacked state)."""
    from datarecon.attacks import kkt_batched as batched

    cfgs = [DecoRecoConfig(dtype="float64", steps=30)] * 2 + [DecoRecoConfig(dtype="float64", steps=30, lambda_min=0.3)]
    loop = replace(ATTACK_LOOP, progress=False, checkpoint_every=7)
    full = run_batched(_members(target, prior, tmp_path / "full", configs=cfgs, seeds=[0, 1, 2]), target, loop=loop)
    calls = {"n": 0}

    def crashing(original):
        def call(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == crash:
                raise RuntimeError("simulated crash")
            return original(*args, **kwargs)
        return call

    name = "kkt_batched_residual_and_grads" if where == "gradients" else "stacked_optimizer_step"
    monkeypatch.setattr(batched, name, crashing(getattr(batched, name)))
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_batched(_members(target, prior, tmp_path / "part", configs=cfgs, seeds=[0, 1, 2]), target, loop=loop)
    monkeypatch.undo()
    assert [load_checkpoint(tmp_path / "part" / f"run{j}")[1]["steps_done"] for j in range(3)] == done
    resumed = run_batched(_members(target, prior, tmp_path / "part", configs=cfgs, seeds=[0, 1, 2]), target,
                          loop=replace(loop, resume=True))
    for r, f in zip(resumed, full, strict=True):
        assert r.steps_done == 30
        assert torch.equal(r.x, f.x) and torch.equal(r.multipliers, f.multipliers)


def test_a_batch_run_directory_resumes_alone(target, prior, tmp_path):
    """The run directories of a batch are ordinary run directories: one resumes with run_attack."""
    cfg = KKTConfig(dtype="float64", steps=40, lr_x=0.5, lr_lambda=0.01)
    members = _members(target, prior, tmp_path / "batch", configs=[cfg] * 2, seeds=[0, 1], cls=KKTAttack)
    run_batched(members, target, steps=16, loop=replace(ATTACK_LOOP, progress=False, checkpoint_every=8))
    mem = _members(target, prior, None, configs=[cfg] * 2, seeds=[0, 1], cls=KKTAttack)[1]
    resumed = _alone(target, prior, mem, tmp_path / "batch" / "run1", resume=True, checkpoint_every=8)
    straight = _alone(target, prior, _members(target, prior, None, configs=[cfg] * 2, seeds=[0, 1],
                                              cls=KKTAttack)[1], tmp_path / "straight", checkpoint_every=8)
    assert resumed.steps_done == 40
    torch.testing.assert_close(resumed.x, straight.x, rtol=1e-12, atol=1e-12)


def test_float32_batched_runs_agree_with_looped_ones_to_the_stated_tolerance(target, prior):
    """DecoReco at its defaults in float32 (1000 steps, 4 runs): batched and looped agree within
    1e-4 absolute in x and λ (measured: at most 3e-6 in x and 6e-6 in λ; docs/DESIGN.md), the same
    steps and statuses."""
    cfg = DecoRecoConfig(dtype="float32")
    looped, batch = (run_batched(_members(target, prior, None, configs=[cfg] * 4, seeds=range(4)), target,
                                 mode=mode, loop=replace(ATTACK_LOOP, progress=False)) for mode in ("looped", "batched"))
    for a, b in zip(looped, batch, strict=True):
        assert (a.status, a.steps_done) == (b.status, b.steps_done) and a.x.dtype == torch.float32
        torch.testing.assert_close(b.x, a.x, rtol=0, atol=1e-4)
        torch.testing.assert_close(b.multipliers, a.multipliers, rtol=0, atol=1e-4)


def test_a_group_of_runs_is_one_stacked_state(target, prior):
    """The runs of a group hold rows (views) of one stacked state: the group's step updates them in
    place; runs with another objective or optimiser form other groups, gradnorm none."""
    from datarecon.attacks.batched import stack_groups
    from datarecon.attacks.runner import open_run

    cfgs = [DecoRecoConfig(dtype="float64", steps=5)] * 3 + [DecoRecoConfig(dtype="float64", steps=5, optimizer="adam")]
    members = _members(target, prior, None, configs=cfgs, seeds=range(4))
    runs = [open_run(m.attack, AttackSetup(target, prior, m.x0, m.generator), loop=ATTACK_LOOP) for m in members]
    grad = GradNormAttack(GradNormConfig(dtype="float64", steps=5))
    runs.append(open_run(grad, AttackSetup(target, prior, _x0(9), torch.Generator()), loop=ATTACK_LOOP))
    before = [r.state["x"].clone() for r in runs]
    groups = stack_groups(runs, target)
    assert sorted(groups) == [0, 1, 2, 3] and groups[0] is groups[1] is groups[2] and groups[3] is not groups[0]
    group = groups[0]
    assert group.state["x"].shape == (3, 6, *SHAPE) and group.state["opt.step"].shape == (3,)
    for j, run in enumerate(runs[:3]):
        assert torch.equal(run.state["x"], before[j])
        for key, t in run.state.items():
            assert t.data_ptr() == group.state[key][j].data_ptr(), key
    group.state["x"][1].add_(1.0)
    assert torch.equal(runs[1].state["x"], before[1] + 1.0) and torch.equal(runs[0].state["x"], before[0])


def test_auto_mode_is_looped_on_cpu_and_batched_on_cuda(target, prior):
    """``auto``: the looped arithmetic on CPU (bit for bit the runs alone), batched on CUDA and on
    devices AUTO_MODE does not list."""
    from datarecon.attacks.batched import resolve_mode

    assert [resolve_mode("auto", d) for d in ("cpu", "cuda", "cuda:1", "mps")] == ["looped", "batched", "batched",
                                                                                   "batched"]
    assert resolve_mode("batched", "cpu") == "batched" and resolve_mode("looped", "cuda") == "looped"
    cfg = DecoRecoConfig(dtype="float64", steps=20)
    auto = run_batched(_members(target, prior, None, configs=[cfg] * 2, seeds=[0, 1]), target, mode="auto",
                       loop=replace(ATTACK_LOOP, progress=False))
    for a, mem in zip(auto, _members(target, prior, None, configs=[cfg] * 2, seeds=[0, 1]), strict=True):
        alone = _alone(target, prior, mem, None)
        assert torch.equal(a.x, alone.x) and torch.equal(a.multipliers, alone.multipliers)


def test_misuse(target, prior):
    with pytest.raises(DataReconError, match="unknown batch mode 'fast'; valid modes: auto, batched, looped"):
        run_batched(_members(target, prior, None, configs=[KKTConfig()], seeds=[0], cls=KKTAttack), target,
                    mode="fast")
    with pytest.raises(DataReconError, match="at least one run"):
        run_batched([], target)
    bad = AttackerPrior(labels=torch.tensor([0, 1]), input_shape=SHAPE)
    members = _members(target, prior, None, configs=[KKTConfig(steps=3)] * 2, seeds=[0, 1], cls=KKTAttack)
    members[1] = BatchMember(attack=members[1].attack, prior=bad, x0=_x0(1, m=2), generator=torch.Generator())
    with pytest.raises(DataReconError, match="float labels"):
        run_batched(members, target, loop=replace(ATTACK_LOOP, progress=False))
