"""Dynamics matching: the simulation is the training, its gradient is right, recomputation changes
nothing, resume is bit-identical, and what cannot be replayed is refused before any work."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from datarecon.attacks.base import AttackerPrior, AttackSetup, Target
from datarecon.attacks.dynamics import DynamicsAttack, DynamicsConfig, Schedule, memory_estimate, simulate
from datarecon.attacks.knowledge import KnownInit, KnownRecipe, RecipeSettings, init_digest, resolve_recipe
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import run_attack
from datarecon.errors import DataReconError
from datarecon.kernel.step import TrainingRecipe
from datarecon.training.fit import FitRecipe, fit

N, SHAPE = 6, (1, 3, 4)


def _net(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 1)).to(dtype)


def _data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(N, *SHAPE, generator=g, dtype=dtype), (torch.arange(N) % 2 * 2 - 1).to(dtype)


def _trained(dtype: torch.dtype = torch.float32, *, batch_size: int = 4, momentum: float = 0.0, epochs: int = 5):
    model = _net(dtype)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = _data(dtype)
    fit(model, x, y, recipe=FitRecipe(loss="logistic", weight_decay=1e-3, lr=0.2, momentum=momentum, epochs=epochs,
                                      batch_size=batch_size, seed=5))
    target = Target(model=copy.deepcopy(model), params={k: v.detach().clone() for k, v in model.named_parameters()},
                    loss="logistic", weight_decay=1e-3, input_shape=SHAPE, num_outputs=1, homogeneous=False)
    recipe = KnownRecipe(TrainingRecipe(loss="logistic", weight_decay=1e-3, lr=0.2, momentum=momentum, epochs=epochs,
                                        batch_size=batch_size, seed=5),
                         n=N, known=("lr", "momentum", "batch_size", "epochs", "order"))
    prior = AttackerPrior(labels=y.clone(), input_shape=SHAPE, lower=0.0, upper=1.0,
                          known_init=KnownInit(params=init, sha256=init_digest(init), source="test"), recipe=recipe)
    return target, prior, x, y, init


@pytest.mark.parametrize("batch_size, momentum", [(4, 0.0), (6, 0.0), (2, 0.9)])
def test_the_simulation_with_the_true_data_is_the_training_bit_for_bit(batch_size: int, momentum: float) -> None:
    target, prior, x, y, init = _trained(batch_size=batch_size, momentum=momentum)
    schedule = Schedule.replay(TrainingRecipe(loss="logistic", weight_decay=1e-3, momentum=momentum), 0.2, n=N,
                               batch_size=batch_size, epochs=5, order_seed=5)
    sim = simulate(target.model, init, x, y, schedule, differentiable=False)
    for name, p in target.params.items():
        assert torch.equal(sim[name], p), name
    attack = DynamicsAttack(DynamicsConfig(dtype="float32"))
    terms = attack.matching_terms(target, prior, x, 0.2, 5, differentiable=False)
    assert float(terms["cosine"]) == pytest.approx(1.0, abs=1e-6)  # the same θ_T: cosine 1 up to float32 rounding
    assert float(terms["update_norm_ratio"]) == 1.0


@pytest.mark.parametrize("objective", ["cosine", "distance"])
def test_the_gradient_through_a_short_unroll_matches_finite_differences_float64(objective: str) -> None:
    target, prior, x, y, init = _trained(torch.float64, batch_size=4, momentum=0.5, epochs=2)
    attack = DynamicsAttack(DynamicsConfig(dtype="float64", segment=1, objective=objective))  # recomputed, step by step

    def loss(xs: torch.Tensor, log_lr: torch.Tensor) -> torch.Tensor:
        return attack.matching_terms(target, prior, xs, log_lr.exp(), 5)["loss"]

    xs = (x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    log_lr = torch.tensor(math.log(0.15), dtype=torch.float64)
    assert torch.autograd.gradcheck(loss, (xs.requires_grad_(True), log_lr.requires_grad_(True)),
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("segment", [1, 3])
def test_recomputed_and_kept_unrolls_give_the_same_gradient(segment: int) -> None:
    target, prior, x, y, init = _trained(torch.float64, batch_size=4, momentum=0.9, epochs=3)
    xs = x + 0.1
    grads = []
    for seg in (0, segment):
        attack = DynamicsAttack(DynamicsConfig(dtype="float64", segment=seg))
        xv = xs.clone().requires_grad_(True)
        lr = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        (gx, gl) = torch.autograd.grad(attack.matching_terms(target, prior, xv, lr, 5)["loss"], [xv, lr])
        grads.append((gx, gl))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("unknown", [(), ("lr", "order")])
def test_a_resumed_attack_is_bit_identical(tmp_path, unknown: tuple[str, ...]) -> None:
    import dataclasses

    target, prior, x, y, init = _trained()
    if unknown:
        hidden = dataclasses.replace(prior.recipe.recipe, lr=None, seed=None)
        prior = dataclasses.replace(prior, recipe=dataclasses.replace(prior.recipe, recipe=hidden,
                                                                      known=("momentum", "batch_size", "epochs")))
    x0 = torch.rand(x.shape, generator=torch.Generator().manual_seed(9))
    attack = DynamicsAttack(DynamicsConfig(steps=6, lr_x=0.05))
    whole = run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(3)), out=tmp_path / "a",
                       loop=replace(ATTACK_LOOP, progress=False, checkpoint_every=2))
    run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(3)), steps=3, out=tmp_path / "b",
               loop=replace(ATTACK_LOOP, progress=False, checkpoint_every=2))
    resumed = run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(3)), steps=6,
                         out=tmp_path / "b", loop=replace(ATTACK_LOOP, progress=False, checkpoint_every=2, resume=True))
    assert torch.equal(whole.x, resumed.x) and whole.steps_done == resumed.steps_done == 6
    assert whole.history[-1]["cosine"] == resumed.history[-1]["cosine"]
    if unknown:
        assert whole.history[-1]["lr"] != 0.01  # learned from lr_init


def test_the_attack_descends_on_its_objective() -> None:
    target, prior, x, y, init = _trained()
    x0 = torch.rand(x.shape, generator=torch.Generator().manual_seed(9))
    rec = run_attack(DynamicsAttack(DynamicsConfig(steps=30, lr_x=0.05, box_weight=0.0)),
                     AttackSetup(target, prior, x0, torch.Generator().manual_seed(3)),
                     loop=replace(ATTACK_LOOP, log_every=1, progress=False))
    assert rec.history[-1]["cosine"] > rec.history[0]["cosine"] + 0.05


def test_what_cannot_be_replayed_is_refused_in_one_line(monkeypatch) -> None:
    target, prior, x, y, init = _trained()
    import dataclasses

    attack = DynamicsAttack()
    wrong_m = dataclasses.replace(prior, labels=prior.labels[:4])
    with pytest.raises(DataReconError, match="pass --candidates 6"):
        attack.check(target, wrong_m)
    import datarecon.utils.memory as memory

    monkeypatch.setattr(memory, "physical_memory_bytes", lambda: 1024)
    with pytest.raises(DataReconError, match="not enough memory.*simulated steps"):
        attack.check(target, prior)
    with pytest.raises(DataReconError, match=r"trained 5 epochs; simulate at most that many \(--set epochs=5"):
        DynamicsAttack(DynamicsConfig(epochs=6)).check(target, prior)
    meta = {"training": {"optimizer": "lbfgs", "schedule": "constant", "lr": 1.0}, "metrics": {"n_train": 6}}
    with pytest.raises(DataReconError, match="cannot be replayed"):
        resolve_recipe(RecipeSettings(), meta)
    meta = {"training": {"optimizer": "gd", "schedule": "loss-normalised", "lr": 1.0}, "metrics": {"n_train": 6}}
    with pytest.raises(DataReconError, match="cannot be replayed"):
        resolve_recipe(RecipeSettings(), meta)
    with pytest.raises(DataReconError, match="model directory"):
        resolve_recipe(RecipeSettings(), None)


def test_the_memory_estimate_grows_with_the_unroll_and_recomputation_bounds_it() -> None:
    target, prior, *_ = _trained()
    kept = [memory_estimate(target, m=N, batch_size=4, steps=t, segment=0, dtype=torch.float32) for t in (10, 100)]
    recomputed = memory_estimate(target, m=N, batch_size=4, steps=100, segment=10, dtype=torch.float32)
    assert kept[1] > 5 * kept[0] and recomputed < kept[1] / 2


def test_the_recorded_recipe_hides_what_the_attacker_does_not_know() -> None:
    meta = {"training": {"optimizer": "gd", "schedule": "constant", "lr": 0.05, "momentum": 0.0, "batch_size": 10,
                         "epochs": 20}, "metrics": {"n_train": 20, "epochs_done": 20}, "seed": 4}
    full = resolve_recipe(RecipeSettings(), meta)
    assert (full.n, full.batch_size, full.epochs, full.lr, full.order_seed, full.steps) == (20, 10, 20, 0.05, 4, 40)
    hidden = resolve_recipe(RecipeSettings(unknown=("lr", "order")), meta)
    assert hidden.lr is None and hidden.order_seed is None and "lr" not in hidden.known


def test_the_segment_is_chosen_from_the_memory_when_unset(monkeypatch) -> None:
    import datarecon.attacks.dynamics as dynamics

    target, prior, *_ = _trained(epochs=9)  # 9 epochs of 2 batches: T = 18
    attack = DynamicsAttack()
    assert attack.segment(target, prior) == 0  # the whole unroll fits
    monkeypatch.setattr(dynamics, "device_memory_bytes", lambda _device: 2048)
    assert DynamicsAttack().segment(target, prior) == 5  # ⌈√18⌉ (an attack decides once per problem)
    assert attack.segment(target, prior) == 0  # ... and keeps its choice
    assert DynamicsAttack(DynamicsConfig(segment=2)).segment(target, prior) == 2


def test_the_memory_of_a_cuda_target_is_the_gpus(monkeypatch) -> None:
    import types

    import datarecon.utils.memory as memory

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: types.SimpleNamespace(total_memory=12345))
    monkeypatch.setattr(memory, "physical_memory_bytes", lambda: 999)
    assert memory.device_memory_bytes("cuda:0") == 12345
    assert memory.device_memory_bytes("cpu") == memory.device_memory_bytes(None) == 999


def test_the_distance_objective_is_the_relative_squared_distance_to_theta_star() -> None:
    target, prior, x, y, init = _trained(torch.float64)
    xs = x + 0.1
    terms = DynamicsAttack(DynamicsConfig(dtype="float64", objective="distance")).matching_terms(
        target, prior, xs, 0.2, 5, differentiable=False)
    schedule = Schedule.replay(TrainingRecipe(loss="logistic", weight_decay=1e-3), 0.2, n=N, batch_size=4, epochs=5,
                               order_seed=5)
    sim = simulate(target.model, {k: v.double() for k, v in init.items()}, xs, y, schedule, differentiable=False)
    num = sum(float(((sim[k] - target.params[k].double()) ** 2).sum()) for k in sim)
    den = sum(float(((target.params[k].double() - init[k].double()) ** 2).sum()) for k in sim)
    assert float(terms["loss"]) == pytest.approx(num / den, rel=1e-10)
    ratio, cosine = float(terms["update_norm_ratio"]), float(terms["cosine"])
    assert float(terms["relative_distance"]) == pytest.approx(ratio ** 2 - 2 * ratio * cosine + 1, rel=1e-9)
    assert "objective" not in DynamicsConfig().model_dump() and "lr_schedule" not in DynamicsConfig().model_dump()


def test_the_step_schedule_divides_the_step_by_ten_at_three_five_and_seven_eighths() -> None:
    config = DynamicsConfig(steps=800, lr_x=0.1, lr_schedule="step")
    got = [config.lr_x_at(i) for i in (0, 299, 300, 499, 500, 699, 700, 799)]
    assert got == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 1e-4, 1e-4])
    assert DynamicsConfig(steps=800, lr_x=0.1).lr_x_at(799) == 0.1
