"""The attacker of a fine-tuned model: the public pretrained start as a known initialisation (checked by its
hash), the replay of a fine-tuning with batch norm in eval mode, and the single-step rung (gradient inversion)."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from datarecon.attacks.base import AttackerPrior, AttackSetup, Target
from datarecon.attacks.dynamics import DynamicsAttack, DynamicsConfig, Schedule, simulate, simulate_state
from datarecon.attacks.knowledge import (KnowledgeSettings, KnownInit, KnownRecipe, RecipeSettings, init_digest,
                                         resolve_known_init, resolve_recipe)
from datarecon.attacks.loop import ATTACK_LOOP
from datarecon.attacks.runner import run_attack
from datarecon.data import DataSpec, load_task
from datarecon.errors import DataReconError
from datarecon.kernel.step import TrainingRecipe, normalisation_stats
from datarecon.models.checkpoint import load_model_dir
from datarecon.training import build_train_config, train_target

ARCH = {"name": "resnet8", "hidden": [4, 8, 8], "bias": False, "batch_norm": True}
PUBLIC = {"dataset": "digits", "task": "all", "n_per_class": 30, "skip_per_class": 10, "n_partition_per_class": 0,
          "n_heldout_per_class": 5, "normalisation": "unit"}
PRIVATE = {"dataset": "digits", "task": "all", "n_per_class": 2, "n_heldout_per_class": 4, "normalisation": "unit"}


def _train(out: Path, data: dict, **over) -> Path:
    fields = {"data": data, "arch": ARCH, "loss": "cross-entropy", "lr": 0.01, "batch_size": 20, "epochs": 20,
              **over}
    train_target(build_train_config(fields), out=out, progress=False)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(pretrained, fine-tuned with the same classes, fine-tuned on a binary task with a new head)."""
    root = tmp_path_factory.mktemp("ft")
    pre = _train(root / "pre", PUBLIC, lr=0.05, momentum=0.9, epochs=3, batch_size=50)
    same = _train(root / "ft", PRIVATE, pretrained=str(pre), momentum=0.5, batch_size=10, epochs=3)
    binary = _train(root / "ft-binary", dict(PRIVATE, task="odd-even", n_per_class=5), loss="logistic",
                    pretrained=str(pre), epochs=2, batch_size=None, seed=7)
    return pre, same, binary


@pytest.mark.parametrize("which", [1, 2], ids=["head-kept", "head-new"])
def test_the_pretrained_start_is_a_known_initialisation_checked_by_its_hash(models, which: int) -> None:
    model_dir = models[which]
    bundle = load_model_dir(model_dir)
    known = resolve_known_init("pretrained", bundle.params, model_meta=bundle.meta)
    assert known.sha256 == bundle.meta["init_sha256"]
    assert known.source == f"pretrained:{models[0].resolve()}"


def test_a_copy_of_the_pretrained_model_works_and_other_weights_are_refused_in_one_line(models, tmp_path) -> None:
    pre, ft, binary = models
    bundle = load_model_dir(ft)
    copy_dir = tmp_path / "copy"
    shutil.copytree(pre, copy_dir)
    assert resolve_known_init(f"pretrained:{copy_dir}", bundle.params, model_meta=bundle.meta).sha256 == \
        bundle.meta["init_sha256"]
    with pytest.raises(DataReconError, match=r"^known_init pretrained:.*ft: the model in .* is not the pretrained "
                                             r"model this model was fine-tuned from \(weights sha256 [0-9a-f]{12} vs "
                                             r"recorded [0-9a-f]{12}\); pass the directory it records$"):
        resolve_known_init(f"pretrained:{ft}", bundle.params, model_meta=bundle.meta)
    pre_bundle = load_model_dir(pre)
    with pytest.raises(DataReconError, match=r"^known_init pretrained: this model was not fine-tuned from a "
                                             r"pretrained model"):
        resolve_known_init("pretrained", pre_bundle.params, model_meta=pre_bundle.meta)
    with pytest.raises(DataReconError, match=r"^known_init pretrained:nowhere: model directory nowhere not found"):
        resolve_known_init("pretrained:nowhere", bundle.params, model_meta=bundle.meta)
    from datarecon.config import build_config

    with pytest.raises(DataReconError, match="names no directory"):
        build_config(KnowledgeSettings, {"known_init": "pretrained: "})


