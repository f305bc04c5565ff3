"""The bilevel attack end to end: planted solutions, misuse, registry, runner, resume (float64)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from datarecon.attacks import ATTACKS, run_attack
from datarecon.attacks.base import AttackerPrior, AttackSetup, Target
from datarecon.attacks.bilevel import BilevelAttack, BilevelConfig, FlatLayout, lbfgs_minimize, make_energy
from datarecon.attacks.bilevel.problem import THETA0, value_and_grad
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import load_checkpoint, read_run
from datarecon.errors import DataReconError

DT = torch.float64
SHAPE = (1, 3, 3)
WD = 0.05


@pytest.fixture(scope="module")
def planted():
    """An affine classifier trained (to ‖∇E‖ ≤ 1e-13) with weight decay on 6 known images."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 1)).double()
    layout = FlatLayout({k: v.detach() for k, v in model.named_parameters()})
    x_gt = torch.rand(6, *SHAPE, generator=g, dtype=DT) - 0.5
    y = torch.tensor([1.0, 1, 1, -1, -1, -1], dtype=DT)
    energy = make_energy(model, layout, y, loss="logistic", weight_decay=WD)
    theta = lbfgs_minimize(value_and_grad(energy, x_gt), torch.zeros(layout.size, dtype=DT), tol=1e-13,
                           max_iter=1000).theta
    target = Target(model=model, params=layout.unflatten(theta.clone()), loss="logistic", weight_decay=WD,
                    input_shape=SHAPE, num_outputs=1)
    prior = AttackerPrior(labels=y, input_shape=SHAPE, lower=-0.5, upper=0.5)
    return target, prior, x_gt


def _run(target, prior, x0, *, steps, out=None, resume=False, **cfg):
    attack = BilevelAttack(BilevelConfig(steps=steps, **cfg))
    return run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(0)), out=out,
                      loop=replace(ATTACK_LOOP, log_every=1, progress=False, checkpoint_every=2, resume=resume))


@pytest.mark.parametrize("hessian", ["cg", "qn", "neumann"])
def test_ground_truth_initialisation_stays(planted, hessian):
    target, prior, x_gt = planted
    rec = _run(target, prior, x_gt.clone(), steps=10, lr_x=0.1, hessian=hessian, inner_tol=1e-11)
    assert rec.status == "complete"
    assert float((rec.x - x_gt).norm()) < 1e-8
    assert rec.summary["extra"]["param_distance"] < 1e-18


@pytest.mark.parametrize("hessian", ["cg", "qn", "neumann"])
def test_perturbed_initialisation_moves_back(planted, hessian):
    """From x_GT + 0.01·N(0,1): ‖θ* − θ(x)‖² falls by > 100x and x moves toward x_GT (only the
    components of x that change θ are restored: the affine problem's level sets are large)."""
    target, prior, x_gt = planted
    x0 = x_gt + 0.01 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(1), dtype=DT)
    rec = _run(target, prior, x0, steps=60, lr_x=0.05, hessian=hessian, inner_tol=1e-10)
    first, last = rec.history[0]["param_distance"], rec.summary["extra"]["param_distance"]
    assert last < first / 100
    extra = rec.summary["extra"]
    assert extra["param_distance_x0"] == first  # the no-attack reference: θ(x⁰) before any x update
    assert extra["param_distance_per_parameter"] == last / extra["num_parameters"]
    assert extra["param_distance_x0_per_parameter"] == first / extra["num_parameters"]
    assert float((rec.x - x_gt).norm()) < 0.95 * float((x0 - x_gt).norm())


def test_logistic_without_weight_decay_is_refused(planted):
    target, prior, x_gt = planted
    bare = Target(model=target.model, params=target.params, loss="logistic", weight_decay=0.0,
                  input_shape=SHAPE, num_outputs=1)
    with pytest.raises(DataReconError, match="zero weight decay has none.*weight_decay_override") as exc:
        BilevelAttack().init_state(bare, prior, x0=x_gt, generator=torch.Generator())
    assert "\n" not in str(exc.value)
    ok = BilevelAttack(BilevelConfig(weight_decay_override=0.05))
    state = ok.init_state(bare, prior, x0=x_gt, generator=torch.Generator())
    assert state["theta"].shape == (10,)


