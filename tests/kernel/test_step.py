"""The pure training step: `train` runs it, a replay reproduces θ* bit for bit, and it is differentiable."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from datarecon.kernel.step import TrainingRecipe, energy, train_step, update
from datarecon.training.fit import FitRecipe, fit
from datarecon.training.optim import SCHEDULES


def _net(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1)).to(dtype)


def _data(n: int = 10, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, 3, 4, generator=g, dtype=dtype)
    y = (torch.arange(n) % 2 * 2 - 1).to(dtype)
    return x, y


@pytest.mark.parametrize("schedule, momentum, weight_decay", [
    ("constant", 0.0, 0.0), ("constant", 0.9, 1e-2), ("loss-normalised", 0.0, 1e-3), ("increasing", 0.5, 0.0),
])
def test_replaying_the_pure_step_from_theta_init_reproduces_theta_star_bit_for_bit(
        schedule: str, momentum: float, weight_decay: float) -> None:
    x, y = _data()
    model = _net()
    init = copy.deepcopy(model)
    fit(model, x, y, recipe=FitRecipe(loss="logistic", weight_decay=weight_decay, lr=0.05, momentum=momentum,
                                      epochs=40, schedule=schedule, max_lr_factor=1e3))
    recipe = TrainingRecipe(loss="logistic", weight_decay=weight_decay, momentum=momentum)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in init.named_parameters()}
    buffers = {k: torch.zeros_like(v) for k, v in params.items()} if momentum else None
    lr_of = SCHEDULES.get(schedule)
    for epoch in range(40):
        with torch.no_grad():
            _, dl, _ = energy(init, params, x, y, loss="logistic", weight_decay=weight_decay)
        lr = float(lr_of(0.05, epoch, float(dl), max_lr_factor=1e3))
        new, buffers = train_step(init, params, (x, y), recipe, lr=lr, buffers=buffers)
        params = {k: v.detach().requires_grad_(True) for k, v in new.items()}
    for name, p in model.named_parameters():
        assert torch.equal(params[name], p.detach()), name


def test_update_matches_torch_sgd() -> None:
    torch.manual_seed(0)
    p = torch.randn(5, 3, dtype=torch.float64)
    ref = nn.Parameter(p.clone())
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9)
    params, buffers = {"w": p}, None
    for _ in range(4):
        g = torch.randn(5, 3, dtype=torch.float64)
        ref.grad = g.clone()
        opt.step()
        params, buffers = update(params, {"w": g}, buffers, lr=0.1, momentum=0.9)
    torch.testing.assert_close(params["w"], ref.detach(), rtol=1e-15, atol=1e-15)


def test_an_unrolled_step_is_differentiable_in_the_inputs_and_the_lr_float64() -> None:
    x, y = _data(n=4, dtype=torch.float64)
    model = _net(dtype=torch.float64)
    theta0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    target = {k: v + 0.01 * torch.randn_like(v) for k, v in theta0.items()}
    recipe = TrainingRecipe(loss="logistic", weight_decay=1e-2, momentum=0.5)

    def distance(xs: torch.Tensor, log_lr: torch.Tensor) -> torch.Tensor:
        params = {k: v.clone().requires_grad_(True) for k, v in theta0.items()}
        buffers = None
        for _ in range(3):
            params, buffers = train_step(model, params, (xs, y), recipe, lr=log_lr.exp(), buffers=buffers,
                                         create_graph=True)
        return sum(((params[k] - target[k]) ** 2).sum() for k in params)

    xs = x.clone().requires_grad_(True)
    log_lr = torch.tensor(math.log(0.1), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(distance, (xs, log_lr), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("batch_size, momentum", [(3, 0.0), (4, 0.9), (10, 0.0)])
def test_minibatch_training_is_replayed_bit_for_bit_from_the_seed(batch_size: int, momentum: float) -> None:
    from datarecon.kernel.step import batch_order

    x, y = _data(n=10)
    model = _net(seed=2)
    init = copy.deepcopy(model)
    fit(model, x, y, recipe=FitRecipe(loss="logistic", weight_decay=1e-3, lr=0.1, momentum=momentum, epochs=6,
                                      batch_size=batch_size, seed=7))
    recipe = TrainingRecipe(loss="logistic", weight_decay=1e-3, momentum=momentum)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in init.named_parameters()}
    buffers = {k: torch.zeros_like(v) for k, v in params.items()} if momentum else None
    for epoch in range(6):
        for idx in batch_order(10, batch_size, seed=7, epoch=epoch):
            new, buffers = train_step(init, params, (x[idx], y[idx]), recipe, lr=0.1, buffers=buffers)
            params = {k: v.detach().requires_grad_(True) for k, v in new.items()}
    for name, p in model.named_parameters():
        assert torch.equal(params[name], p.detach()), name


def test_the_batch_order_is_a_seeded_partition_of_the_training_set() -> None:
    from datarecon.kernel.step import batch_order

    batches = batch_order(10, 4, seed=1, epoch=0)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(torch.cat(batches).tolist()) == list(range(10))
    again = batch_order(10, 4, seed=1, epoch=0)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    assert not torch.equal(torch.cat(batches), torch.cat(batch_order(10, 4, seed=1, epoch=1)))
    assert not torch.equal(torch.cat(batches), torch.cat(batch_order(10, 4, seed=2, epoch=0)))


def test_a_batch_larger_than_the_training_set_is_refused_in_one_line() -> None:
    from datarecon.errors import DataReconError

    x, y = _data(n=10)
    with pytest.raises(DataReconError, match="batch size 11 is not between 1 and the 10 training images"):
        fit(_net(), x, y, recipe=FitRecipe(loss="logistic", epochs=1, batch_size=11))


def _bn_resnet(seed: int = 0) -> nn.Module:
    """A tiny ResNet-8 with batch norm, its running statistics moved off their defaults (as a pretraining leaves
    them), in eval mode: the fine-tuning's network."""
    from datarecon.models.spec import ArchSpec, build_model

    spec = ArchSpec(name="resnet8", input_shape=(1, 4, 4), num_outputs=2, hidden=(3, 4, 4), bias=False,
                    batch_norm=True)
    model = build_model(spec, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("batch_size, momentum", [(10, 0.0), (4, 0.9)])
def test_a_fine_tuning_with_batch_norm_in_eval_mode_is_replayed_bit_for_bit(batch_size: int, momentum: float) -> None:
    """``fit`` in eval mode (running statistics frozen, affine weights trained) and the pure step carrying the
    statistics as constants give the same θ* bit for bit, and the statistics do not move."""
    from datarecon.kernel.step import batch_order, normalisation_stats

    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(10, 1, 4, 4, generator=g), torch.arange(10) % 2
    model = _bn_resnet()
    start = copy.deepcopy(model)
    stats = normalisation_stats(start)
    fit(model, x, y, recipe=FitRecipe(loss="cross-entropy", lr=0.05, momentum=momentum, epochs=4,
                                      batch_size=batch_size, seed=2, norm_mode="eval"))
    assert all(torch.equal(stats[k], v) for k, v in normalisation_stats(model).items())  # frozen
    recipe = TrainingRecipe(loss="cross-entropy", momentum=momentum)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in start.named_parameters()}
    buffers = None
    for epoch in range(4):
        for idx in batch_order(10, batch_size, seed=2, epoch=epoch):
            new, buffers = train_step(start, params, (x[idx], y[idx]), recipe, lr=0.05, buffers=buffers or None,
                                      stats=stats)
            params = {k: v.detach().requires_grad_(True) for k, v in new.items()}
    moved = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), start.get_parameter(name))]
    assert "stem_bn.weight" in moved  # the affine weights are trained
    for name, p in model.named_parameters():
        assert torch.equal(params[name], p.detach()), name


