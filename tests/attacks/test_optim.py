"""Pure optimisers match torch.optim step for step and keep all state in the dict."""

from __future__ import annotations

import pytest
import torch

from datarecon.attacks.optim import OptimizerSettings, init_optimizer_state, optimizer_step


@pytest.mark.parametrize("name", ["sgd", "sgd-nesterov", "adam"])
def test_matches_torch_optim(name):
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(5, generator=g, dtype=torch.float64)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(6)]
    ref = p0.clone().requires_grad_(True)
    if name == "adam":
        opt = torch.optim.Adam([ref], lr=0.1)
        settings, opt_name = OptimizerSettings(), "adam"
    else:
        nest = name == "sgd-nesterov"
        opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9, nesterov=nest)
        settings, opt_name = OptimizerSettings(momentum=0.9, nesterov=nest), "sgd"
    state = {"x": p0.clone()}
    state.update(init_optimizer_state(opt_name, state))
    for gr in grads:
        ref.grad = gr.clone()
        opt.step()
        state.update(optimizer_step(opt_name, state, {"x": gr}, lrs={"x": 0.1}, settings=settings))
    torch.testing.assert_close(state["x"], ref.detach(), rtol=1e-14, atol=1e-15)
    assert int(state["opt.step"]) == 6


def test_separate_learning_rates_and_no_mutation():
    state = {"x": torch.ones(2), "lambda": torch.ones(3)}
    state.update(init_optimizer_state("sgd", state))
    before = {k: v.clone() for k, v in state.items()}
    new = optimizer_step("sgd", state, {"x": torch.ones(2), "lambda": torch.ones(3)}, lrs={"x": 0.5, "lambda": 0.0},
                         settings=OptimizerSettings(momentum=0.0))
    for k in before:
        assert torch.equal(before[k], state[k])  # nothing committed
    torch.testing.assert_close(new["x"], torch.full((2,), 0.5))
    torch.testing.assert_close(new["lambda"], torch.ones(3))
