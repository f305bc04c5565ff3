"""The priors of attacks/priors.py against independent references: finite differences in float64,
a loop for the run axis, and planted cases."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from datarecon.attacks import priors
from datarecon.attacks.base import Target
from datarecon.errors import DataReconError
from datarecon.models.spec import ArchSpec, build_model


def _bn_target(seed: int = 0) -> Target:
    """A tiny ResNet-8 with batch norm in eval mode and non-trivial running statistics, float64."""
    spec = ArchSpec(name="resnet8", input_shape=(3, 8, 8), num_outputs=3, hidden=(2, 3, 3), bias=False,
                    batch_norm=True)
    g = torch.Generator().manual_seed(seed)
    model = build_model(spec, generator=g, dtype=torch.float64)
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g, dtype=torch.float64) * 0.3)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g, dtype=torch.float64) + 0.5)
            mod.weight.data.copy_(torch.rand(mod.num_features, generator=g, dtype=torch.float64) + 0.5)
    model.eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    return Target(model=model, params=params, loss="cross-entropy", weight_decay=0.0, input_shape=(3, 8, 8),
                  num_outputs=3)


def _central_differences(f, x: torch.Tensor, *, eps: float = 1e-6, coords: int = 40, seed: int = 0) -> tuple:
    """Central differences of f at ``coords`` random coordinates of x (float64): (indices, values)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(x.numel(), generator=g)[:coords]
    out = []
    for i in idx.tolist():
        e = torch.zeros(x.numel(), dtype=x.dtype)
        e[i] = eps
        e = e.reshape(x.shape)
        out.append((float(f(x + e)) - float(f(x - e))) / (2 * eps))
    return idx, torch.tensor(out, dtype=torch.float64)