@pytest.mark.parametrize("field,value,names", [
    ("hessian", "lu", "cg, neumann, pcg, qn"),
    ("curvature", "exact", "gauss-newton, hessian"),
    ("inner_activation", "gelu", "softplus, target"),
    ("theta0", "zeros", "default, target, uniform"),
    ("upper_loss", "l1", "normalised, sq"),
    ("line_search", "exact", "armijo, strong-wolfe"),
])
def test_unknown_names_list_valid_ones(field, value, names):
    with pytest.raises(DataReconError, match=f"valid names: {names}"):
        BilevelConfig(**{field: value})


def test_registered_and_buildable_from_config():
    entry = ATTACKS.get("bilevel")
    assert entry is BilevelAttack
    attack = entry.from_config(BilevelConfig(hessian="qn"))
    assert attack.name == "bilevel" and attack.config.hessian == "qn"
    from datarecon.experiments.reconstruct import method_config

    cfg = method_config("bilevel", {"hessian": "neumann"}, steps=3)
    assert isinstance(cfg, BilevelConfig) and cfg.steps == 3


def test_run_directory_records_extra_and_resume_is_bit_identical(planted, tmp_path):
    target, prior, x_gt = planted
    x0 = x_gt + 0.05 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(2), dtype=DT)
    cfg = dict(lr_x=0.05, hessian="cg", theta0="uniform", inner_tol=1e-9)
    full = _run(target, prior, x0, steps=6, out=tmp_path / "full", **cfg)
    _run(target, prior, x0, steps=3, out=tmp_path / "part", **cfg)
    resumed = _run(target, prior, x0, steps=6, out=tmp_path / "part", resume=True, **cfg)
    assert torch.equal(full.x, resumed.x)
    a, _ = load_checkpoint(tmp_path / "full")
    b, _ = load_checkpoint(tmp_path / "part")
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert {"theta", "p", "lbfgs.s", "lbfgs.y", "lbfgs.meta", "opt.x.momentum"} <= set(a)
    _, run = read_run(tmp_path / "full")
    extra = run["extra"]
    for key in ("param_distance", "inner_residual_final", "inner_residual_max", "hvp_count", "inner_iterations"):
        assert key in extra
    assert extra["hvp_count"] > 0 and extra["inner_iterations"] > 0 and extra["outer_steps"] == 6
    assert run["extra"] == resumed.summary["extra"]


@pytest.mark.parametrize("theta0", ["uniform", "target", "default"])
def test_theta0_choices_and_float32(planted, theta0):
    target, prior, x_gt = planted
    rec = _run(target, prior, x_gt.float(), steps=2, lr_x=0.05, theta0=theta0, dtype="float32", inner_tol=1e-5)
    assert rec.x.dtype == torch.float32 and rec.status == "complete"
    assert rec.summary["extra"]["param_distance"] < 1e-6


def test_theta0_uniform_is_unit_interval_and_seeded(planted):
    target, _, _ = planted
    layout = FlatLayout(target.params)
    star = layout.flatten(target.params)
    a = THETA0.get("uniform")(target.model, layout, star, generator=torch.Generator().manual_seed(3))
    b = THETA0.get("uniform")(target.model, layout, star, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and float(a.min()) >= 0 and float(a.max()) <= 1


def test_box_prior_pulls_into_range(planted):
    target, prior, x_gt = planted
    x0 = x_gt.clone()
    x0[0, 0, 0, 0] = 2.0  # far outside [-0.5, 0.5]
    rec = _run(target, prior, x0, steps=20, lr_x=0.05, box_weight=5.0)
    assert float(rec.x[0, 0, 0, 0]) < 1.0
    assert rec.history[-1]["box"] < rec.history[0]["box"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(planted):
    target, prior, x_gt = planted
    x0 = x_gt + 0.01 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(1), dtype=DT)
    cpu = _run(target, prior, x0, steps=5, lr_x=0.05, inner_tol=1e-10)
    gpu_target = target.to(device="cuda")
    gpu_prior = AttackerPrior(labels=prior.labels.cuda(), input_shape=SHAPE, lower=-0.5, upper=0.5)
    gpu = _run(gpu_target, gpu_prior, x0.cuda(), steps=5, lr_x=0.05, inner_tol=1e-10)
    torch.testing.assert_close(gpu.x.cpu(), cpu.x, rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def relu_target():
    """A one-hidden ReLU classifier with weight decay: its energy has kinks where ∇²E is indefinite."""
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 8), nn.ReLU(), nn.Linear(8, 1)).double()
    layout = FlatLayout({k: v.detach() for k, v in model.named_parameters()})
    x = torch.rand(6, *SHAPE, generator=g, dtype=DT) - 0.5
    y = torch.tensor([1.0, 1, 1, -1, -1, -1], dtype=DT)
    energy = make_energy(model, layout, y, loss="logistic", weight_decay=WD)
    start = layout.flatten(dict(model.named_parameters())).detach()
    theta = lbfgs_minimize(value_and_grad(energy, x), start, tol=1e-10, max_iter=500).theta
    target = Target(model=model, params=layout.unflatten(theta.clone()), loss="logistic", weight_decay=WD,
                    input_shape=SHAPE, num_outputs=1)
    prior = AttackerPrior(labels=y, input_shape=SHAPE, lower=-0.5, upper=0.5)
    return target, prior, torch.rand(6, *SHAPE, generator=g, dtype=DT) - 0.5


