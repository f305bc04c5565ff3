"""Small targets shared by the attack tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from datarecon.attacks.base import AttackerPrior, Target

SHAPE = (1, 4, 4)


def small_target(*, k: int = 1, bias: bool = False, loss: str = "logistic", hidden: int = 20, seed: int = 0,
                 weight_decay: float = 0.0) -> Target:
    """A random D-hidden-k ReLU MLP on 1x4x4 inputs, float64."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, hidden, bias=bias), nn.ReLU(),
                          nn.Linear(hidden, k, bias=bias)).double()
    params = {n: p.detach() for n, p in model.named_parameters()}
    return Target(model=model, params=params, loss=loss, weight_decay=weight_decay, input_shape=SHAPE,
                  num_outputs=k, homogeneous=not bias)


@pytest.fixture
def target() -> Target:
    return small_target()


@pytest.fixture
def prior() -> AttackerPrior:
    return AttackerPrior.balanced(m=6, num_outputs=1, input_shape=SHAPE, lower=-1.0, upper=1.0)


@pytest.fixture
def make_target():
    """Factory of small random targets (see :func:`small_target`)."""
    return small_target


def train_digits_target(*, n_per_class: int = 10, hidden: int = 100, epochs: int = 3000, seed: int = 0):
    """A bias-free 64-hidden-1 ReLU MLP trained to zero error on digits odd/even (logistic, full batch).

    Returns (target, task): the attacker's view and the data (for evaluation only).
    """
    from datarecon.data import DataSpec, load_task
    from datarecon.models.spec import ArchSpec, build_model
    from datarecon.training import fit
    from datarecon.training.fit import FitRecipe

    spec = DataSpec(dataset="digits", task="odd-even", n_per_class=n_per_class,
                    n_partition_per_class=n_per_class, n_heldout_per_class=0)
    task = load_task(spec)
    x = task.normalisation.to_model(task.train.x).double()
    y = task.train.y.double()
    arch = ArchSpec(name="mlp", input_shape=(1, 8, 8), hidden=(hidden,), bias=False, init_scale=1e-3)
    model = build_model(arch, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    res = fit(model, x, y, recipe=FitRecipe(loss="logistic", lr=0.5, epochs=epochs, schedule="loss-normalised",
                                           max_lr_factor=1e4))
    assert res.metrics["train_acc"] == 1.0
    params = {k: v.detach() for k, v in model.named_parameters()}
    target = Target(model=model, params=params, loss="logistic", weight_decay=0.0, input_shape=(1, 8, 8),
                    num_outputs=1, homogeneous=True)
    return target, task, arch, spec


@pytest.fixture(scope="session")
def digits_trained():
    """(target, task, arch, spec) of :func:`train_digits_target`, trained once per session."""
    torch.manual_seed(0)
    return train_digits_target()


@pytest.fixture
def kkt_gradcheck():
    """``kkt_gradcheck(model, params, input_shape=..., margin=..., k=...)``: float64 central differences of
    the KKT / DecoReco objective L(x, λ) (``kkt_math.kkt_terms``, box prior included) at 4 random
    candidates through ``model`` called with ``params``; returns the (x, y, λ) it checked at."""
    from torch.func import functional_call

    from datarecon.attacks import kkt_math

    def check(model, params, *, input_shape, margin: str, k: int):
        g = torch.Generator().manual_seed(2)
        m = 4
        x = torch.randn(m, *input_shape, generator=g, dtype=torch.float64, requires_grad=True)
        y = (torch.randint(0, k, (m,), generator=g) if margin == "multiclass"
             else torch.tensor([1.0, -1, 1, -1]).double())
        lam = (torch.rand(m, generator=g, dtype=torch.float64) + 0.2).requires_grad_(True)

        def f(x_, lam_):
            return kkt_math.kkt_terms(lambda xx, p: functional_call(model, p, (xx,)), params, x_, y, lam_,
                                      objective=kkt_math.KKTObjective(margin=margin, lambda_min=0.5,
                                                                      lambda_min_weight=5.0, box_weight=1.0),
                                      box=(-0.5, 0.5))["loss"]

        assert torch.autograd.gradcheck(f, (x, lam), eps=1e-6, atol=1e-5, rtol=1e-4)
        return x, y, lam

    return check