def test_the_replay_of_a_fine_tuning_with_batch_norm_is_the_training_bit_for_bit(models) -> None:
    _, ft, _ = models
    bundle = load_model_dir(ft)
    target = Target.from_model_dir(ft, dtype=torch.float32)
    known = resolve_known_init("pretrained", target.params, model_meta=bundle.meta)
    recipe = resolve_recipe(RecipeSettings(), bundle.meta)
    assert (recipe.n, recipe.batch_size, recipe.epochs, recipe.momentum) == (20, 10, 3, 0.5)
    task = load_task(DataSpec.model_validate(bundle.data))
    x, y = task.normalisation.to_model(task.train.x), task.train.y
    schedule = Schedule.replay(TrainingRecipe(loss="cross-entropy", momentum=0.5, norm_mode="eval"), recipe.lr, n=20,
                               batch_size=10, epochs=3,
                               order_seed=recipe.order_seed, stats=normalisation_stats(target.model))
    sim = simulate(target.model, known.params, x, y, schedule, differentiable=False)
    for name, p in target.params.items():
        assert torch.equal(sim[name], p), name
    prior = AttackerPrior(labels=y, input_shape=(1, 8, 8), lower=0.0, upper=1.0, known_init=known, recipe=recipe)
    terms = DynamicsAttack(DynamicsConfig(dtype="float32")).matching_terms(target, prior, x, recipe.lr, recipe.order_seed,
                                                                      differentiable=False)
    assert float(terms["update_norm_ratio"]) == 1.0
    # the replay reads the statistics it is given: other statistics, another θ_T
    shifted = {k: v + 0.5 if k.endswith("running_mean") else v for k, v in normalisation_stats(target.model).items()}
    other = simulate(target.model, known.params, x, y, replace(schedule, stats=shifted), differentiable=False)
    assert not torch.equal(other["head.weight"], target.params["head.weight"])


@pytest.mark.parametrize("which", ["from-scratch", "fine-tuned-in-train-mode"])
def test_a_training_with_batch_norm_in_train_mode_is_replayed_bit_for_bit_with_its_statistics(models, tmp_path,
                                                                                           which) -> None:
    """Train mode: every step normalises with its batch's statistics and moves the running ones. The
    replay from the start (its parameters and statistics) with the true data gives θ* bit for bit, and
    the running statistics the model ends with up to rounding (the replay computes r ← (1 − m)r + m·s
    itself, differentiable in the batch)."""
    pre = models[0]
    if which == "from-scratch":
        model_dir, known_init = pre, "seed"
    else:
        model_dir = _train(tmp_path / "ft-train", PRIVATE, pretrained=str(pre), momentum=0.5, batch_size=10,
                           epochs=2, norm_mode="train")
        known_init = "pretrained"
    bundle = load_model_dir(model_dir)
    recipe = resolve_recipe(RecipeSettings(), bundle.meta)
    assert recipe.norm_mode == "train" and recipe.record()["norm_mode"] == "train"
    target = Target.from_model_dir(model_dir, dtype=torch.float32)
    known = resolve_known_init(known_init, target.params, model_meta=bundle.meta)
    assert known.stats and set(known.stats) == set(normalisation_stats(target.model))
    task = load_task(DataSpec.model_validate(bundle.data))
    x, y = task.normalisation.to_model(task.train.x), task.train.y
    schedule = Schedule.replay(recipe.recipe, recipe.lr, n=recipe.n, batch_size=recipe.batch_size,
                               epochs=recipe.epochs, order_seed=recipe.order_seed, stats=known.stats)
    sim, stats = simulate_state(target.model, known.params, x, y, schedule, differentiable=False)
    for name, p in target.params.items():
        assert torch.equal(sim[name], p), name
    for name, r in normalisation_stats(target.model).items():
        assert torch.allclose(stats[name], r, rtol=1e-5, atol=1e-6), name
        assert not torch.equal(known.stats[name], r), name  # the statistics moved: the check can fail
    prior = AttackerPrior(labels=y, input_shape=(1, 8, 8), lower=0.0, upper=1.0, known_init=known, recipe=recipe)
    attack = DynamicsAttack(DynamicsConfig(feature_stats_weight=1.0))
    terms = attack.matching_terms(target, prior, x, recipe.lr, recipe.order_seed, differentiable=False)
    assert float(terms["cosine"]) == pytest.approx(1.0) and float(terms["feature_stats"]) < 1e-4
    noise = attack.matching_terms(target, prior, torch.rand_like(x), recipe.lr, recipe.order_seed, differentiable=False)
    assert float(noise["feature_stats"]) > 1e-2