def test_negative_curvature_warns_with_the_plain_hessian_only(relu_target, recwarn):
    target, prior, x0 = relu_target
    rec = _run(target, prior, x0, steps=3, lr_x=0.1, curvature="hessian", damping=0.0, hessian="cg")
    assert any(h["negative_curvature"] for h in rec.history)
    assert any("negative curvature" in str(w.message) and "gauss-newton" in str(w.message) for w in recwarn.list)
    assert rec.summary["extra"]["solve_negative_curvature_steps"] > 0
    recwarn.clear()
    _run(target, prior, x0, steps=3, lr_x=0.1, curvature="hessian", damping=1.0)
    assert not any("negative curvature" in str(w.message) for w in recwarn.list)


def test_kinked_targets_get_the_nonsmooth_treatment_by_default(planted, relu_target):
    from datarecon.attacks.bilevel import NONSMOOTH, SMOOTH

    relu, relu_prior, relu_x0 = relu_target
    rec = _run(relu, relu_prior, relu_x0, steps=2)
    extra = rec.summary["extra"]
    assert extra["target_has_kinks"] is True
    assert (extra["curvature"], extra["damping"], extra["inner_activation"], extra["max_step"]) == (
        NONSMOOTH.curvature, NONSMOOTH.damping, NONSMOOTH.inner_activation, NONSMOOTH.max_step)
    assert extra["solve_negative_curvature_steps"] == 0
    target, prior, x_gt = planted
    extra = _run(target, prior, x_gt.clone(), steps=1).summary["extra"]
    assert extra["target_has_kinks"] is False
    assert (extra["curvature"], extra["damping"], extra["inner_activation"]) == (
        SMOOTH.curvature, SMOOTH.damping, SMOOTH.inner_activation)
    assert extra["max_step"] is None  # no cap on smooth targets
    # explicit settings win over the automatic choice
    cfg = BilevelConfig(curvature="hessian", damping=0.5, inner_activation="softplus", max_step=0.2)
    assert cfg.treatment(kinks=True) == cfg.treatment(kinks=False)
    assert cfg.treatment(kinks=True).damping == 0.5


def test_softplus_inner_energy_reports_the_target_energy_distance(relu_target):
    target, prior, x0 = relu_target
    rec = _run(target, prior, x0, steps=2, inner_activation="softplus", softplus_beta=20.0)
    extra = rec.summary["extra"]
    assert extra["inner_activation"] == "softplus"
    # Table 1's distance is θ(x) of the target's own energy; the surrogate's is kept beside it
    assert extra["param_distance"] != extra["param_distance_inner_energy"]
    assert abs(extra["param_distance"] - extra["param_distance_inner_energy"]) < 0.5 * extra["param_distance"]


def test_problem_derived_step_keeps_a_ground_truth_start_in_place(planted):
    """Default step (lr_x None): Polyak trial + Armijo backtracking on ‖θ* − θ(x)‖². At the
    ground truth l ≈ 0, so every step is tiny: x stays put (METHODS §7: Adam, or SGD with a
    large fixed step, drift)."""
    target, prior, x_gt = planted
    rec = _run(target, prior, x_gt.clone(), steps=10)
    assert rec.status == "complete"
    moved = float((rec.x - x_gt).norm())
    assert moved < 1e-5
    assert rec.summary["extra"]["param_distance"] < 1e-9  # the inner solve's accuracy (inner_tol 1e-6)
    fixed = _run(target, prior, x_gt.clone(), steps=10, lr_x=10.0)  # the reproductions' former setting
    assert float((fixed.x - x_gt).norm()) > 10 * moved


