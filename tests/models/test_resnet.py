"""The ResNets (``resnet8``, ``resnet18``): sizes against torchvision's CIFAR ResNet-18, the shapes computed
without building, homogeneity, and the training replayed by the dynamics attack bit for bit."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.dynamics import DynamicsAttack, DynamicsConfig, Schedule, simulate
from datarecon.attacks.knowledge import KnownInit, KnownRecipe, init_digest
from datarecon.errors import DataReconError
from datarecon.kernel.step import TrainingRecipe
from datarecon.models.byom import measure_homogeneity
from datarecon.models.spec import (ARCHITECTURES, ArchSpec, build_model, count_parameters, first_layer_init_std,
                                   is_homogeneous, parameter_shapes)
from datarecon.training.fit import FitRecipe, fit

CIFAR = (3, 32, 32)


def test_resnet18_has_torchvisions_cifar_resnet18_size_less_its_batch_norms() -> None:
    # torchvision-style CIFAR ResNet-18 (3x3 stem, no max-pool), 10 classes: 11 173 962 parameters, of which
    # 9 600 are batch-norm weights and biases (2 x 4 800 channels) and 10 the read-out's bias
    spec = ArchSpec(name="resnet18", input_shape=CIFAR, num_outputs=10, bias=False)
    assert count_parameters(spec) == 11_173_962 - 9_600 - 10


@pytest.mark.parametrize("name, hidden, convs", [("resnet8", None, 7), ("resnet18", (2, 3, 4, 5), 17)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_shapes_without_building_match_the_built_model(name: str, hidden, convs: int, bias: bool) -> None:
    spec = ArchSpec(name=name, input_shape=(3, 9, 7), num_outputs=4, hidden=hidden, bias=bias)
    model = build_model(spec, generator=torch.Generator().manual_seed(0))
    assert parameter_shapes(spec) == {k: tuple(v.shape) for k, v in model.named_parameters()}
    assert sum(p.numel() for p in model.parameters()) == count_parameters(spec)
    weighted = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(weighted) == convs  # the stem and two per block: ResNet-8 and ResNet-18 less the read-out
    assert model(torch.zeros(2, 3, 9, 7)).shape == (2, 4)
    assert not list(model.buffers())  # no batch norm: parameters only


def test_the_same_seed_gives_the_same_resnet_and_convolutions_start_he_normal() -> None:
    spec = ArchSpec(name="resnet8", input_shape=CIFAR, num_outputs=10, bias=False)
    a, b = (build_model(spec, generator=torch.Generator().manual_seed(3)) for _ in range(2))
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    w = a.stages[2][0].conv2.weight  # 64 x 64 x 3 x 3: std sqrt(2 / fan_out) = sqrt(2 / 576)
    assert float(w.std()) == pytest.approx(math.sqrt(2 / 576), rel=0.05)
    assert first_layer_init_std(spec) == pytest.approx(1 / math.sqrt(3 * 64))  # the read-out after the pool


def test_resnets_are_not_homogeneous_and_the_measurement_agrees() -> None:
    spec = ArchSpec(name="resnet8", input_shape=(3, 8, 8), num_outputs=2, hidden=(2, 3, 4), bias=False)
    assert not is_homogeneous(spec)
    model = build_model(spec, generator=torch.Generator().manual_seed(0))
    measured = measure_homogeneity(model, dict(model.named_parameters()), spec.input_shape)
    assert not measured.homogeneous and measured.rel_error > 1e-3


def test_every_relu_is_a_module_so_the_kkt_surrogate_can_replace_it() -> None:
    model = build_model(ArchSpec(name="resnet8", input_shape=(3, 8, 8), hidden=(2, 3, 4)))
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert len(relus) == 1 + 2 * 3  # the stem's, and two per block


def test_bad_resnet_specs_are_refused_in_one_line() -> None:
    with pytest.raises(DataReconError, match="needs image inputs"):
        build_model(ArchSpec(name="resnet8", input_shape=(64,)))
    with pytest.raises(DataReconError, match="drop kernel"):
        build_model(ArchSpec(name="resnet18", input_shape=CIFAR, kernel=5))
    assert ARCHITECTURES.get("resnet18").blocks == 2


def _tiny_resnet_target(dtype: torch.dtype, *, batch_size: int, momentum: float, epochs: int):
    n, shape = 6, (2, 6, 6)
    spec = ArchSpec(name="resnet8", input_shape=shape, num_outputs=3, hidden=(2, 3, 3), bias=True)
    model = build_model(spec, generator=torch.Generator().manual_seed(0), dtype=dtype)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(n, *shape, generator=g, dtype=dtype), torch.arange(n) % 3
    fit(model, x, y, recipe=FitRecipe(loss="cross-entropy", weight_decay=0.0, lr=0.1, momentum=momentum, epochs=epochs,
                                      batch_size=batch_size, seed=7))
    target = Target(model=copy.deepcopy(model), params={k: v.detach().clone() for k, v in model.named_parameters()},
                    loss="cross-entropy", weight_decay=0.0, input_shape=shape, num_outputs=3, homogeneous=False)
    recipe = KnownRecipe(TrainingRecipe(loss="cross-entropy", lr=0.1, momentum=momentum, epochs=epochs,
                                        batch_size=batch_size, seed=7),
                         n=n, known=("lr", "momentum", "batch_size", "epochs", "order"))
    prior = AttackerPrior(labels=y.clone(), input_shape=shape, lower=0.0, upper=1.0,
                          known_init=KnownInit(params=init, sha256=init_digest(init), source="test"), recipe=recipe)
    return target, prior, x, y, init


@pytest.mark.parametrize("batch_size, momentum", [(6, 0.0), (4, 0.9)])
def test_the_simulated_training_of_a_resnet_is_its_training_bit_for_bit(batch_size: int, momentum: float) -> None:
    target, _, x, y, init = _tiny_resnet_target(torch.float32, batch_size=batch_size, momentum=momentum, epochs=3)
    schedule = Schedule.replay(TrainingRecipe(loss="cross-entropy", momentum=momentum), 0.1, n=6, batch_size=batch_size,
                               epochs=3, order_seed=7)
    sim = simulate(target.model, init, x, y, schedule, differentiable=False)
    for name, p in target.params.items():
        assert torch.equal(sim[name], p), name


def test_the_dynamics_gradient_through_a_resnet_matches_finite_differences_and_recomputation_float64() -> None:
    target, prior, x, _, _ = _tiny_resnet_target(torch.float64, batch_size=4, momentum=0.5, epochs=2)
    xs = x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    attack = DynamicsAttack(DynamicsConfig(dtype="float64", segment=0))
    assert torch.autograd.gradcheck(lambda v: attack.matching_terms(target, prior, v, 0.1, 7)["loss"],
                                    (xs.clone().requires_grad_(True),), eps=1e-6, atol=1e-7, rtol=1e-5)
    grads = []
    for seg in (0, 1):
        v = xs.clone().requires_grad_(True)
        loss = DynamicsAttack(DynamicsConfig(dtype="float64", segment=seg)).matching_terms(target, prior, v, 0.1, 7)["loss"]
        grads.append(torch.autograd.grad(loss, v)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)