def test_the_feature_statistics_gradient_matches_finite_differences_float64() -> None:
    target = _bn_target()
    stats = {k: v for k, v in target.model.named_buffers() if v.is_floating_point()}
    x = torch.rand((5, 3, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    value, grad = priors.feature_stats_value_and_grad(target.model, target.params, stats, x)
    assert value.item() > 0
    idx, fd = _central_differences(lambda z: priors.feature_stats_value(target.model, target.params, stats, z), x)
    assert torch.allclose(grad.reshape(-1)[idx], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("surrogate", ["relu", "sigmoid-surrogate"])
def test_gradnorm_on_batch_norm_adds_the_feature_statistics_against_finite_differences(surrogate: str) -> None:
    """Issue 49: ``--method gradnorm --feature-stats-weight 1`` on a batch-norm target ran with the loss unchanged
    (gradnorm bypassed add_priors). Now its step's loss is ‖∇_θE‖² + box + 1·R_BN, float64, defaults otherwise.

    With the exact ReLU the step's gradient in x matches central differences of that total, computed independently
    (``kkt_math.gradnorm_terms``, ``priors.feature_stats_value``). With the default sigmoid surrogate (whose
    gradient is by design not the derivative of the ReLU network's value) the prior's part, the step with the
    weight minus the step without, matches central differences of R_BN."""
    from datarecon.attacks import kkt_math
    from datarecon.attacks.base import AttackerPrior
    from datarecon.attacks.gradnorm import GradNormAttack, GradNormConfig

    target = _bn_target()
    prior = AttackerPrior(labels=torch.tensor([0, 1, 2, 0, 1]), input_shape=(3, 8, 8), lower=0.0, upper=1.0)
    x = torch.rand((5, 3, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 1.2 - 0.1
    stats = {k: v for k, v in target.model.named_buffers() if v.is_floating_point()}

    def step(weight: float) -> tuple[GradNormAttack, Any]:
        attack = GradNormAttack(GradNormConfig(dtype="float64", surrogate=surrogate, feature_stats_weight=weight))
        state = attack.init_state(target, prior, x0=x, generator=torch.Generator().manual_seed(0))
        return attack, attack.step_gradients(target, prior, state)

    attack, with_prior = step(1.0)
    _, without = step(0.0)
    r_bn = priors.feature_stats_value(target.model, target.params, stats, x)
    assert with_prior.terms["feature_stats"] == pytest.approx(float(r_bn), rel=1e-12) and float(r_bn) > 0
    assert with_prior.terms["loss"] == pytest.approx(without.terms["loss"] + float(r_bn), rel=1e-12)
    if surrogate == "relu":
        prep = attack.prepared(target)

        def total(z: torch.Tensor) -> torch.Tensor:
            terms = kkt_math.gradnorm_terms(prep.forward, prep.params, z, prior.labels, box=(0.0, 1.0),
                                            objective=kkt_math.GradNormObjective(loss="cross-entropy",
                                                                                 weight_decay=0.0, box_weight=1.0))
            return terms["loss"].detach() + priors.feature_stats_value(target.model, target.params, stats, z)

        idx, fd = _central_differences(total, x)
        assert torch.allclose(with_prior.grads["x"].reshape(-1)[idx], fd, rtol=1e-5, atol=1e-7)
    idx, fd = _central_differences(lambda z: priors.feature_stats_value(target.model, target.params, stats, z), x)
    part = (with_prior.grads["x"] - without.grads["x"]).reshape(-1)[idx]
    assert torch.allclose(part, fd, rtol=1e-5, atol=1e-8)


def test_the_feature_statistics_prior_is_zero_where_the_batch_has_the_running_statistics() -> None:
    """Planted: running statistics set to a batch's own statistics (a forward in train mode with
    momentum 1 writes them) give R_BN = 0 at that batch and > 0 at another."""
    target = _bn_target()
    x = torch.rand((6, 3, 8, 8), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    model = target.model
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.momentum = 1.0
    model.train()
    inputs = {}
    hooks = [m.register_forward_hook(lambda mod, inp, _o, n=n: inputs.__setitem__(n, inp[0].detach()))
             for n, m in priors.batch_norm_layers(model)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    model.eval()
    stats = {k: v.clone() for k, v in model.named_buffers() if v.is_floating_point()}
    for name, h in inputs.items():  # running_var is written unbiased; the prior compares the biased one
        stats[f"{name}.running_var"] = h.var(dim=(0, 2, 3), unbiased=False)
    assert priors.feature_stats_value(model, target.params, stats, x).item() == pytest.approx(0.0, abs=1e-10)
    other = torch.rand((6, 3, 8, 8), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert priors.feature_stats_value(model, target.params, stats, other).item() > 1e-3


def test_the_feature_statistics_prior_per_run_equals_a_loop_over_runs() -> None:
    target = _bn_target()
    stats = {k: v for k, v in target.model.named_buffers() if v.is_floating_point()}
    x = torch.rand((3, 4, 3, 8, 8), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    values, grads = priors.feature_stats_value_and_grad(target.model, target.params, stats, x, run_axis=True)
    for k in range(3):
        v, g = priors.feature_stats_value_and_grad(target.model, target.params, stats, x[k])
        assert torch.equal(values[k], v) and torch.equal(grads[k], g)


def test_a_target_without_batch_norm_is_refused_by_the_feature_statistics_prior_in_one_line() -> None:
    spec = ArchSpec(name="cnn", input_shape=(1, 6, 6), num_outputs=2, hidden=(2,), bias=False)
    model = build_model(spec, generator=torch.Generator().manual_seed(0))
    target = Target(model=model, params=dict(model.named_parameters()), loss="cross-entropy", weight_decay=0.0,
                    input_shape=(1, 6, 6), num_outputs=2)
    with pytest.raises(DataReconError, match="feature_stats_weight to 0"):
        priors.add_priors(_Weights(feature_stats_weight=1.0), priors.PriorInput(torch.rand(2, 1, 6, 6), 0.0, 1.0,
                                                                                target=target),
                          {"loss": torch.zeros(())}, torch.zeros(2, 1, 6, 6))


class _Weights:
    """A config stand-in with the prior weight fields (pydantic-style ``model_fields``)."""

    model_fields = {"box_weight": None, "tv_weight": None, "feature_stats_weight": None, "group_weight": None}

    def __init__(self, **weights: float) -> None:
        self.box_weight, self.tv_weight, self.feature_stats_weight, self.group_weight = 0.0, 0.0, 0.0, 0.0
        for k, v in weights.items():
            setattr(self, k, v)


def test_the_group_gradient_matches_finite_differences_float64() -> None:
    """At a fixed registration (random points are far from ties) the closed form 2(x − x̄) is the
    gradient of Σ_k ‖x^(k) − x̄‖², the mean's dependence included."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand((3, 4, 1, 3, 3), generator=g, dtype=torch.float64)
    labels = torch.tensor([[0, 0, 1, 1]] * 3)
    values, grad = priors.group_value_and_grad(x, labels)
    idx, fd = _central_differences(lambda z: priors.group_value_and_grad(z, labels)[0].sum(), x, coords=60)
    assert torch.allclose(grad.reshape(-1)[idx], fd, rtol=1e-6, atol=1e-8)
    assert values.shape == (3,) and (values > 0).all()


def test_group_consistency_registers_restarts_that_found_the_same_images_in_another_order() -> None:
    """Planted: restart 2 holds restart 1's candidates with the two of class 0 swapped: registered, they
    agree (value 0); across labels nothing is paired (the class-1 candidates stay with class 1)."""
    x1 = torch.rand((4, 1, 3, 3), generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    x2 = x1[torch.tensor([1, 0, 2, 3])]
    labels = torch.tensor([[0, 0, 1, 1]] * 2)
    values, grad = priors.group_value_and_grad(torch.stack([x1, x2]), labels)
    assert values.abs().max().item() == pytest.approx(0.0, abs=1e-12)
    assert grad.abs().max().item() == pytest.approx(0.0, abs=1e-12)
    perm = priors.register_to(x1, x1[torch.tensor([2, 1, 0, 3])], torch.tensor([0, 0, 1, 1]))
    assert sorted(perm[:2].tolist()) == [0, 1] and sorted(perm[2:].tolist()) == [2, 3]


def test_group_consistency_needs_runs_stepped_together() -> None:
    with pytest.raises(DataReconError, match="--runs K"):
        priors.add_priors(_Weights(group_weight=1.0), priors.PriorInput(torch.rand(2, 1, 3, 3), 0.0, 1.0),
                          {"loss": torch.zeros(())}, torch.zeros(2, 1, 3, 3))


def test_add_priors_adds_each_weighted_prior_to_loss_and_gradient() -> None:
    target = _bn_target()
    x = torch.rand((4, 3, 8, 8), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    stats = {k: v for k, v in target.model.named_buffers() if v.is_floating_point()}
    terms, grad = priors.add_priors(_Weights(feature_stats_weight=0.5), priors.PriorInput(x, 0.0, 1.0, target=target),
                                    {"loss": torch.tensor(1.0, dtype=torch.float64)}, torch.zeros_like(x))
    value, g = priors.feature_stats_value_and_grad(target.model, target.params, stats, x)
    assert terms["feature_stats"].item() == pytest.approx(value.item())
    assert terms["loss"].item() == pytest.approx(1.0 + 0.5 * value.item())
    assert torch.allclose(grad, 0.5 * g)
    assert priors.weighted_priors(_Weights(feature_stats_weight=0.5, group_weight=1.0)) == ("feature_stats", "group")


def test_the_tv_prior_is_per_pixel_and_its_gradient_matches_finite_differences_float64() -> None:
    """One meaning of ``tv_weight``: the total variation per element of the candidates (m·C·H·W), per
    run on a run axis; the gradient at the default ε against central differences."""
    x = torch.rand((3, 2, 5, 5), generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    total, _ = priors.tv_value_and_grad(x)
    value, grad = priors.tv_mean_value_and_grad(x)
    assert torch.allclose(value, total / x.numel())
    idx, fd = _central_differences(lambda z: priors.tv_mean_value_and_grad(z)[0], x, coords=60)
    assert torch.allclose(grad.reshape(-1)[idx], fd, rtol=1e-5, atol=1e-9)
    stacked = torch.stack([x, x.flip(0)])
    terms, g = priors.add_priors(_Weights(tv_weight=2.0), priors.PriorInput(stacked, 0.0, 1.0, run_axis=True),
                                 {"loss": torch.zeros(2, dtype=x.dtype)}, torch.zeros_like(stacked))
    assert torch.allclose(terms["tv"], torch.stack([value, value])) and torch.allclose(g[0], 2.0 * grad)


def test_dynamics_matching_and_the_kkt_family_weigh_tv_alike() -> None:
    """The same ``tv_weight`` on the same candidates adds the same TV term to the dynamics attack's
    loss as the prior registry adds to any other attack's (it was a sum over pixels for the KKT family)."""
    import copy

    from datarecon.attacks.dynamics import DynamicsAttack, DynamicsConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4), nn.ReLU(), nn.Linear(4, 1)).double()
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    from datarecon.attacks.base import AttackerPrior
    from datarecon.attacks.knowledge import KnownInit, KnownRecipe, init_digest
    from datarecon.kernel.step import TrainingRecipe

    target = Target(model=copy.deepcopy(model), params={k: v.detach().clone() for k, v in model.named_parameters()},
                    loss="logistic", weight_decay=0.0, input_shape=(1, 3, 4), num_outputs=1, homogeneous=False)
    recipe = KnownRecipe(TrainingRecipe(loss="logistic", weight_decay=0.0, lr=0.1, momentum=0.0, epochs=1,
                                        batch_size=4, seed=0), n=4, known=("lr", "momentum", "batch_size", "epochs",
                                                                             "order"))
    prior = AttackerPrior(labels=torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64), input_shape=(1, 3, 4),
                          lower=0.0, upper=1.0, recipe=recipe,
                          known_init=KnownInit(params=init, sha256=init_digest(init), source="test"))
    x = torch.rand((4, 1, 3, 4), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    attack = DynamicsAttack(DynamicsConfig(steps=1, tv_weight=0.5, box_weight=0.0, dtype="float64"))
    state = attack.init_state(target, prior, x0=x, generator=torch.Generator().manual_seed(0))
    metrics = attack.step_gradients(target, prior, state).terms
    value, _ = priors.tv_mean_value_and_grad(x)
    assert metrics["tv"] == pytest.approx(float(value), rel=1e-12)
    terms, _ = priors.add_priors(_Weights(tv_weight=0.5), priors.PriorInput(x, 0.0, 1.0),
                                 {"loss": torch.zeros((), dtype=x.dtype)}, torch.zeros_like(x))
    assert float(terms["tv"]) == pytest.approx(metrics["tv"], rel=1e-12)


def test_a_kkt_config_records_the_meaning_of_its_tv_weight() -> None:
    """A run with TV records ``tv_reduction: mean`` (so one of the sum's weight is not resumed under it);
    without TV the dump, and so every recorded hash, is unchanged; a recorded ``sum`` is refused."""
    from pydantic import ValidationError

    from datarecon.attacks.kkt import KKTConfig

    assert "tv_reduction" not in KKTConfig().model_dump(mode="json")
    dumped = KKTConfig(tv_weight=1e-3).model_dump(mode="json")
    assert dumped["tv_reduction"] == "mean" and KKTConfig.model_validate(dumped) == KKTConfig(tv_weight=1e-3)
    with pytest.raises(ValidationError, match="per pixel"):
        KKTConfig.model_validate({**dumped, "tv_reduction": "sum"})
