"""Tiny float64 bilevel problems shared by the bilevel tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from datarecon.attacks.bilevel.lbfgs import lbfgs_minimize
from datarecon.attacks.bilevel.problem import FlatLayout, make_energy, value_and_grad

DT = torch.float64


@dataclass
class Problem:
    """A tiny bilevel problem: model, energy, candidates x, labels, θ*."""

    model: nn.Module
    layout: FlatLayout
    energy: object
    x: torch.Tensor
    labels: torch.Tensor
    theta_star: torch.Tensor
    loss: str
    wd: float

    def solve(self, x: torch.Tensor, theta0: torch.Tensor, *, tol: float = 1e-12, max_iter: int = 2000):
        return lbfgs_minimize(value_and_grad(self.energy, x), theta0, tol=tol, max_iter=max_iter, history=20)

    def outer(self, x: torch.Tensor, theta0: torch.Tensor) -> float:
        """l(θ*, θ(x)) = ‖θ* − θ(x)‖² with θ(x) solved tightly from theta0."""
        th = self.solve(x, theta0).theta
        return float(((th - self.theta_star) ** 2).sum())


def build_problem(kind: str, *, seed: int = 0, m: int = 6, wd: float = 0.1, loss: str = "logistic",
                  shape: tuple[int, ...] = (1, 2, 3)) -> Problem:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d = 1
    for k in shape:
        d *= k
    if kind == "affine":
        model = nn.Sequential(nn.Flatten(), nn.Linear(d, 1, dtype=DT))
    elif kind == "tanh-mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(d, 5, dtype=DT), nn.Tanh(), nn.Linear(5, 1, dtype=DT))
    elif kind == "relu-mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(d, 5, dtype=DT), nn.ReLU(), nn.Linear(5, 1, dtype=DT))
    else:
        raise ValueError(kind)
    params = {k: v.detach() for k, v in model.named_parameters()}
    layout = FlatLayout(params)
    x = torch.randn(m, *shape, generator=g, dtype=DT)
    labels = torch.cat([torch.ones(m // 2), -torch.ones(m - m // 2)]).to(DT)
    energy = make_energy(model, layout, labels, loss=loss, weight_decay=wd)
    theta_star = 0.5 * torch.randn(layout.size, generator=g, dtype=DT)
    return Problem(model, layout, energy, x, labels, theta_star, loss, wd)


def fd_gradient(f, x: torch.Tensor, h: float) -> torch.Tensor:
    """Central finite differences of scalar f at x, coordinate by coordinate."""
    out = torch.zeros_like(x)
    flat = out.view(-1)
    for i in range(x.numel()):
        e = torch.zeros(x.numel(), dtype=x.dtype)
        e[i] = h
        e = e.view_as(x)
        flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out


@pytest.fixture(scope="session")
def problem_factory():
    return build_problem


@pytest.fixture(scope="session")
def fd():
    return fd_gradient
