"""The surrogate ReLU: exact forward, sigmoid(αz) derivative, differentiable derivative."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from datarecon.attacks.surrogate import SURROGATES, SurrogateReLU, count_relus, surrogate_relu, with_surrogate
from datarecon.errors import DataReconError


@pytest.mark.parametrize("alpha", [1.0, 20.0, 150.0], ids=lambda a: f"alpha{a:g}")
def test_forward_is_relu_and_derivative_is_sigmoid(alpha):
    z = torch.linspace(-2, 2, 41, dtype=torch.float64, requires_grad=True)
    y = surrogate_relu(z, alpha)
    torch.testing.assert_close(y, torch.relu(z))
    (d,) = torch.autograd.grad(y.sum(), z, create_graph=True)
    torch.testing.assert_close(d, torch.sigmoid(alpha * z))
    (d2,) = torch.autograd.grad(d.sum(), z)  # second derivative exists and is α σ (1 − σ)
    s = torch.sigmoid(alpha * z.detach())
    torch.testing.assert_close(d2, alpha * s * (1 - s))


def test_second_derivative_through_vjp_is_nonzero():
    """∇_x of ‖∇_θ Φ‖² is non-zero through the surrogate (plain ReLU gives no curvature term)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(), nn.Linear(4, 1, bias=False)).double()
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    sur = with_surrogate(base, 5.0)
    gw = torch.autograd.grad(sur(x).sum(), sur[0].weight, create_graph=True)[0]
    (gx,) = torch.autograd.grad((gw ** 2).sum(), x)
    assert torch.isfinite(gx).all() and gx.abs().sum() > 0


def test_with_surrogate_replaces_nested_relus_and_keeps_original():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.inner(x))

    model = nn.Sequential(Block(), nn.Linear(2, 1))
    sur = with_surrogate(model, 7.0)
    assert count_relus(model) == 2 and count_relus(sur) == 0
    assert sum(isinstance(m, SurrogateReLU) for m in sur.modules()) == 2
    x = torch.randn(3, 2)
    torch.testing.assert_close(sur(x), model(x))


def test_registry():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert SURROGATES.get("relu")(model, 1.0) is model
    assert count_relus(SURROGATES.get("sigmoid-surrogate")(model, 1.0)) == 0
    with pytest.raises(DataReconError, match="valid names: relu, sigmoid-surrogate"):
        SURROGATES.get("tanh")