@pytest.mark.parametrize("hessian", ["pcg", "cg", "neumann", "qn"])
def test_problem_derived_step_solves_the_perturbed_problem_without_tuning(planted, hessian):
    """From x_GT + 0.01·N(0,1) with no lr_x: ‖θ* − θ(x)‖² falls by > 1e4 in 30 steps, every accepted
    step decreases it (Armijo), and every linear solve reports its residual."""
    target, prior, x_gt = planted
    x0 = x_gt + 0.01 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(1), dtype=DT)
    rec = _run(target, prior, x0, steps=30, hessian=hessian, inner_tol=1e-10)
    first, last = rec.history[0]["param_distance"], rec.summary["extra"]["param_distance"]
    assert last < first / 1e4
    losses = [h["loss"] for h in rec.history]
    assert all(b <= a for a, b in zip(losses, losses[1:]))
    assert all("solve_residual" in h and h["lr_x"] >= 0 for h in rec.history)
    extra = rec.summary["extra"]
    if hessian == "qn":
        assert extra["solve_nonconverged_steps"] > 0 and extra["solve_residual_max"] > 1e-6
    else:
        assert extra["solve_residual_max"] <= 1e-6 and extra["solve_nonconverged_steps"] == 0
    assert float((rec.x - x_gt).norm()) < float((x0 - x_gt).norm())


def test_problem_derived_step_never_moves_x_more_than_max_step(planted):
    """With ``max_step`` set, every accepted step satisfies ‖Δx‖ ≤ max_step·‖x‖ (the cap of the
    Polyak trial; the default on ReLU targets); without it (the default on smooth targets) the first
    step is larger, so the cap is what bounds it."""
    target, prior, x_gt = planted
    x0 = x_gt + 0.3 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(2), dtype=DT)

    def moves(max_step: float | None) -> list[tuple[float, float]]:
        attack = BilevelAttack(BilevelConfig(max_step=max_step, inner_tol=1e-10))
        state = attack.init_state(target, prior, x0=x0, generator=torch.Generator().manual_seed(0))
        out = []
        for k in range(6):
            before = state["x"].clone()
            attack.step(target, prior, state, k)
            out.append((float((state["x"] - before).norm()), float(before.norm())))
        return out

    capped = moves(0.01)
    assert all(dx <= 0.01 * nx * (1 + 1e-9) for dx, nx in capped)
    assert sum(dx > 0 for dx, _ in capped) >= 5  # steps are taken, not all rejected
    free = moves(None)
    assert free[0][0] > 2 * capped[0][0]


def test_line_search_accepts_only_a_real_decrease(planted):
    """An inner solve that never moves (tolerance 10: θ⁰ already 'solves' it) leaves the upper loss
    unchanged at every trial point: every step must be rejected and x must stay, even once the
    Armijo decrease c1·t·‖∇l‖² falls below the rounding of l (it would then accept a no-op step,
    and the step size could never recover)."""
    target, prior, x_gt = planted
    x0 = x_gt + 0.1 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(3), dtype=DT)
    rec = _run(target, prior, x0, steps=15, inner_tol=10.0)
    assert rec.summary["extra"]["rejected_steps"] == 15
    assert all(h["lr_x"] == 0.0 for h in rec.history)
    torch.testing.assert_close(rec.x, x0, rtol=0, atol=0)


@pytest.mark.parametrize("after_resolve", [0.2, 0.9])
def test_failed_first_trial_makes_the_re_solve_at_x_the_reference(planted, monkeypatch, after_resolve):
    """Scripted inner solves (l = f0 + 1 at the first trial point, f0 + 0.5 re-solved at x itself,
    f0 + ``after_resolve`` at the second trial): the second trial is judged against f0 + 0.5, so
    0.2 is accepted; 0.9 is not, and then θ at x becomes the re-solved one (x stays)."""
    from types import SimpleNamespace

    from datarecon.attacks.bilevel.attack import _LineSearchStart

    target, prior, x_gt = planted
    attack = BilevelAttack(BilevelConfig(max_step=1e-3))
    pr = attack.problem(target, prior)
    e = torch.zeros_like(pr.theta_star)
    e[0] = 1.0
    f0 = 1.0

    def theta_with(value):  # ‖θ − θ*‖² = value
        return pr.theta_star + value ** 0.5 * e

    script = iter([f0 + 1.0, f0 + 0.5] + [f0 + after_resolve] * 10)
    calls = []

    def fake_inner(energy_fn, x, theta, memory, *, first, tol=None):
        calls.append(x)
        return SimpleNamespace(theta=theta_with(next(script)), grad_norm=1e-3, iterations=3, evaluations=4,
                               new_pairs=[])

    monkeypatch.setattr(attack, "_inner", fake_inner)
    grad = torch.full_like(x_gt, 1e-3)
    start = _LineSearchStart(x=x_gt, theta=theta_with(f0), grad_x=grad, f0=f0, tol=1e-6, pairs=[])
    ls = attack._line_search(pr, target, prior, start, last_step=0.0)
    assert torch.equal(calls[1], x_gt)  # the second solve is at x itself
    assert ls.drift == pytest.approx(0.5)
    if after_resolve < 0.5:
        assert ls.accepted and ls.trials == 2
        assert float(((ls.theta - pr.theta_star) ** 2).sum()) == pytest.approx(f0 + after_resolve)
    else:
        assert not ls.accepted and torch.equal(ls.x, x_gt)
        assert float(((ls.theta - pr.theta_star) ** 2).sum()) == pytest.approx(f0 + 0.5)  # θ re-solved at x