def test_the_replayed_statistics_gradient_matches_finite_differences_float64(models) -> None:
    """The feature-statistics term of a train-mode replay (the statistics it produces against the model's) is
    differentiable in the candidates: its gradient against central differences, float64."""
    bundle = load_model_dir(models[0])
    recipe = resolve_recipe(RecipeSettings(), bundle.meta)
    target = Target.from_model_dir(models[0], dtype=torch.float64)
    known = resolve_known_init("seed", target.params, model_meta=bundle.meta)
    short = replace(recipe, recipe=replace(recipe.recipe, epochs=1, batch_size=4), n=4)
    y = torch.tensor([0, 1, 2, 3])
    prior = AttackerPrior(labels=y, input_shape=(1, 8, 8), lower=0.0, upper=1.0, known_init=known, recipe=short)
    attack = DynamicsAttack(DynamicsConfig(dtype="float64", feature_stats_weight=1.0))
    x = torch.rand((4, 1, 8, 8), generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def value(z: torch.Tensor) -> torch.Tensor:
        return attack.matching_terms(target, prior, z, short.lr, short.order_seed)["feature_stats"]

    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(value(xg), [xg])
    for i in torch.randperm(x.numel(), generator=torch.Generator().manual_seed(1))[:12].tolist():
        e = torch.zeros(x.numel(), dtype=torch.float64)
        e[i] = 1e-6
        fd = (float(value(x + e.reshape(x.shape))) - float(value(x - e.reshape(x.shape)))) / 2e-6
        assert grad.reshape(-1)[i].item() == pytest.approx(fd, rel=1e-5, abs=1e-8)


def test_the_single_step_rung_recovers_a_planted_image_exactly_float64() -> None:
    """One gradient step on one image through a first layer with a bias: ∇W₁ = δxᵀ and ∇b₁ = δ, so a
    parameter change pointing exactly where the real one does (cosine 1) has x = x_true (Phong et al. 2017;
    the analytic case of Geiping et al. 2020). Dynamics matching from noise finds it."""
    torch.manual_seed(0)
    shape = (1, 3, 4)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3)).double().eval()
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    x_true = torch.rand(1, *shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y = torch.tensor([2])
    schedule = Schedule(TrainingRecipe(loss="cross-entropy"), 0.1, [torch.tensor([0])])
    theta = simulate(model, init, x_true, y, schedule, differentiable=False)
    target = Target(model=model, params=theta, loss="cross-entropy", weight_decay=0.0, input_shape=shape,
                    num_outputs=3)
    recipe = KnownRecipe(TrainingRecipe(loss="cross-entropy", lr=0.1, epochs=1, batch_size=1, seed=0),
                         n=1, known=("n", "lr", "momentum", "batch_size", "epochs", "order"))
    prior = AttackerPrior(labels=y, input_shape=shape, lower=0.0, upper=1.0, recipe=recipe,
                          known_init=KnownInit(params=init, sha256=init_digest(init), source="test"))
    attack = DynamicsAttack(DynamicsConfig(steps=1500, lr_x=0.01, dtype="float64"))
    x0 = torch.full((1, *shape), 0.5, dtype=torch.float64)
    rec = run_attack(attack, AttackSetup(target, prior, x0, torch.Generator().manual_seed(0)),
                     loop=dataclasses.replace(ATTACK_LOOP, progress=False))
    assert rec.summary["selection"]["cosine"]["value"] > 1 - 1e-6
    assert float((rec.x - x_true).abs().max()) < 1e-2