def test_the_statistics_are_read_from_the_step_not_the_module() -> None:
    from datarecon.kernel.step import normalisation_stats

    model = _bn_resnet()
    x, y = torch.rand(4, 1, 4, 4), torch.tensor([0, 1, 0, 1])
    params = {k: v.detach() for k, v in model.named_parameters()}
    stats = normalisation_stats(model)
    _, base, _ = energy(model, params, x, y, loss="cross-entropy", stats=stats)
    shifted = {k: (v + 1.0 if k.endswith("running_mean") else v) for k, v in stats.items()}
    _, other, _ = energy(model, params, x, y, loss="cross-entropy", stats=shifted)
    assert float(base) != float(other)
    assert all(torch.equal(stats[k], v) for k, v in normalisation_stats(model).items())  # nothing written


def test_a_batch_norm_in_train_mode_is_refused_by_the_pure_step() -> None:
    from datarecon.errors import DataReconError

    model = _bn_resnet().train()
    params = {k: v.detach().requires_grad_(True) for k, v in model.named_parameters()}
    with pytest.raises(DataReconError, match=r"^batch norm layer stem_bn is in train mode: the pure training step "
                                             r"runs batch norm in eval mode \(running statistics fixed\); call "
                                             r"model.eval\(\)$"):
        train_step(model, params, (torch.rand(2, 1, 4, 4), torch.tensor([0, 1])), TrainingRecipe(loss="cross-entropy"),
                   lr=0.1)