def test_distance_schedule_with_the_problem_derived_step_warns_on_kinked_targets(relu_target, recwarn):
    target, prior, x0 = relu_target
    _run(target, prior, x0, steps=1, inner_tol_schedule="distance")
    assert any("inner_tol_schedule 'distance'" in str(w.message) for w in recwarn.list)
    recwarn.clear()
    _run(target, prior, x0, steps=1)
    assert not any("inner_tol_schedule" in str(w.message) for w in recwarn.list)


def test_optimizer_options_need_a_fixed_step():
    with pytest.raises(DataReconError, match="needs a fixed step on x; pass lr_x") as exc:
        BilevelConfig(optimizer="adam")
    assert "\n" not in str(exc.value)
    with pytest.raises(DataReconError, match="pass lr_x"):
        BilevelConfig(momentum=0.9)
    with pytest.raises(DataReconError, match="momentum 0.5 .* pass lr_x"):  # any constant of the optimiser
        BilevelConfig(momentum=0.5, nesterov=True)
    with pytest.raises(DataReconError, match="group_weight.* pass a fixed step"):  # the line search holds one run
        BilevelConfig(group_weight=0.1)
    assert BilevelConfig(optimizer="adam", lr_x=0.01).lr_x == 0.01


def test_resume_is_bit_identical_with_the_problem_derived_step_and_neumann(planted, tmp_path):
    target, prior, x_gt = planted
    x0 = x_gt + 0.05 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(2), dtype=DT)
    cfg = dict(hessian="neumann", inner_tol=1e-9)
    full = _run(target, prior, x0, steps=6, out=tmp_path / "full", **cfg)
    _run(target, prior, x0, steps=3, out=tmp_path / "part", **cfg)
    resumed = _run(target, prior, x0, steps=6, out=tmp_path / "part", resume=True, **cfg)
    assert torch.equal(full.x, resumed.x)
    a, _ = load_checkpoint(tmp_path / "full")
    b, _ = load_checkpoint(tmp_path / "part")
    assert {"bilevel.eigvec", "bilevel.step", "bilevel.solved"} <= set(a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert full.summary["extra"] == resumed.summary["extra"]


def test_distance_tolerance_schedule_loosens_early_and_still_converges(planted):
    """inner_tol_schedule="distance": tol_k = clip(0.1·wd·‖θ* − θ_{k−1}‖, inner_tol, inner_tol_max) —
    loose while θ is far from θ*, tight near it, and the planted problem is still solved."""
    target, prior, x_gt = planted
    x0 = x_gt + 0.01 * torch.randn(x_gt.shape, generator=torch.Generator().manual_seed(1), dtype=DT)
    cfg = dict(steps=60, lr_x=0.05, inner_tol=1e-10, inner_tol_max=1e-3)
    fixed = _run(target, prior, x0, **cfg)
    sched = _run(target, prior, x0, inner_tol_schedule="distance", **cfg)
    tols = [h["inner_tol"] for h in sched.history]
    assert all(1e-10 <= t <= 1e-3 for t in tols)
    assert tols[0] > 1e-10 and tols[-1] < tols[0]  # tightens as θ approaches θ*
    first = sched.history[0]["param_distance"]
    assert sched.summary["extra"]["param_distance"] < first / 100
    assert sched.summary["extra"]["inner_iterations"] < fixed.summary["extra"]["inner_iterations"]
    assert all(h["inner_tol"] == 1e-10 for h in fixed.history)
